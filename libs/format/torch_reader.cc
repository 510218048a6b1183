#include "libs/format/torch_reader.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/_empty_affine_quantized.h"
#include "ATen/ops/_empty_per_channel_affine_quantized.h"
#include "ATen/ops/empty.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "c10/core/CPUAllocator.h"
#include "c10/core/Storage.h"
#include "c10/util/Half.h"
#include "libs/format/pickle_reader.h"
#include "libs/format/zip_reader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/dtype.h"

namespace ckpt {
namespace {

// The first pickle of a legacy file: torch.serialization.MAGIC_NUMBER.
constexpr absl::string_view kLegacyMagic = "119547037146038801333356";
constexpr int64_t kLegacyProtocolVersion = 1001;
// data.pkl is read whole; a bigger one is not a checkpoint this reader should trust.
constexpr uint64_t kMaxPickleBytes = uint64_t{4} << 30;
// Newest "version" record this reader was written against (PyTorch 1.13 writes 3).
constexpr int64_t kNewestKnownZipVersion = 3;

// --- Small Value accessors with messages ----------------------------------------------------

absl::StatusOr<std::string> AsText(const Value& value, absl::string_view what) {
  if (value.is_string() || value.is_bytes()) return value.string_value();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": expected a str, found ", value.DebugString()));
}

absl::StatusOr<int64_t> AsInt(const Value& value, absl::string_view what) {
  if (value.is_int()) return value.int_value();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": expected an int, found ", value.DebugString()));
}

absl::StatusOr<double> AsFloat(const Value& value, absl::string_view what) {
  if (value.is_float()) return value.float_value();
  if (value.is_int()) return static_cast<double>(value.int_value());
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": expected a float, found ", value.DebugString()));
}

bool AsBool(const Value& value) {
  if (value.is_bool()) return value.bool_value();
  if (value.is_int()) return value.int_value() != 0;
  return false;
}

absl::StatusOr<std::vector<int64_t>> AsInts(const Value& value, absl::string_view what) {
  if (!value.is_sequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a tuple of ints, found ", value.DebugString()));
  }
  std::vector<int64_t> out;
  out.reserve(value.items().size());
  for (const Value& item : value.items()) {
    ASSIGN_OR_RETURN(int64_t v, AsInt(item, what));
    out.push_back(v);
  }
  return out;
}

// A class referenced as a value (Opaque with no args and state): its "module.Name".
std::optional<std::string> GlobalName(const Value& value) {
  if (value.is_opaque() && value.opaque_args().is_none() && value.opaque_state().is_none()) {
    return value.opaque_class_name();
  }
  return std::nullopt;
}

bool IsEmptyContainer(const Value& value) {
  if (value.is_none()) return true;
  if (value.is_dict()) return value.entries().empty();
  if (value.is_sequence()) return value.items().empty();
  return false;
}

std::string Shape(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// --- Storages -------------------------------------------------------------------------------

absl::StatusOr<DType> StorageDType(const Value& type) {
  std::optional<std::string> name = GlobalName(type);
  if (!name.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage type: expected a storage class, found ", type.DebugString()));
  }
  if (*name == "torch.UntypedStorage" || *name == "torch.storage.UntypedStorage" ||
      *name == "torch.storage._UntypedStorage") {
    return DType::kUInt8;
  }
  return DTypeFromStorageName(*name);
}

absl::StatusOr<c10::Storage> AllocateStorage(uint64_t nbytes) {
  return CatchTorchErrors(
      [&] {
        return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes),
                            c10::GetDefaultCPUAllocator(), /*resizable=*/false);
      },
      absl::StatusCode::kResourceExhausted);
}

char* StorageBytes(const c10::Storage& storage) {
  return static_cast<char*>(storage.data_ptr().get());
}

// Big-endian files: reverse each scalar (each half of a complex number).
void ByteSwap(char* data, uint64_t nbytes, DType dtype) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  const int unit = info.is_complex ? info.element_size / 2 : info.element_size;
  if (unit <= 1) return;
  for (uint64_t i = 0; i + unit <= nbytes; i += unit) std::reverse(data + i, data + i + unit);
}

// A storage as the pickle sees it: a 1-D tensor of its dtype over all its bytes, tagged with
// the saving device. Dtypes LibTorch lacks become an opaque TypedStorage over uint8 bytes.
absl::StatusOr<Value> StorageValue(const c10::Storage& storage, DType dtype, int64_t numel,
                                   const std::string& location,
                                   std::vector<std::string>& warnings) {
  absl::StatusOr<c10::ScalarType> scalar_type = ToScalarType(dtype);
  const bool supported = scalar_type.ok() && !GetDTypeInfo(dtype).is_quantized;
  const c10::ScalarType tensor_type = supported ? *scalar_type : c10::ScalarType::Byte;
  const int64_t length = supported ? numel : numel * ElementSize(dtype);
  ASSIGN_OR_RETURN(at::Tensor tensor, CatchTorchErrors([&] {
                     at::Tensor t = at::empty({0}, at::TensorOptions().dtype(tensor_type));
                     t.set_(storage, 0, {length}, {1});
                     return t;
                   }));
  if (supported) return Value::Tensor(std::move(tensor), location);
  if (!GetDTypeInfo(dtype).is_quantized) {
    warnings.push_back(absl::StrCat("storage of dtype ", DTypeName(dtype),
                                    " kept as bytes: LibTorch 1.13 has no such ScalarType"));
  }
  return Value::Opaque("torch.storage.TypedStorage",
                       Value::Tuple({Value::String(std::string(DTypeName(dtype))),
                                     Value::Tensor(std::move(tensor), location)}),
                       Value::None());
}

// Where a tensor's elements may come from: a byte range of a storage.
struct StorageSpan {
  c10::Storage storage;
  int64_t byte_offset = 0;
  int64_t byte_length = 0;
  DType dtype = DType::kUnspecified;
  std::string location;
};

// The storage argument of a rebuild function: a Value::Tensor from StorageValue (or a narrowed
// legacy view of one), or the opaque TypedStorage of a quantized / unsupported dtype.
std::optional<StorageSpan> AsStorage(const Value& value) {
  const Value* tensor_value = &value;
  std::optional<DType> dtype;
  if (value.is_opaque() && value.opaque_class_name() == "torch.storage.TypedStorage" &&
      value.opaque_args().is_tuple() && value.opaque_args().items().size() == 2) {
    absl::StatusOr<DType> parsed = ParseDType(value.opaque_args().items()[0].is_string()
                                                  ? value.opaque_args().items()[0].string_value()
                                                  : "");
    if (!parsed.ok()) return std::nullopt;
    dtype = *parsed;
    tensor_value = &value.opaque_args().items()[1];
  }
  if (!tensor_value->is_tensor() || !tensor_value->tensor().defined() ||
      tensor_value->tensor().dim() != 1 || !tensor_value->tensor().is_contiguous()) {
    return std::nullopt;
  }
  const at::Tensor& t = tensor_value->tensor();
  StorageSpan span;
  span.storage = t.storage();
  span.byte_offset = t.storage_offset() * static_cast<int64_t>(t.element_size());
  span.byte_length = t.numel() * static_cast<int64_t>(t.element_size());
  span.location = tensor_value->tensor_original_device();
  if (dtype.has_value()) {
    span.dtype = *dtype;
  } else {
    absl::StatusOr<DType> from = FromScalarType(t.scalar_type());
    if (!from.ok()) return std::nullopt;
    span.dtype = *from;
  }
  return span;
}

// Checks that size / stride / offset stay inside `span` and returns the offset in elements of
// `dtype` from the start of the storage.
absl::StatusOr<int64_t> CheckExtent(const StorageSpan& span, DType dtype, int64_t offset,
                                    const std::vector<int64_t>& size,
                                    const std::vector<int64_t>& stride) {
  const int64_t element_size = ElementSize(dtype);
  if (size.size() != stride.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("size ", Shape(size), " and stride ", Shape(stride), " differ in length"));
  }
  RETURN_IF_ERROR(ByteLengthOf(dtype, size).status());
  for (int64_t s : stride) {
    if (s < 0)
      return absl::InvalidArgumentError(absl::StrCat("negative stride in ", Shape(stride)));
  }
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative storage offset ", offset));
  }
  if (span.byte_offset % element_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("storage view at byte ", span.byte_offset,
                                                   " is not aligned to ", DTypeName(dtype)));
  }
  const int64_t available = span.byte_length / element_size;
  bool empty = false;
  int64_t extent = offset;  // Index of the last element.
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == 0) empty = true;
  }
  bool overflow = false;
  if (!empty) {
    for (size_t i = 0; i < size.size(); ++i) {
      int64_t step;
      overflow |= __builtin_mul_overflow(size[i] - 1, stride[i], &step);
      overflow |= __builtin_add_overflow(extent, step, &extent);
    }
  }
  const int64_t needed = empty ? offset : extent + 1;
  if (overflow || needed > available) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tensor of size ", Shape(size), ", stride ", Shape(stride), " and storage offset ",
        offset, " needs ", overflow ? "more than 2^63" : absl::StrCat(needed), " elements of ",
        DTypeName(dtype), " but its storage holds ", available));
  }
  return span.byte_offset / element_size + offset;
}

// --- Hooks shared by both formats ------------------------------------------------------------

class TorchHooks : public PickleHooks {
 public:
  bool HandlesGlobal(absl::string_view global) const override {
    static constexpr absl::string_view kHandled[] = {
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._utils._rebuild_qtensor",
        "torch._tensor._rebuild_from_type",
        "torch._tensor._rebuild_from_type_v2",
        "torch.Size",
        "torch.device",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
    };
    return std::find(std::begin(kHandled), std::end(kHandled), global) != std::end(kHandled);
  }

  absl::StatusOr<std::optional<Value>> CallGlobal(absl::string_view global,
                                                  const Value& args) override {
    const std::vector<Value>& a = args.items();
    if (global == "torch._utils._rebuild_tensor") {
      RETURN_IF_ERROR(NeedArgs(a, 4));
      return RebuildTensor(global, a[0], a[1], a[2], a[3], false, std::nullopt);
    }
    if (global == "torch._utils._rebuild_tensor_v2") {
      RETURN_IF_ERROR(NeedArgs(a, 6));
      if (!IsEmptyContainer(a[5])) Warn("backward hooks of a tensor dropped");
      if (a.size() > 6 && !IsEmptyContainer(a[6])) {
        Warn(absl::StrCat("tensor metadata dropped: ", a[6].DebugString()));
      }
      return RebuildTensor(global, a[0], a[1], a[2], a[3], AsBool(a[4]), std::nullopt);
    }
    if (global == "torch._utils._rebuild_tensor_v3") {
      RETURN_IF_ERROR(NeedArgs(a, 7));
      std::optional<std::string> dtype_name = GlobalName(a[6]);
      if (!dtype_name.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("expected a torch dtype, found ", a[6].DebugString()));
      }
      ASSIGN_OR_RETURN(DType dtype, ParseDType(*dtype_name));
      return RebuildTensor(global, a[0], a[1], a[2], a[3], AsBool(a[4]), dtype);
    }
    if (global == "torch._utils._rebuild_parameter" ||
        global == "torch._utils._rebuild_parameter_with_state") {
      RETURN_IF_ERROR(NeedArgs(a, 3));
      if (a.size() > 3 && !IsEmptyContainer(a[3])) {
        Warn(absl::StrCat("nn.Parameter attributes dropped: ", a[3].DebugString()));
      }
      if (!a[0].is_tensor()) return std::nullopt;  // E.g. a tensor kept opaque.
      return Parameter(a[0], AsBool(a[1]));
    }
    if (global == "torch._utils._rebuild_qtensor") {
      RETURN_IF_ERROR(NeedArgs(a, 5));
      return RebuildQuantized(a);
    }
    if (global == "torch._tensor._rebuild_from_type" ||
        global == "torch._tensor._rebuild_from_type_v2") {
      // (func, type, args[, state]): a tensor subclass; rebuild the plain tensor.
      RETURN_IF_ERROR(NeedArgs(a, 3));
      std::optional<std::string> func = GlobalName(a[0]);
      if (!func.has_value() || !HandlesGlobal(*func) || !a[2].is_tuple()) return std::nullopt;
      std::optional<std::string> type = GlobalName(a[1]);
      if (type.has_value() && *type != "torch.Tensor" && *type != "torch.nn.parameter.Parameter") {
        Warn(absl::StrCat("tensor subclass ", *type, " read as a plain tensor"));
      }
      if (a.size() > 3 && !IsEmptyContainer(a[3])) {
        Warn(absl::StrCat("tensor attributes dropped: ", a[3].DebugString()));
      }
      return CallGlobal(*func, a[2]);
    }
    if (global == "torch.Size") {
      RETURN_IF_ERROR(NeedArgs(a, 1));
      ASSIGN_OR_RETURN(std::vector<int64_t> dims, AsInts(a[0], "torch.Size"));
      std::vector<Value> items;
      for (int64_t d : dims) items.push_back(Value::Int(d));
      return Value::Tuple(std::move(items));
    }
    if (global == "torch.device") {
      return Value::Opaque("torch.device", args, Value::None());
    }
    if (global == "numpy.core.multiarray.scalar" || global == "numpy._core.multiarray.scalar") {
      return NumpyScalar(a);
    }
    return std::nullopt;
  }

 protected:
  void Warn(std::string message) { warnings().push_back(std::move(message)); }

 private:
  static absl::Status NeedArgs(const std::vector<Value>& a, size_t n) {
    if (a.size() < n) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected at least ", n, " arguments, found ", a.size()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<Value>> RebuildTensor(absl::string_view global,
                                                     const Value& storage_value,
                                                     const Value& offset_value,
                                                     const Value& size_value,
                                                     const Value& stride_value, bool requires_grad,
                                                     std::optional<DType> dtype_override) {
    std::optional<StorageSpan> span = AsStorage(storage_value);
    if (!span.has_value()) {
      Warn(absl::StrCat(global, " of a storage ckpt cannot materialize (",
                        storage_value.is_opaque() ? storage_value.opaque_class_name()
                                                  : storage_value.DebugString(),
                        "); the tensor is kept as opaque data"));
      return std::nullopt;
    }
    const DType dtype = dtype_override.value_or(span->dtype);
    ASSIGN_OR_RETURN(int64_t offset, AsInt(offset_value, "storage offset"));
    ASSIGN_OR_RETURN(std::vector<int64_t> size, AsInts(size_value, "size"));
    ASSIGN_OR_RETURN(std::vector<int64_t> stride, AsInts(stride_value, "stride"));
    ASSIGN_OR_RETURN(int64_t element_offset, CheckExtent(*span, dtype, offset, size, stride));
    absl::StatusOr<c10::ScalarType> scalar_type = ToScalarType(dtype);
    if (!scalar_type.ok() || GetDTypeInfo(dtype).is_quantized) {
      Warn(absl::StrCat("tensor of dtype ", DTypeName(dtype),
                        " kept as opaque data: LibTorch 1.13 cannot hold it as a plain tensor"));
      return std::nullopt;
    }
    ASSIGN_OR_RETURN(at::Tensor tensor, CatchTorchErrors([&] {
                       at::Tensor t = at::empty({0}, at::TensorOptions().dtype(*scalar_type));
                       t.set_(span->storage, element_offset, size, stride);
                       return t;
                     }));
    if (requires_grad) tensor = SetRequiresGrad(std::move(tensor));
    return Value::Tensor(std::move(tensor), span->location);
  }

  at::Tensor SetRequiresGrad(at::Tensor tensor) {
    if (!at::isFloatingType(tensor.scalar_type()) && !at::isComplexType(tensor.scalar_type())) {
      Warn(absl::StrCat("requires_grad dropped from a ", c10::toString(tensor.scalar_type()),
                        " tensor (only float and complex tensors can require grad)"));
      return tensor;
    }
    tensor.requires_grad_(true);
    return tensor;
  }

  absl::StatusOr<std::optional<Value>> Parameter(const Value& data, bool requires_grad) {
    // A new tensor over the same storage, as nn.Parameter(data) is.
    at::Tensor tensor = data.tensor().detach();
    if (requires_grad) tensor = SetRequiresGrad(std::move(tensor));
    return Value::Tensor(std::move(tensor), data.tensor_original_device());
  }

  // (storage, storage_offset, size, stride, quantizer_params, requires_grad, backward_hooks)
  absl::StatusOr<std::optional<Value>> RebuildQuantized(const std::vector<Value>& a) {
    std::optional<StorageSpan> span = AsStorage(a[0]);
    const Value& params = a[4];
    if (!span.has_value() || !GetDTypeInfo(span->dtype).is_quantized || !params.is_tuple() ||
        params.items().empty()) {
      Warn("quantized tensor kept as opaque data: unexpected storage or quantizer parameters");
      return std::nullopt;
    }
    ASSIGN_OR_RETURN(int64_t offset, AsInt(a[1], "storage offset"));
    ASSIGN_OR_RETURN(std::vector<int64_t> size, AsInts(a[2], "size"));
    ASSIGN_OR_RETURN(std::vector<int64_t> stride, AsInts(a[3], "stride"));
    ASSIGN_OR_RETURN(int64_t element_offset, CheckExtent(*span, span->dtype, offset, size, stride));
    ASSIGN_OR_RETURN(c10::ScalarType scalar_type, ToScalarType(span->dtype));
    const std::vector<Value>& p = params.items();
    const std::string scheme = GlobalName(p[0]).value_or("");
    const at::TensorOptions options = at::TensorOptions().dtype(scalar_type);
    std::function<at::Tensor()> make_empty;
    if (scheme == "torch.per_tensor_affine" && p.size() >= 3) {
      ASSIGN_OR_RETURN(double scale, AsFloat(p[1], "scale"));
      ASSIGN_OR_RETURN(int64_t zero_point, AsInt(p[2], "zero_point"));
      make_empty = [=] { return at::_empty_affine_quantized(size, options, scale, zero_point); };
    } else if ((scheme == "torch.per_channel_affine" ||
                scheme == "torch.per_channel_affine_float_qparams") &&
               p.size() >= 4 && p[1].is_tensor() && p[2].is_tensor()) {
      ASSIGN_OR_RETURN(int64_t axis, AsInt(p[3], "axis"));
      const at::Tensor scales = p[1].tensor();
      const at::Tensor zero_points = p[2].tensor();
      make_empty = [=] {
        return at::_empty_per_channel_affine_quantized(size, scales, zero_points, axis, options);
      };
    } else {
      Warn(absl::StrCat("quantized tensor with scheme '", scheme, "' kept as opaque data"));
      return std::nullopt;
    }
    ASSIGN_OR_RETURN(at::Tensor tensor, CatchTorchErrors(
                                            [&] {
                                              at::Tensor t = make_empty();
                                              t.set_(span->storage, element_offset, size, stride);
                                              return t;
                                            },
                                            absl::StatusCode::kInvalidArgument));
    if (a.size() > 5 && AsBool(a[5])) Warn("requires_grad dropped from a quantized tensor");
    return Value::Tensor(std::move(tensor), span->location);
  }

  // numpy.core.multiarray.scalar(dtype, bytes): numpy.float64(0.5) and friends.
  absl::StatusOr<std::optional<Value>> NumpyScalar(const std::vector<Value>& a) {
    if (a.size() != 2 || !a[0].is_opaque() || a[0].opaque_class_name() != "numpy.dtype" ||
        !a[0].opaque_args().is_tuple() || a[0].opaque_args().items().empty() ||
        !a[0].opaque_args().items()[0].is_string() || !a[1].is_bytes()) {
      return std::nullopt;
    }
    const std::string& code = a[0].opaque_args().items()[0].string_value();
    std::string bytes = a[1].string_value();
    const Value& state = a[0].opaque_state();
    const bool big_endian = state.is_tuple() && state.items().size() > 1 &&
                            state.items()[1].is_string() && state.items()[1].string_value() == ">";
    if (big_endian) std::reverse(bytes.begin(), bytes.end());
    const size_t width = code.size() == 2 ? code[1] - '0' : 0;
    if (width == 0 || bytes.size() != width) return std::nullopt;
    auto load = [&](auto zero) {
      decltype(zero) v;
      std::memcpy(&v, bytes.data(), sizeof(v));
      return v;
    };
    switch (code[0]) {
      case 'f':
        if (width == 8) return Value::Float(load(double{}));
        if (width == 4) return Value::Float(load(float{}));
        if (width == 2)
          return Value::Float(
              static_cast<float>(c10::Half(load(uint16_t{}), c10::Half::from_bits())));
        return std::nullopt;
      case 'i':
        if (width == 8) return Value::Int(load(int64_t{}));
        if (width == 4) return Value::Int(load(int32_t{}));
        if (width == 2) return Value::Int(load(int16_t{}));
        if (width == 1) return Value::Int(load(int8_t{}));
        return std::nullopt;
      case 'u': {
        if (width == 8) {
          const uint64_t v = load(uint64_t{});
          if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
          return Value::Int(static_cast<int64_t>(v));
        }
        if (width == 4) return Value::Int(load(uint32_t{}));
        if (width == 2) return Value::Int(load(uint16_t{}));
        if (width == 1) return Value::Int(load(uint8_t{}));
        return std::nullopt;
      }
      case 'b':
        if (width == 1) return Value::Bool(bytes[0] != 0);
        return std::nullopt;
      default:
        return std::nullopt;
    }
  }
};

// --- torch_zip --------------------------------------------------------------------------------

class ZipHooks : public TorchHooks {
 public:
  ZipHooks(const ZipReader& zip, std::string prefix, bool big_endian)
      : zip_(zip), prefix_(std::move(prefix)), big_endian_(big_endian) {}

  // ('storage', storage_type, key, location, numel)
  absl::StatusOr<PersistentObject> PersistentLoad(const Value& pid) override {
    if (!pid.is_tuple() || pid.items().size() < 5) {
      return absl::InvalidArgumentError("expected ('storage', type, key, location, numel)");
    }
    const std::vector<Value>& a = pid.items();
    ASSIGN_OR_RETURN(std::string kind, AsText(a[0], "persistent id kind"));
    if (kind != "storage") {
      return absl::InvalidArgumentError(absl::StrCat("unknown persistent id kind '", kind, "'"));
    }
    ASSIGN_OR_RETURN(DType dtype, StorageDType(a[1]));
    ASSIGN_OR_RETURN(std::string key, AsText(a[2], "storage key"));
    ASSIGN_OR_RETURN(std::string location, AsText(a[3], "storage location"));
    ASSIGN_OR_RETURN(int64_t numel, AsInt(a[4], "storage size"));
    auto it = storages_.find(key);
    if (it != storages_.end()) {
      if (it->second.dtype != dtype || it->second.numel != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("storage '", key, "' is referenced as ", numel, " x ", DTypeName(dtype),
                         " and earlier as ", it->second.numel, " x ", DTypeName(it->second.dtype)));
      }
      PersistentObject object;
      object.value = it->second.value;
      return object;
    }
    ASSIGN_OR_RETURN(int64_t nbytes, ByteLengthOf(dtype, {numel}));
    const std::string record_name = absl::StrCat(prefix_, "data/", key);
    const ZipEntry* record = zip_.Find(record_name);
    if (record == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage record '", record_name, "' is missing from the archive"));
    }
    if (record->uncompressed_size != static_cast<uint64_t>(nbytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "record '", record_name, "' holds ", record->uncompressed_size,
          " bytes but the pickle expects ", numel, " x ", DTypeName(dtype), " = ", nbytes));
    }
    // Checks the record lies inside the file before allocating its size.
    RETURN_IF_ERROR(zip_.DataOffset(*record).status());
    ASSIGN_OR_RETURN(c10::Storage storage, AllocateStorage(nbytes));
    if (nbytes > 0) {
      RETURN_IF_ERROR(zip_.Read(*record, absl::MakeSpan(StorageBytes(storage), nbytes)));
      if (big_endian_) ByteSwap(StorageBytes(storage), nbytes, dtype);
    } else {
      RETURN_IF_ERROR(zip_.Read(*record, absl::Span<char>()));
    }
    ASSIGN_OR_RETURN(Value value, StorageValue(storage, dtype, numel, location, warnings()));
    storages_.emplace(key, Stored{dtype, numel, value});
    PersistentObject object;
    object.value = std::move(value);
    return object;
  }

 private:
  struct Stored {
    DType dtype;
    int64_t numel;
    Value value;
  };
  const ZipReader& zip_;
  const std::string prefix_;
  const bool big_endian_;
  absl::flat_hash_map<std::string, Stored> storages_;
};

absl::StatusOr<TorchFile> ReadZipCheckpoint(const ByteSource& source) {
  ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(&source));
  const ZipEntry* pickle = nullptr;
  std::string prefix;
  std::vector<std::string> torchscript_markers;
  for (const ZipEntry& entry : zip.entries()) {
    const size_t slash = entry.name.find('/');
    if (slash == std::string::npos) continue;
    const absl::string_view rest = absl::string_view(entry.name).substr(slash + 1);
    if (rest == "constants.pkl" || absl::StartsWith(rest, "code/")) {
      torchscript_markers.push_back(entry.name);
    }
    if (rest == "data.pkl") {
      if (pickle != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(source.name(), ": two pickles, '",
                                                       pickle->name, "' and '", entry.name, "'"));
      }
      pickle = &entry;
      prefix = entry.name.substr(0, slash + 1);
    }
  }
  if (!torchscript_markers.empty()) {
    return absl::UnimplementedError(
        absl::StrCat(source.name(), " is a TorchScript archive (torch.jit.save; it has '",
                     torchscript_markers.front(),
                     "'), not a torch.save checkpoint; load it with torch.jit.load and save its "
                     "state_dict() with torch.save"));
  }
  if (pickle == nullptr) {
    std::vector<std::string> names;
    for (const ZipEntry& entry : zip.entries()) {
      if (names.size() == 5) {
        names.push_back("...");
        break;
      }
      names.push_back(entry.name);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source.name(),
                     " is a zip archive without <name>/data.pkl, so not a torch.save file "
                     "(entries: ",
                     names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }

  TorchFile file;
  file.format = "torch_zip";
  bool big_endian = false;
  if (const ZipEntry* byteorder = zip.Find(prefix + "byteorder")) {
    ASSIGN_OR_RETURN(std::string order, zip.ReadToString(*byteorder, 64));
    const absl::string_view trimmed = absl::StripAsciiWhitespace(order);
    if (trimmed == "big") {
      big_endian = true;
    } else if (trimmed != "little") {
      return absl::InvalidArgumentError(absl::StrCat(source.name(), ": record '", byteorder->name,
                                                     "' says '", absl::CHexEscape(trimmed),
                                                     "', expected 'little' or 'big'"));
    }
  }
  for (const std::string& name : {prefix + "version", prefix + ".data/version"}) {
    const ZipEntry* version = zip.Find(name);
    if (version == nullptr) continue;
    ASSIGN_OR_RETURN(std::string text, zip.ReadToString(*version, 64));
    int64_t number;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &number)) {
      return absl::InvalidArgumentError(absl::StrCat(source.name(), ": record '", name,
                                                     "' is not a version number: '",
                                                     absl::CHexEscape(text), "'"));
    }
    if (number > kNewestKnownZipVersion) {
      file.warnings.push_back(absl::StrCat(source.name(), ": format version ", number,
                                           " is newer than ", kNewestKnownZipVersion,
                                           ", the newest this reader knows"));
    }
    break;
  }
  ASSIGN_OR_RETURN(std::string pickle_bytes, zip.ReadToString(*pickle, kMaxPickleBytes));
  const std::string pickle_name = absl::StrCat(source.name(), ": ", pickle->name);
  std::unique_ptr<ByteSource> pickle_source = MemorySource(pickle_bytes, pickle_name);
  ZipHooks hooks(zip, prefix, big_endian);
  PickleOptions options;
  options.name = pickle_name;
  ASSIGN_OR_RETURN(PickleResult result, ReadPickle(*pickle_source, 0, options, &hooks));
  file.root = std::move(result.value);
  for (std::string& warning : result.warnings) file.warnings.push_back(std::move(warning));
  return file;
}

// --- torch_legacy -----------------------------------------------------------------------------

class LegacyHooks : public TorchHooks {
 public:
  explicit LegacyHooks(const ByteSource& source) : source_(source) {}

  // ('storage', type, root_key, location, numel, view_metadata) or
  // ('module', class, source_file, source).
  absl::StatusOr<PersistentObject> PersistentLoad(const Value& pid) override {
    if (!pid.is_tuple() || pid.items().size() < 2) {
      return absl::InvalidArgumentError("expected ('storage', ...) or ('module', ...)");
    }
    const std::vector<Value>& a = pid.items();
    ASSIGN_OR_RETURN(std::string kind, AsText(a[0], "persistent id kind"));
    PersistentObject object;
    if (kind == "module") {
      std::optional<std::string> name = GlobalName(a[1]);
      if (!name.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("module persistent id without a class: ", a[1].DebugString()));
      }
      object.global_name = *name;
      return object;
    }
    if (kind != "storage" || a.size() < 5) {
      return absl::InvalidArgumentError(absl::StrCat("unknown persistent id kind '", kind, "'"));
    }
    ASSIGN_OR_RETURN(DType dtype, StorageDType(a[1]));
    ASSIGN_OR_RETURN(std::string key, AsText(a[2], "storage key"));
    ASSIGN_OR_RETURN(std::string location, AsText(a[3], "storage location"));
    ASSIGN_OR_RETURN(int64_t numel, AsInt(a[4], "storage size"));
    auto it = roots_.find(key);
    if (it == roots_.end()) {
      ASSIGN_OR_RETURN(int64_t nbytes, ByteLengthOf(dtype, {numel}));
      // Every storage's bytes follow the pickles in the same file.
      if (static_cast<uint64_t>(nbytes) > source_.size() - std::min(allocated_, source_.size())) {
        return absl::DataLossError(absl::StrCat("storage '", key, "' claims ", nbytes,
                                                " bytes; the file has only ", source_.size(),
                                                " in all"));
      }
      allocated_ += nbytes;
      ASSIGN_OR_RETURN(c10::Storage storage, AllocateStorage(nbytes));
      ASSIGN_OR_RETURN(Value value, StorageValue(storage, dtype, numel, location, warnings()));
      it = roots_.emplace(key, Root{storage, dtype, numel, std::move(value), false}).first;
      order_.push_back(key);
    } else if (it->second.dtype != dtype || it->second.numel != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage '", key, "' is referenced as ", numel, " x ", DTypeName(dtype),
                       " and earlier as ", it->second.numel, " x ", DTypeName(it->second.dtype)));
    }
    const Root& root = it->second;
    if (a.size() > 5 && !a[5].is_none()) {
      // (view_key, offset, size) in elements: a slice of the root storage (PyTorch < 0.4).
      const Value& view = a[5];
      if (!view.is_tuple() || view.items().size() != 3) {
        return absl::InvalidArgumentError(absl::StrCat(
            "view metadata: expected (key, offset, size), found ", view.DebugString()));
      }
      ASSIGN_OR_RETURN(std::string view_key, AsText(view.items()[0], "view key"));
      ASSIGN_OR_RETURN(int64_t offset, AsInt(view.items()[1], "view offset"));
      ASSIGN_OR_RETURN(int64_t size, AsInt(view.items()[2], "view size"));
      auto view_it = views_.find(view_key);
      if (view_it != views_.end()) {
        object.value = view_it->second;
        return object;
      }
      if (offset < 0 || size < 0 || offset > root.numel || size > root.numel - offset ||
          !root.value.is_tensor()) {
        return absl::InvalidArgumentError(absl::StrCat("storage view [", offset, ", +", size,
                                                       ") outside storage '", key, "' of ",
                                                       root.numel, " elements"));
      }
      ASSIGN_OR_RETURN(at::Tensor narrowed, CatchTorchErrors([&] {
                         return root.value.tensor().narrow(0, offset, size);
                       }));
      object.value = Value::Tensor(std::move(narrowed), location);
      views_.emplace(view_key, object.value);
      return object;
    }
    object.value = root.value;
    return object;
  }

  // Reads the storage data section that starts at `offset`, in the order of `keys`; returns the
  // offset after it.
  absl::StatusOr<uint64_t> ReadStorages(const std::vector<std::string>& keys, uint64_t offset,
                                        bool big_endian) {
    for (const std::string& key : keys) {
      auto it = roots_.find(key);
      if (it == roots_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(source_.name(), ": storage '", key,
                                                       "' has data at offset ", offset,
                                                       " but no tensor refers to it"));
      }
      Root& root = it->second;
      if (root.filled) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_.name(), ": storage '", key, "' is listed twice"));
      }
      char count_bytes[8];
      RETURN_IF_ERROR(source_.ReadAt(offset, absl::MakeSpan(count_bytes, 8)));
      if (big_endian) std::reverse(count_bytes, count_bytes + 8);
      int64_t count;
      std::memcpy(&count, count_bytes, 8);
      if (count != root.numel) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_.name(), ": offset ", offset, ": storage '", key, "' has ", count,
                         " elements in the data section but the pickle expects ", root.numel));
      }
      const uint64_t nbytes = static_cast<uint64_t>(root.numel) * ElementSize(root.dtype);
      if (nbytes > 0) {
        RETURN_IF_ERROR(
            source_.ReadAt(offset + 8, absl::MakeSpan(StorageBytes(root.storage), nbytes)));
        if (big_endian) ByteSwap(StorageBytes(root.storage), nbytes, root.dtype);
      }
      root.filled = true;
      offset += 8 + nbytes;
    }
    for (const std::string& key : order_) {
      if (!roots_.at(key).filled) {
        return absl::InvalidArgumentError(absl::StrCat(source_.name(), ": storage '", key,
                                                       "' is used by the pickle but has no data"));
      }
    }
    return offset;
  }

 private:
  struct Root {
    c10::Storage storage;
    DType dtype;
    int64_t numel;
    Value value;
    bool filled;
  };
  const ByteSource& source_;
  uint64_t allocated_ = 0;
  absl::flat_hash_map<std::string, Root> roots_;
  std::vector<std::string> order_;
  absl::flat_hash_map<std::string, Value> views_;
};

absl::Status NotATorchFile(const ByteSource& source, absl::string_view head,
                           absl::string_view detail) {
  std::string hint;
  if (head.size() >= 9 && head[8] == '{') {
    hint = " (it looks like a safetensors file)";
  } else if (absl::StartsWith(head, "\x93NUMPY")) {
    hint = " (it looks like a numpy .npy file)";
  } else if (absl::StartsWith(head, "\x89HDF")) {
    hint = " (it looks like an HDF5 file)";
  } else if (absl::StartsWith(head, "GGUF")) {
    hint = " (it looks like a GGUF file)";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source.name(), " is not a torch.save file", hint,
      ": it is neither a zip archive nor a legacy torch.save pickle stream (first bytes: '",
      absl::CHexEscape(head.substr(0, 16)), "')", detail.empty() ? "" : "; ", detail));
}

absl::StatusOr<TorchFile> ReadLegacyCheckpoint(const ByteSource& source, absl::string_view head) {
  PickleOptions options;
  options.name = absl::StrCat(source.name(), ": legacy magic-number pickle");
  absl::StatusOr<PickleResult> magic = ReadPickle(source, 0, options, nullptr);
  if (!magic.ok()) return NotATorchFile(source, head, magic.status().message());
  const Value& number = magic->value;
  const bool is_magic = number.is_opaque() && number.opaque_class_name() == "builtins.int" &&
                        number.opaque_args().is_tuple() &&
                        number.opaque_args().items().size() == 1 &&
                        number.opaque_args().items()[0].is_string() &&
                        number.opaque_args().items()[0].string_value() == kLegacyMagic;
  if (!is_magic) {
    return NotATorchFile(source, head,
                         absl::StrCat("its first pickle is ", number.DebugString().substr(0, 80),
                                      ", not torch.save's magic number"));
  }
  options.name = absl::StrCat(source.name(), ": legacy protocol-version pickle");
  ASSIGN_OR_RETURN(PickleResult protocol, ReadPickle(source, magic->end_offset, options, nullptr));
  if (!protocol.value.is_int() || protocol.value.int_value() != kLegacyProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(source.name(), ": legacy protocol version ",
                                                   protocol.value.DebugString(), ", expected ",
                                                   kLegacyProtocolVersion));
  }
  options.name = absl::StrCat(source.name(), ": legacy sys_info pickle");
  ASSIGN_OR_RETURN(PickleResult sys_info,
                   ReadPickle(source, protocol.end_offset, options, nullptr));
  bool big_endian = false;
  if (sys_info.value.is_dict()) {
    if (const Value* little = sys_info.value.Find("little_endian")) {
      big_endian = little->is_bool() && !little->bool_value();
    }
  }
  TorchFile file;
  file.format = "torch_legacy";
  LegacyHooks hooks(source);
  options.name =
      absl::StrCat(source.name(), ": legacy main pickle at offset ", sys_info.end_offset);
  ASSIGN_OR_RETURN(PickleResult main, ReadPickle(source, sys_info.end_offset, options, &hooks));
  options.name =
      absl::StrCat(source.name(), ": legacy storage-key pickle at offset ", main.end_offset);
  ASSIGN_OR_RETURN(PickleResult keys_pickle, ReadPickle(source, main.end_offset, options, nullptr));
  if (!keys_pickle.value.is_sequence()) {
    return absl::InvalidArgumentError(absl::StrCat(options.name,
                                                   ": expected a list of keys, found ",
                                                   keys_pickle.value.DebugString().substr(0, 80)));
  }
  std::vector<std::string> keys;
  for (const Value& key : keys_pickle.value.items()) {
    ASSIGN_OR_RETURN(std::string text, AsText(key, options.name));
    keys.push_back(std::move(text));
  }
  ASSIGN_OR_RETURN(uint64_t end, hooks.ReadStorages(keys, keys_pickle.end_offset, big_endian));
  if (end != source.size()) {
    file.warnings.push_back(absl::StrCat(source.name(), ": ", source.size() - end,
                                         " bytes after the last storage ignored"));
  }
  file.root = std::move(main.value);
  for (std::string& warning : main.warnings) file.warnings.push_back(std::move(warning));
  return file;
}

bool IsTar(absl::string_view head) { return head.size() >= 262 && head.substr(257, 5) == "ustar"; }

}  // namespace

absl::StatusOr<TorchFile> ReadTorchSource(const ByteSource& source) {
  ASSIGN_OR_RETURN(std::string head, source.ReadString(0, std::min<uint64_t>(source.size(), 512)));
  if (ZipReader::HasZipMagic(head)) return ReadZipCheckpoint(source);
  if (IsTar(head)) {
    return absl::UnimplementedError(
        absl::StrCat(source.name(),
                     " is a tar archive: the torch.save format of PyTorch before 0.4, which "
                     "ckpt does not read; load it with an old PyTorch and save it again"));
  }
  if (head.empty()) return NotATorchFile(source, head, "the file is empty");
  return ReadLegacyCheckpoint(source, head);
}

absl::StatusOr<TorchFile> ReadTorchFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, OpenFileSource(path));
  return ReadTorchSource(*source);
}

absl::StatusOr<TorchFile> ReadTorchBytes(absl::string_view bytes, absl::string_view name) {
  std::unique_ptr<ByteSource> source = MemorySource(bytes, std::string(name));
  return ReadTorchSource(*source);
}

}  // namespace ckpt
