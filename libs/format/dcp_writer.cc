#include "libs/format/dcp_writer.h"

#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/io/atomic_file.h"
#include "libs/status/status_macros.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {
namespace {

constexpr char kMetadataModule[] = "torch.distributed.checkpoint.metadata";
constexpr char kFilesystemModule[] = "torch.distributed.checkpoint.filesystem";
// FileSystemWriter's name for rank 0's first (with single_file_per_rank, only) data file.
constexpr char kDataFile[] = "__0_0.distcp";

// The few pickle opcodes the metadata needs (protocol 2, which every Python 3 reads). Objects are
// built as Python's default reduction builds them: GLOBAL class, NEWOBJ on no arguments, BUILD
// with the instance's __dict__ (or __getstate__'s value).
class MetadataPickler {
 public:
  MetadataPickler() { out_ = "\x80\x02"; }
  void Global(absl::string_view module, absl::string_view name) {
    absl::StrAppend(&out_, "c", module, "\n", name, "\n");
  }
  void String(absl::string_view text) {
    out_ += 'X';
    AppendLittleEndian(text.size(), 4);
    out_.append(text.data(), text.size());
  }
  void Int(int64_t value) {
    if (value >= INT32_MIN && value <= INT32_MAX) {
      out_ += 'J';
      AppendLittleEndian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes, two's complement
      AppendLittleEndian(static_cast<uint64_t>(value), 8);
    }
  }
  void None() { out_ += 'N'; }
  void Bool(bool value) { out_ += value ? '\x88' : '\x89'; }
  void Mark() { out_ += '('; }
  void Tuple() { out_ += 't'; }  // of everything since the Mark
  void EmptyDict() { out_ += '}'; }
  void SetItems() { out_ += 'u'; }  // the pairs since the Mark into the dict below it
  void EmptyList() { out_ += ']'; }
  void Appends() { out_ += 'e'; }
  void Reduce() { out_ += 'R'; }
  void Build() { out_ += 'b'; }
  // cls.__new__(cls): what NEWOBJ on an empty tuple makes.
  void NewObject(absl::string_view module, absl::string_view name) {
    Global(module, name);
    out_ += ")\x81";
  }
  // torch.Size(dims).
  void Size(const std::vector<int64_t>& dims) {
    Global("torch", "Size");
    Mark();
    Mark();
    for (int64_t d : dims) Int(d);
    Tuple();
    Tuple();
    Reduce();
  }
  std::string Finish() && {
    out_ += '.';
    return std::move(out_);
  }

 private:
  void AppendLittleEndian(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((value >> (8 * i)) & 0xff);
  }
  std::string out_;
};

// One value of the flattened state dict.
struct Item {
  std::string key;                 // "model.fc.weight"
  std::vector<DictKey> path_keys;  // the keys that lead to it, for planner_data
  const Value* value = nullptr;
};

absl::Status Flatten(const Value& dict, std::vector<DictKey>& path, std::vector<Item>& items,
                     absl::flat_hash_set<std::string>& seen) {
  for (const auto& [key, value] : dict.entries()) {
    path.push_back(key);
    if (value.is_dict() && !value.entries().empty()) {
      RETURN_IF_ERROR(Flatten(value, path, items, seen));
    } else {
      Item item;
      std::vector<std::string> parts;
      for (const DictKey& part : path) {
        parts.push_back(part.is_int() ? absl::StrCat(part.int_key()) : part.string_key());
      }
      item.key = absl::StrJoin(parts, ".");
      item.path_keys = path;
      item.value = &value;
      if (!seen.insert(item.key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("two values flatten to the key '", item.key,
                         "' (DCP joins nested keys with '.'); rename one of them"));
      }
      if (value.is_tensor() && IsSparseTensor(value.tensor())) {
        ASSIGN_OR_RETURN(const SparseParts sparse, SparsePartsOf(value.tensor()));
        return DenseOnlyFormatError("a DCP directory", item.key, sparse.layout_name);
      }
      items.push_back(std::move(item));
    }
    path.pop_back();
  }
  return absl::OkStatus();
}

// A path element of planner_data: torch's traversal writes every dict key as a string (an int
// there means a list position), so an int key comes back from load() as its decimal string.
void PickleKey(MetadataPickler& pickler, const DictKey& key) {
  pickler.String(key.is_int() ? absl::StrCat(key.int_key()) : key.string_key());
}

}  // namespace

absl::StatusOr<DcpWriteReport> WriteDcpDirectory(
    const std::string& dir, const Value& root, const DeferredTensors* deferred,
    const std::function<void(uint64_t done, uint64_t total)>& progress) {
  if (!root.is_dict()) {
    return absl::InvalidArgumentError("a DCP checkpoint holds a state dict: the root is no dict");
  }
  std::vector<Item> items;
  std::vector<DictKey> path;
  absl::flat_hash_set<std::string> seen;
  RETURN_IF_ERROR(Flatten(root, path, items, seen));

  // Every item planned first: the data file's size is known before its first byte.
  std::vector<TorchFileWriter> plans;
  uint64_t total = 0;
  DcpWriteReport report;
  for (const Item& item : items) {
    const Value leaf = item.value->is_tensor() ? Value::Tensor(item.value->tensor()) : *item.value;
    absl::StatusOr<TorchFileWriter> plan = TorchFileWriter::Plan(leaf, deferred);
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrCat("'", item.key, "': ", plan.status().message()));
    }
    total += plan->file_bytes();
    for (const std::string& warning : plan->warnings()) {
      report.warnings.push_back(absl::StrCat("'", item.key, "': ", warning));
    }
    plans.push_back(*std::move(plan));
  }

  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the directory ", dir, ": ", error.message()));
  }
  const std::string data_path = absl::StrCat(dir, "/", kDataFile);
  ASSIGN_OR_RETURN(AtomicFileWriter data, AtomicFileWriter::Create(data_path));
  uint64_t written = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // each item's offset and length
  for (TorchFileWriter& plan : plans) {
    const uint64_t offset = written;
    RETURN_IF_ERROR(plan.Write(
                            [&](absl::string_view bytes) {
                              written += bytes.size();
                              return data.Append(bytes);
                            },
                            [&](uint64_t, uint64_t) {
                              if (progress) progress(written, total);
                            })
                        .status());
    spans.emplace_back(offset, written - offset);
  }
  RETURN_IF_ERROR(data.Commit());
  report.files.push_back(data_path);

  MetadataPickler pickler;
  pickler.NewObject(kMetadataModule, "Metadata");
  pickler.EmptyDict();
  pickler.Mark();
  pickler.String("state_dict_metadata");
  pickler.EmptyDict();
  pickler.Mark();
  for (const Item& item : items) {
    pickler.String(item.key);
    if (!item.value->is_tensor()) {
      pickler.NewObject(kMetadataModule, "BytesStorageMetadata");
      continue;
    }
    const at::Tensor& tensor = item.value->tensor();
    ASSIGN_OR_RETURN(const DType dtype, FromScalarType(tensor.scalar_type()));
    const std::vector<int64_t> dims(tensor.sizes().begin(), tensor.sizes().end());
    pickler.NewObject(kMetadataModule, "TensorStorageMetadata");
    pickler.EmptyDict();
    pickler.Mark();
    pickler.String("properties");
    // TensorProperties' __getstate__: (dtype, layout, requires_grad, memory format, pin_memory).
    pickler.NewObject(kMetadataModule, "TensorProperties");
    pickler.Mark();
    pickler.Global("torch", GetDTypeInfo(dtype).name);
    pickler.Global("torch.serialization", "_get_layout");
    pickler.Mark();
    pickler.String("torch.strided");
    pickler.Tuple();
    pickler.Reduce();
    pickler.Bool(false);
    pickler.Global("builtins", "getattr");
    pickler.Mark();
    pickler.Global(kMetadataModule, "_MEM_FORMAT_ENCODING");
    pickler.String("TORCH_CONTIGUOUS_FORMAT");
    pickler.Tuple();
    pickler.Reduce();
    pickler.Bool(false);
    pickler.Tuple();
    pickler.Build();
    pickler.String("size");
    pickler.Size(dims);
    pickler.String("chunks");
    pickler.EmptyList();
    pickler.Mark();
    pickler.NewObject(kMetadataModule, "ChunkStorageMetadata");
    pickler.EmptyDict();
    pickler.Mark();
    pickler.String("offsets");
    pickler.Size(std::vector<int64_t>(dims.size(), 0));
    pickler.String("sizes");
    pickler.Size(dims);
    pickler.SetItems();
    pickler.Build();
    pickler.Appends();
    pickler.SetItems();
    pickler.Build();
    ++report.tensors;
  }
  pickler.SetItems();
  pickler.String("planner_data");
  pickler.EmptyDict();
  pickler.Mark();
  for (const Item& item : items) {
    pickler.String(item.key);
    pickler.Mark();
    for (const DictKey& part : item.path_keys) PickleKey(pickler, part);
    pickler.Tuple();
  }
  pickler.SetItems();
  pickler.String("storage_data");
  pickler.EmptyDict();
  pickler.Mark();
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    pickler.NewObject(kMetadataModule, "MetadataIndex");
    pickler.EmptyDict();
    pickler.Mark();
    pickler.String("fqn");
    pickler.String(item.key);
    pickler.String("offset");
    if (item.value->is_tensor()) {
      pickler.Size(std::vector<int64_t>(item.value->tensor().dim(), 0));
    } else {
      pickler.None();
    }
    pickler.String("index");
    if (item.value->is_tensor()) {
      pickler.Int(0);
    } else {
      pickler.None();
    }
    pickler.SetItems();
    pickler.Build();
    pickler.NewObject(kFilesystemModule, "_StorageInfo");
    pickler.EmptyDict();
    pickler.Mark();
    pickler.String("relative_path");
    pickler.String(kDataFile);
    pickler.String("offset");
    pickler.Int(static_cast<int64_t>(spans[i].first));
    pickler.String("length");
    pickler.Int(static_cast<int64_t>(spans[i].second));
    pickler.SetItems();
    pickler.Build();
  }
  pickler.SetItems();
  pickler.String("storage_meta");
  pickler.None();
  pickler.SetItems();
  pickler.Build();
  const std::string metadata = std::move(pickler).Finish();

  const std::string metadata_path = absl::StrCat(dir, "/.metadata");
  ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(metadata_path));
  RETURN_IF_ERROR(out.Append(metadata));
  RETURN_IF_ERROR(out.Commit());
  report.files.push_back(metadata_path);
  report.file_bytes = written + metadata.size();
  return report;
}

}  // namespace ckpt
