#include "libs/format/internal/torch_hooks.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <utility>

#include "ATen/ops/_empty_affine_quantized.h"
#include "ATen/ops/_empty_per_channel_affine_quantized.h"
#include "ATen/ops/empty.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "c10/core/CPUAllocator.h"
#include "c10/util/Half.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt::torch_reader_internal {
namespace {

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

bool IsEmptyContainer(const Value& value) {
  if (value.is_none()) return true;
  if (value.is_dict()) return value.entries().empty();
  if (value.is_sequence()) return value.items().empty();
  return false;
}

std::string Shape(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
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

absl::Status NeedArgs(const std::vector<Value>& a, size_t n) {
  if (a.size() < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected at least ", n, " arguments, found ", a.size()));
  }
  return absl::OkStatus();
}

}  // namespace

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

std::optional<std::string> GlobalName(const Value& value) {
  if (value.is_opaque() && value.opaque_args().is_none() && value.opaque_state().is_none()) {
    return value.opaque_class_name();
  }
  return std::nullopt;
}

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

void ByteSwap(char* data, uint64_t nbytes, DType dtype) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  const int unit = info.is_complex ? info.element_size / 2 : info.element_size;
  if (unit <= 1) return;
  for (uint64_t i = 0; i + unit <= nbytes; i += unit) std::reverse(data + i, data + i + unit);
}

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

bool TorchHooks::HandlesGlobal(absl::string_view global) const {
  static constexpr absl::string_view kHandled[] = {
      "torch._utils._rebuild_tensor",
      "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_tensor_v3",
      "torch._utils._rebuild_parameter",
      "torch._utils._rebuild_parameter_with_state",
      "torch._utils._rebuild_qtensor",
      "torch._utils._rebuild_sparse_tensor",
      "torch._utils._rebuild_sparse_csr_tensor",
      "torch.serialization._get_layout",
      "torch._tensor._rebuild_from_type",
      "torch._tensor._rebuild_from_type_v2",
      "torch.Size",
      "torch.device",
      "numpy.core.multiarray.scalar",
      "numpy._core.multiarray.scalar",
  };
  return std::find(std::begin(kHandled), std::end(kHandled), global) != std::end(kHandled);
}

absl::StatusOr<std::optional<Value>> TorchHooks::CallGlobal(absl::string_view global,
                                                            const Value& args) {
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
  if (global == "torch._utils._rebuild_sparse_tensor" ||
      global == "torch._utils._rebuild_sparse_csr_tensor") {
    RETURN_IF_ERROR(NeedArgs(a, 2));
    return RebuildSparse(a[0], a[1]);
  }
  if (global == "torch.serialization._get_layout") {
    // _get_layout("torch.sparse_coo"): the layout, as a reference to the torch global it names.
    RETURN_IF_ERROR(NeedArgs(a, 1));
    ASSIGN_OR_RETURN(std::string name, AsText(a[0], "torch.serialization._get_layout"));
    return Value::Opaque(std::move(name), Value::None(), Value::None());
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

absl::StatusOr<std::optional<Value>> TorchHooks::RebuildTensor(
    absl::string_view global, const Value& storage_value, const Value& offset_value,
    const Value& size_value, const Value& stride_value, bool requires_grad,
    std::optional<DType> dtype_override) {
  std::optional<StorageSpan> span = AsStorage(storage_value);
  if (!span.has_value()) {
    Warn(absl::StrCat(
        global, " of a storage ckpt cannot materialize (",
        storage_value.is_opaque() ? storage_value.opaque_class_name() : storage_value.DebugString(),
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

at::Tensor TorchHooks::SetRequiresGrad(at::Tensor tensor) {
  if (!at::isFloatingType(tensor.scalar_type()) && !at::isComplexType(tensor.scalar_type())) {
    Warn(absl::StrCat("requires_grad dropped from a ", c10::toString(tensor.scalar_type()),
                      " tensor (only float and complex tensors can require grad)"));
    return tensor;
  }
  tensor.requires_grad_(true);
  return tensor;
}

absl::StatusOr<std::optional<Value>> TorchHooks::Parameter(const Value& data, bool requires_grad) {
  // A new tensor over the same storage, as nn.Parameter(data) is.
  at::Tensor tensor = data.tensor().detach();
  if (requires_grad) tensor = SetRequiresGrad(std::move(tensor));
  return Value::Tensor(std::move(tensor), data.tensor_original_device());
}

absl::StatusOr<std::optional<Value>> TorchHooks::RebuildQuantized(const std::vector<Value>& a) {
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

absl::StatusOr<std::optional<Value>> TorchHooks::RebuildSparse(const Value& layout_value,
                                                               const Value& data) {
  // COO: (indices, values, size[, is_coalesced]); the compressed layouts: (compressed indices,
  // plain indices, values, size). torch 1.13 pickles CSR with _rebuild_sparse_csr_tensor, 2.x
  // every layout with _rebuild_sparse_tensor; the tuple is the same.
  const std::string layout_name =
      GlobalName(layout_value).value_or(layout_value.DebugString().substr(0, 80));
  absl::StatusOr<c10::Layout> layout = SparseLayoutFromName(layout_name);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sparse tensor of layout ", layout_name, ", which torch does not have"));
  }
  const size_t part_count = *layout == c10::kSparse ? 2 : 3;
  if (!data.is_tuple() || data.items().size() < part_count + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", layout_name, " tensor: expected its parts and size, found ",
        data.DebugString().substr(0, 120)));
  }
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < part_count; ++i) {
    const Value& part = data.items()[i];
    if (!part.is_tensor()) {  // a part of a dtype kept as opaque data: keep the whole so.
      Warn(absl::StrCat("a ", layout_name, " tensor whose part ", i,
                        " ckpt cannot materialize is kept as opaque data"));
      return std::nullopt;
    }
    parts.push_back(part.tensor());
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> size, AsInts(data.items()[part_count], "size"));
  const bool coalesced = *layout == c10::kSparse && data.items().size() > 3 &&
                         AsBool(data.items()[3]);
  absl::StatusOr<at::Tensor> tensor = MakeSparseTensor(*layout, parts, size, coalesced);
  if (!tensor.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", layout_name, " tensor: ", tensor.status().message()));
  }
  return Value::Tensor(*std::move(tensor), data.items()[part_count - 1].tensor_original_device());
}

absl::Status TorchHooks::RebuildSetStateTensors(Value& root) {
  std::vector<Value*> pending = {&root};  // iterative: the reader bounds depth, not the stack.
  while (!pending.empty()) {
    Value& value = *pending.back();
    pending.pop_back();
    if (value.is_dict()) {
      for (Value::Entry& entry : value.mutable_entries()) pending.push_back(&entry.second);
      continue;
    }
    if (value.is_sequence()) {
      for (Value& item : value.mutable_items()) pending.push_back(&item);
      continue;
    }
    if (!value.is_opaque()) continue;
    const std::string& name = value.opaque_class_name();
    const bool tensor_class =
        absl::StartsWith(name, "torch.") && absl::EndsWith(name, "Tensor") &&
        name.find('.', 6) == std::string::npos;
    const Value& args = value.opaque_args();
    const Value& state = value.opaque_state();
    if (!tensor_class || !(args.is_none() || (args.is_tuple() && args.items().empty())) ||
        !state.is_tuple()) {
      continue;
    }
    const std::vector<Value>& s = state.items();
    if (s.size() == 4) {  // a Tensor: set_(storage, offset, size, stride).
      ASSIGN_OR_RETURN(std::optional<Value> rebuilt,
                       RebuildTensor(absl::StrCat(name, ".__setstate__"), s[0], s[1], s[2], s[3],
                                     /*requires_grad=*/false, std::nullopt));
      if (rebuilt.has_value()) value = *std::move(rebuilt);
    } else if (s.size() == 5 && s[0].is_tensor()) {  // a Variable: (data, _, _, requires_grad, _)
      const bool requires_grad = AsBool(s[3]);
      Value data = s[0];
      if (requires_grad) data.mutable_tensor() = SetRequiresGrad(data.tensor());
      value = std::move(data);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Value>> TorchHooks::NumpyScalar(const std::vector<Value>& a) {
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

}  // namespace ckpt::torch_reader_internal
