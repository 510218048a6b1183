#include "libs/format/torch_writer.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/io/atomic_file.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {
namespace {

// Protocol-2 pickle opcodes: the set Python's own pickler emits at protocol 2, which both
// torch.load and the weights-only unpickler understand.
namespace op {
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kEmptyTuple = ')';
constexpr char kTuple = 't';
constexpr char kTuple1 = '\x85';
constexpr char kTuple2 = '\x86';
constexpr char kTuple3 = '\x87';
constexpr char kAppends = 'e';
constexpr char kSetItems = 'u';
constexpr char kGlobal = 'c';
constexpr char kReduce = 'R';
constexpr char kBinPersId = 'Q';
constexpr char kBinInt = 'J';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt2 = 'M';
constexpr char kLong1 = '\x8a';
constexpr char kBinUnicode = 'X';
constexpr char kBinFloat = 'G';
constexpr char kShortBinBytes = 'C';
constexpr char kBinBytes = 'B';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinPut = 'q';
constexpr char kLongBinPut = 'r';
constexpr char kBinGet = 'h';
constexpr char kLongBinGet = 'j';
}  // namespace op

constexpr size_t kBatchSize = 1000;  // Items per SETITEMS / APPENDS, as Python's pickler.

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    int extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;  // Truncated sequence.
    for (int k = 1; k <= extra; ++k) {
      const unsigned char next = text[i + k];
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t min_code[] = {0, 0x80, 0x800, 0x10000};
    if (code < min_code[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

class TorchPickler {
 public:
  TorchPickler(TorchWriteReport* report, const DeferredTensors* deferred)
      : report_(report), deferred_(deferred) {}

  struct Storage {
    std::string key;
    uint64_t nbytes = 0;
    at::Tensor whole;  // A byte view of the entire storage, on the CPU; or, deferred:
    const DeferredTensors::Fetch* fetch = nullptr;
    at::Tensor placeholder;
  };

  absl::Status Pickle(const Value& root) {
    out_.push_back(op::kProto);
    out_.push_back('\x02');
    RETURN_IF_ERROR(Emit(root, 0));
    out_.push_back(op::kStop);
    return absl::OkStatus();
  }

  const std::string& bytes() const { return out_; }
  const std::vector<Storage>& storages() const { return storages_; }

 private:
  static constexpr int kMaxDepth = 1000;

  void Put32(uint32_t value) {
    for (int shift = 0; shift < 32; shift += 8) out_.push_back(static_cast<char>(value >> shift));
  }

  void Memoize() {
    const uint32_t index = next_memo_++;
    if (index < 256) {
      out_.push_back(op::kBinPut);
      out_.push_back(static_cast<char>(index));
    } else {
      out_.push_back(op::kLongBinPut);
      Put32(index);
    }
  }

  void Global(absl::string_view module, absl::string_view name) {
    const std::string full = absl::StrCat(module, "\n", name, "\n");
    if (auto it = global_memo_.find(full); it != global_memo_.end()) {
      if (it->second < 256) {
        out_.push_back(op::kBinGet);
        out_.push_back(static_cast<char>(it->second));
      } else {
        out_.push_back(op::kLongBinGet);
        Put32(it->second);
      }
      return;
    }
    out_.push_back(op::kGlobal);
    out_ += full;
    global_memo_[full] = next_memo_;
    Memoize();
  }

  void Int(int64_t value) {
    if (value >= 0 && value < 256) {
      out_.push_back(op::kBinInt1);
      out_.push_back(static_cast<char>(value));
    } else if (value >= 0 && value < 65536) {
      out_.push_back(op::kBinInt2);
      out_.push_back(static_cast<char>(value & 0xFF));
      out_.push_back(static_cast<char>(value >> 8));
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      out_.push_back(op::kBinInt);
      Put32(static_cast<uint32_t>(static_cast<int32_t>(value)));
    } else {
      // Minimal little-endian two's complement, as Python's encode_long.
      std::string bytes;
      uint64_t bits = static_cast<uint64_t>(value);
      for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(bits >> (8 * i)));
      while (bytes.size() > 1) {
        const char last = bytes.back(), before = bytes[bytes.size() - 2];
        const bool redundant =
            (last == 0 && (before & 0x80) == 0) || (last == '\xff' && (before & 0x80) != 0);
        if (!redundant) break;
        bytes.pop_back();
      }
      out_.push_back(op::kLong1);
      out_.push_back(static_cast<char>(bytes.size()));
      out_.append(bytes.data(), bytes.size());
    }
  }

  absl::Status String(absl::string_view text) {
    if (!IsValidUtf8(text)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "string is not valid UTF-8, which Python cannot unpickle: '", text.substr(0, 64), "'"));
    }
    out_.push_back(op::kBinUnicode);
    Put32(static_cast<uint32_t>(text.size()));
    out_.append(text.data(), text.size());
    return absl::OkStatus();
  }

  void Float(double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    out_.push_back(op::kBinFloat);
    for (int shift = 56; shift >= 0; shift -= 8) out_.push_back(static_cast<char>(bits >> shift));
  }

  void Bytes(absl::string_view bytes) {
    if (bytes.size() < 256) {
      out_.push_back(op::kShortBinBytes);
      out_.push_back(static_cast<char>(bytes.size()));
    } else {
      out_.push_back(op::kBinBytes);
      Put32(static_cast<uint32_t>(bytes.size()));
    }
    out_.append(bytes.data(), bytes.size());
  }

  void TupleOf(size_t count) {  // The items are already on the stack, after a MARK if count > 3.
    switch (count) {
      case 0:
        out_.push_back(op::kEmptyTuple);
        break;
      case 1:
        out_.push_back(op::kTuple1);
        break;
      case 2:
        out_.push_back(op::kTuple2);
        break;
      case 3:
        out_.push_back(op::kTuple3);
        break;
      default:
        out_.push_back(op::kTuple);
    }
  }

  absl::Status Sequence(const std::vector<Value>& items, bool tuple, int depth) {
    if (tuple) {
      if (items.size() > 3) out_.push_back(op::kMark);
      for (const Value& item : items) RETURN_IF_ERROR(Emit(item, depth + 1));
      TupleOf(items.size());
      return absl::OkStatus();
    }
    out_.push_back(op::kEmptyList);
    Memoize();
    for (size_t start = 0; start < items.size(); start += kBatchSize) {
      out_.push_back(op::kMark);
      for (size_t i = start; i < std::min(items.size(), start + kBatchSize); ++i) {
        RETURN_IF_ERROR(Emit(items[i], depth + 1));
      }
      out_.push_back(op::kAppends);
    }
    return absl::OkStatus();
  }

  absl::Status Dict(const Value& dict, int depth) {
    const std::vector<Value::Entry>& entries = dict.entries();
    // The producer's class: Module.state_dict() returns an OrderedDict; optimizer state dicts
    // and bundles are plain dicts.
    if (dict.is_ordered_dict()) {
      Global("collections", "OrderedDict");
      out_.push_back(op::kEmptyTuple);
      out_.push_back(op::kReduce);
    } else {
      out_.push_back(op::kEmptyDict);
    }
    Memoize();
    for (size_t start = 0; start < entries.size(); start += kBatchSize) {
      out_.push_back(op::kMark);
      for (size_t i = start; i < std::min(entries.size(), start + kBatchSize); ++i) {
        const DictKey& key = entries[i].first;
        if (key.is_int()) {
          Int(key.int_key());
        } else {
          RETURN_IF_ERROR(String(key.string_key()));
        }
        RETURN_IF_ERROR(Emit(entries[i].second, depth + 1));
      }
      out_.push_back(op::kSetItems);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const Storage*> StorageFor(const at::Tensor& tensor, DType dtype) {
    const c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
    if (auto it = storage_index_.find(impl); it != storage_index_.end()) {
      if (it->second.second != dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat("two tensors view one storage as ", DTypeName(it->second.second), " and ",
                         DTypeName(dtype), "; torch.save cannot represent that"));
      }
      return &storages_[it->second.first];
    }
    if (tensor.is_meta()) {
      // A placeholder (or a view of one): its bytes come from the fetch, when the record is
      // written.
      const DeferredTensors::Entry* deferred =
          deferred_ == nullptr ? nullptr : deferred_->Find(tensor);
      if (deferred == nullptr) {
        return absl::InvalidArgumentError(
            "a tensor on the meta device (shape only, no bytes) is not a placeholder of the "
            "DeferredTensors given to the writer, so nothing supplies its bytes");
      }
      storage_index_[impl] = {storages_.size(), dtype};
      Storage& storage = storages_.emplace_back();
      storage.key = std::to_string(storages_.size() - 1);
      storage.nbytes = tensor.storage().nbytes();
      storage.fetch = &deferred->fetch;
      storage.placeholder = deferred->placeholder;
      return &storage;
    }
    ASSIGN_OR_RETURN(at::Tensor whole, CatchTorchErrors([&] {
                       at::Tensor bytes = at::empty({0}, tensor.options().dtype(at::kByte));
                       bytes.set_(tensor.storage(), 0,
                                  {static_cast<int64_t>(tensor.storage().nbytes())}, {1});
                       return bytes.cpu();
                     }));
    storage_index_[impl] = {storages_.size(), dtype};
    Storage& storage = storages_.emplace_back();
    storage.key = std::to_string(storages_.size() - 1);
    storage.nbytes = whole.nbytes();
    storage.whole = std::move(whole);
    return &storage;
  }

  absl::Status Tensor(const at::Tensor& tensor) {
    if (!tensor.defined()) {
      out_.push_back(op::kNone);
      report_->warnings.push_back("an undefined tensor was written as None");
      return absl::OkStatus();
    }
    if (IsSparseTensor(tensor)) return SparseTensor(tensor);
    if (tensor.layout() != at::kStrided) {
      std::ostringstream layout;
      layout << tensor.layout();
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write a tensor of layout ", layout.str(), " to a torch file yet"));
    }
    ASSIGN_OR_RETURN(DType dtype, FromScalarType(tensor.scalar_type()));
    if (tensor.is_quantized()) return QuantizedTensor(tensor, dtype);
    ASSIGN_OR_RETURN(const Storage* storage, StorageFor(tensor, dtype));
    const bool parameter = tensor.requires_grad();
    if (parameter) Global("torch._utils", "_rebuild_parameter");
    Global("torch._utils", "_rebuild_tensor_v2");
    out_.push_back(op::kMark);
    RETURN_IF_ERROR(StorageOffsetSizeStride(tensor, dtype, *storage));
    out_.push_back(op::kNewFalse);         // requires_grad is restored by _rebuild_parameter.
    Global("collections", "OrderedDict");  // backward_hooks: always empty.
    out_.push_back(op::kEmptyTuple);
    out_.push_back(op::kReduce);
    out_.push_back(op::kTuple);
    out_.push_back(op::kReduce);
    if (parameter) {
      out_.push_back(op::kNewTrue);
      Global("collections", "OrderedDict");
      out_.push_back(op::kEmptyTuple);
      out_.push_back(op::kReduce);
      out_.push_back(op::kTuple3);
      out_.push_back(op::kReduce);
    }
    return absl::OkStatus();
  }

  // A sparse tensor as torch.save writes one: rebuild(_get_layout("torch.sparse_coo"), (parts...,
  // size)). torch 1.13 writes CSR with _rebuild_sparse_csr_tensor, and only COO and CSR at all;
  // CSC, BSR and BSC go as torch 2.x writes them, with _rebuild_sparse_tensor. COO omits 2.x's
  // is_coalesced, which 1.13's reader does not take (2.x reads both forms).
  absl::Status SparseTensor(const at::Tensor& tensor) {
    ASSIGN_OR_RETURN(SparseParts sparse, SparsePartsOf(tensor));
    if (tensor.requires_grad()) {
      report_->warnings.push_back(absl::StrCat(
          "requires_grad of a ", sparse.layout_name, " tensor is not kept: torch.save drops it"));
    }
    Global("torch._utils", sparse.layout_name == "sparse_csr" ? "_rebuild_sparse_csr_tensor"
                                                               : "_rebuild_sparse_tensor");
    Global("torch.serialization", "_get_layout");
    RETURN_IF_ERROR(String(absl::StrCat("torch.", sparse.layout_name)));
    out_.push_back(op::kTuple1);
    out_.push_back(op::kReduce);
    out_.push_back(op::kMark);
    for (const at::Tensor& part : sparse.parts) RETURN_IF_ERROR(Tensor(part));
    if (tensor.dim() > 3) out_.push_back(op::kMark);
    for (int64_t size : tensor.sizes()) Int(size);
    TupleOf(tensor.dim());
    out_.push_back(op::kTuple);   // the data: parts and size.
    out_.push_back(op::kTuple2);  // (layout, data)
    out_.push_back(op::kReduce);
    return absl::OkStatus();
  }

  // The first arguments of torch's rebuild functions: the storage's persistent id
  // ('storage', torch.<Type>Storage, key, 'cpu', numel), then the storage offset, size and
  // stride.
  absl::Status StorageOffsetSizeStride(const at::Tensor& tensor, DType dtype,
                                       const Storage& storage) {
    const DTypeInfo& info = GetDTypeInfo(dtype);
    out_.push_back(op::kMark);
    RETURN_IF_ERROR(String("storage"));
    Global("torch", info.storage_name);
    RETURN_IF_ERROR(String(storage.key));
    RETURN_IF_ERROR(String("cpu"));
    Int(static_cast<int64_t>(storage.nbytes) / info.element_size);
    out_.push_back(op::kTuple);
    out_.push_back(op::kBinPersId);
    Int(tensor.storage_offset());
    if (tensor.dim() > 3) out_.push_back(op::kMark);
    for (int64_t size : tensor.sizes()) Int(size);
    TupleOf(tensor.dim());
    if (tensor.dim() > 3) out_.push_back(op::kMark);
    for (int64_t stride : tensor.strides()) Int(stride);
    TupleOf(tensor.dim());
    return absl::OkStatus();
  }

  // A quantized tensor as torch.save writes one: torch._utils._rebuild_qtensor(storage, offset,
  // size, stride, quantizer_params, requires_grad, backward_hooks), the params (qscheme, scale,
  // zero_point) per tensor or (qscheme, scales, zero_points, axis) per channel. torch 1.13's
  // weights_only loader refuses every quantized file, torch.save's own too; 2.x allows these.
  absl::Status QuantizedTensor(const at::Tensor& tensor, DType dtype) {
    if (dtype == DType::kQUInt4x2 || dtype == DType::kQUInt2x4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot write a ", DTypeName(dtype),
          " tensor (sub-byte elements packed per row) to a torch file yet"));
    }
    const at::QScheme scheme = tensor.qscheme();
    const std::string scheme_name = c10::toString(scheme);
    if (scheme != at::kPerTensorAffine && scheme != at::kPerChannelAffine &&
        scheme != at::kPerChannelAffineFloatQParams) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write a ", DTypeName(dtype),
                                                     " tensor quantized with scheme ",
                                                     scheme_name, " to a torch file"));
    }
    ASSIGN_OR_RETURN(const Storage* storage, StorageFor(tensor, dtype));
    Global("torch._utils", "_rebuild_qtensor");
    out_.push_back(op::kMark);
    RETURN_IF_ERROR(StorageOffsetSizeStride(tensor, dtype, *storage));
    if (scheme == at::kPerTensorAffine) {
      Global("torch", scheme_name);
      Float(tensor.q_scale());
      Int(tensor.q_zero_point());
      out_.push_back(op::kTuple3);
    } else {
      out_.push_back(op::kMark);
      Global("torch", scheme_name);
      RETURN_IF_ERROR(Tensor(tensor.q_per_channel_scales()));
      RETURN_IF_ERROR(Tensor(tensor.q_per_channel_zero_points()));
      Int(tensor.q_per_channel_axis());
      out_.push_back(op::kTuple);
    }
    out_.push_back(op::kNewFalse);  // a quantized tensor never requires grad.
    Global("collections", "OrderedDict");  // backward_hooks: always empty.
    out_.push_back(op::kEmptyTuple);
    out_.push_back(op::kReduce);
    out_.push_back(op::kTuple);
    out_.push_back(op::kReduce);
    return absl::OkStatus();
  }

  absl::Status Emit(const Value& value, int depth) {
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat("value nests deeper than ", kMaxDepth, " levels"));
    }
    switch (value.kind()) {
      case Value::Kind::kNone:
        out_.push_back(op::kNone);
        return absl::OkStatus();
      case Value::Kind::kBool:
        out_.push_back(value.bool_value() ? op::kNewTrue : op::kNewFalse);
        return absl::OkStatus();
      case Value::Kind::kInt:
        Int(value.int_value());
        return absl::OkStatus();
      case Value::Kind::kFloat:
        Float(value.float_value());
        return absl::OkStatus();
      case Value::Kind::kString:
        return String(value.string_value());
      case Value::Kind::kBytes:
        Bytes(value.string_value());
        return absl::OkStatus();
      case Value::Kind::kList:
      case Value::Kind::kTuple:
        return Sequence(value.items(), value.is_tuple(), depth);
      case Value::Kind::kDict:
        return Dict(value, depth);
      case Value::Kind::kTensor:
        return Tensor(value.tensor());
      case Value::Kind::kOpaque: {
        // Data, not code: written back as the objects they were, as torch.save writes them.
        switch (PlainObjectKind(value)) {
          case PlainObject::kDtype: {
            const std::string& name = value.opaque_class_name();  // "torch.float16"
            Global("torch", absl::string_view(name).substr(6));
            return absl::OkStatus();
          }
          case PlainObject::kComplex:
          case PlainObject::kDevice: {
            const std::string& name = value.opaque_class_name();
            const size_t dot = name.find('.');
            Global(absl::string_view(name).substr(0, dot), absl::string_view(name).substr(dot + 1));
            RETURN_IF_ERROR(Emit(value.opaque_args(), depth + 1));
            out_.push_back(op::kReduce);
            return absl::OkStatus();
          }
          case PlainObject::kNone:
            break;
        }
        report_->warnings.push_back(
            absl::StrCat("opaque object of class ", value.opaque_class_name(),
                         " written as a plain description dict, not as code"));
        Value description = Value::Dict();
        description.Set("__opaque_class__", Value::String(value.opaque_class_name()));
        description.Set("args", value.opaque_args());
        description.Set("state", value.opaque_state());
        return Dict(description, depth);
      }
    }
    return absl::InternalError("unhandled Value kind");
  }

  TorchWriteReport* report_;
  const DeferredTensors* deferred_;
  std::string out_;
  uint32_t next_memo_ = 0;
  absl::flat_hash_map<std::string, uint32_t> global_memo_;
  absl::flat_hash_map<const c10::StorageImpl*, std::pair<size_t, DType>> storage_index_;
  std::vector<Storage> storages_;
};

}  // namespace

Value StateDictToValue(const StateDict& state_dict) {
  std::vector<Value::Entry> entries;
  entries.reserve(state_dict.size());
  for (const StateDict::Entry& entry : state_dict) {
    entries.emplace_back(DictKey(entry.key), Value::Tensor(entry.tensor, entry.original_device));
  }
  return Value::OrderedDict(std::move(entries));
}

absl::StatusOr<at::Tensor> DeferredTensors::Add(DType dtype, const std::vector<int64_t>& shape,
                                                Fetch fetch) {
  ASSIGN_OR_RETURN(const c10::ScalarType scalar_type, ToScalarType(dtype));
  for (int64_t size : shape) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a deferred tensor's shape has a negative dimension: ", size));
    }
  }
  ASSIGN_OR_RETURN(at::Tensor placeholder, CatchTorchErrors([&] {
                     return at::empty(shape,
                                      at::TensorOptions().dtype(scalar_type).device(at::kMeta));
                   }));
  entries_.emplace(placeholder.storage().unsafeGetStorageImpl(),
                   Entry{placeholder, std::move(fetch)});
  return placeholder;
}

const DeferredTensors::Entry* DeferredTensors::Find(const at::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.is_meta()) return nullptr;
  auto it = entries_.find(tensor.storage().unsafeGetStorageImpl());
  return it == entries_.end() ? nullptr : &it->second;
}

absl::StatusOr<TorchFileWriter> TorchFileWriter::Plan(const Value& root,
                                                      const DeferredTensors* deferred,
                                                      const TorchWriteOptions& options) {
  if (options.archive_name.empty() || options.archive_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("archive name '", options.archive_name, "' must be one path segment"));
  }
  TorchWriteReport report;
  TorchPickler pickler(&report, deferred);
  RETURN_IF_ERROR(pickler.Pickle(root));

  TorchFileWriter writer;
  writer.options_ = options;
  writer.warnings_ = std::move(report.warnings);
  const std::string prefix = options.archive_name + "/";
  const auto small = [&](std::string name, std::string bytes) {
    Record& record = writer.records_.emplace_back();
    record.name = std::move(name);
    record.size = bytes.size();
    record.bytes = std::move(bytes);
  };
  // torch.save's order: the pickle, byteorder, the storages, version.
  small(prefix + "data.pkl", pickler.bytes());
  small(prefix + "byteorder", "little");
  for (const TorchPickler::Storage& storage : pickler.storages()) {
    Record& record = writer.records_.emplace_back();
    record.name = prefix + "data/" + storage.key;
    record.size = storage.nbytes;
    record.storage = storage.whole;
    if (storage.fetch != nullptr) record.fetch = *storage.fetch;
    record.placeholder = storage.placeholder;
  }
  small(prefix + "version", "3\n");
  std::vector<std::pair<std::string, uint64_t>> sizes;
  sizes.reserve(writer.records_.size());
  for (const Record& record : writer.records_) sizes.emplace_back(record.name, record.size);
  writer.file_bytes_ = ZipWriter::PlannedBytes(sizes, options.zip);
  return writer;
}

absl::StatusOr<TorchWriteReport> TorchFileWriter::Write(const ZipSink& sink,
                                                        const TorchWriteProgress& progress) {
  if (written_) return absl::FailedPreconditionError("TorchFileWriter: the file was written");
  written_ = true;
  TorchWriteReport report;
  report.warnings = warnings_;
  ZipWriter zip(sink, options_.zip);
  const auto as_bytes = [](const at::Tensor& tensor) {
    return absl::string_view(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  };
  for (Record& record : records_) {
    if (record.fetch) {
      ASSIGN_OR_RETURN(at::Tensor fetched, record.fetch());
      const at::Tensor& expected = record.placeholder;
      if (!fetched.defined() || fetched.scalar_type() != expected.scalar_type() ||
          fetched.sizes() != expected.sizes()) {
        return absl::InternalError(absl::StrCat(
            "torch writer: the deferred tensor of ", record.name, " was planned as ",
            c10::toString(expected.scalar_type()), " [", absl::StrJoin(expected.sizes(), ", "),
            "] but fetched as ",
            fetched.defined() ? absl::StrCat(c10::toString(fetched.scalar_type()), " [",
                                             absl::StrJoin(fetched.sizes(), ", "), "]")
                              : "undefined"));
      }
      RETURN_IF_ERROR(CatchTorchErrors([&] { fetched = fetched.to(at::kCPU).contiguous(); }));
      if (static_cast<uint64_t>(fetched.nbytes()) != record.size) {
        return absl::InternalError(absl::StrCat("torch writer: ", record.name, " planned ",
                                                record.size, " bytes, fetched ", fetched.nbytes()));
      }
      RETURN_IF_ERROR(zip.AddEntry(record.name, as_bytes(fetched)));
      // Released here, before the next record is fetched: one deferred tensor at a time.
      record.fetch = nullptr;
    } else if (record.storage.defined()) {
      RETURN_IF_ERROR(zip.AddEntry(record.name, as_bytes(record.storage)));
    } else {
      RETURN_IF_ERROR(zip.AddEntry(record.name, record.bytes));
    }
    if (record.storage.defined() || record.placeholder.defined()) {
      report.storages += 1;
      report.storage_bytes += static_cast<int64_t>(record.size);
    }
    if (progress) progress(zip.bytes_written(), file_bytes_);
  }
  RETURN_IF_ERROR(zip.Finish());
  report.file_bytes = zip.bytes_written();
  if (report.file_bytes != file_bytes_) {
    return absl::InternalError(
        absl::StrCat("torch writer: wrote ", report.file_bytes, " bytes, planned ", file_bytes_));
  }
  return report;
}

absl::StatusOr<TorchWriteReport> TorchFileWriter::WriteFile(const std::string& path,
                                                            const TorchWriteProgress& progress) {
  ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(path));
  ASSIGN_OR_RETURN(TorchWriteReport report,
                   Write([&](absl::string_view bytes) { return file.Append(bytes); }, progress));
  RETURN_IF_ERROR(file.Commit());
  return report;
}

absl::StatusOr<TorchWriteReport> WriteTorchFile(const std::string& path, const Value& root,
                                                const TorchWriteOptions& options) {
  ASSIGN_OR_RETURN(TorchFileWriter writer, TorchFileWriter::Plan(root, nullptr, options));
  return writer.WriteFile(path);
}

}  // namespace ckpt
