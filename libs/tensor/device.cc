#include "libs/tensor/device.h"

#include <utility>

#include "ATen/Context.h"
#include "ATen/detail/CUDAHooksInterface.h"
#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"

namespace ckpt {

std::string DeviceSpec::ToString() const {
  return index < 0 ? type : absl::StrCat(type, ":", index);
}

absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text) {
  const absl::string_view original = text;
  text = absl::StripAsciiWhitespace(text);
  DeviceSpec spec;
  absl::string_view type = text;
  if (const size_t colon = text.find(':'); colon != absl::string_view::npos) {
    type = text.substr(0, colon);
    const absl::string_view index = text.substr(colon + 1);
    int parsed = -1;
    if (index.empty() || !absl::c_all_of(index, absl::ascii_isdigit) ||
        !absl::SimpleAtoi(index, &parsed) || parsed > 1 << 20) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad device '", original, "': the index after ':' must be a non-negative integer"));
    }
    spec.index = parsed;
  }
  const bool valid_type =
      !type.empty() && absl::ascii_islower(type[0]) && absl::c_all_of(type, [](char c) {
        return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_';
      });
  if (!valid_type) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad device '", original,
                     "': expected a type such as cpu, cuda or mps, optionally with "
                     "':INDEX' (e.g. cuda:1)"));
  }
  spec.type = std::string(type);
  return spec;
}

DeviceMap DeviceMap::AllTo(DeviceSpec target) {
  DeviceMap map;
  map.default_target_ = std::move(target);
  return map;
}

DeviceMap DeviceMap::Identity() { return DeviceMap(); }

void DeviceMap::Map(DeviceSpec source, DeviceSpec target) {
  explicit_[std::move(source)] = std::move(target);
}

DeviceSpec DeviceMap::Resolve(const DeviceSpec& source) const {
  if (auto it = explicit_.find(source); it != explicit_.end()) return it->second;
  return default_target_.value_or(source);
}

absl::StatusOr<c10::Device> ResolveTorchDevice(const DeviceSpec& spec) {
  ASSIGN_OR_RETURN(c10::Device device,
                   CatchTorchErrors([&] { return c10::Device(spec.ToString()); },
                                    absl::StatusCode::kInvalidArgument));
  switch (device.type()) {
    case c10::DeviceType::CPU:
    case c10::DeviceType::Meta:
      return device;
    case c10::DeviceType::CUDA: {
      if (!at::hasCUDA()) {
        return absl::FailedPreconditionError(
            absl::StrCat("target device ", spec.ToString(),
                         " needs CUDA, but this LibTorch has no CUDA support or no GPU is visible; "
                         "load to cpu, or build with --config=cuda on a GPU machine"));
      }
      const int count = at::detail::getCUDAHooks().getNumGPUs();
      if (device.has_index() && device.index() >= count) {
        return absl::FailedPreconditionError(absl::StrCat("target device ", spec.ToString(),
                                                          " does not exist: ", count,
                                                          " CUDA device(s) visible"));
      }
      return device;
    }
    case c10::DeviceType::MPS:
      if (at::hasMPS()) return device;
      break;
    default:
      break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("target device ", spec.ToString(), " is not available in this LibTorch build"));
}

absl::StatusOr<DTypePolicy> DTypePolicy::CastFloatingTo(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      return DTypePolicy(dtype);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot cast floating tensors to ", DTypeName(dtype),
                       "; expected float16, bfloat16, float32 or float64"));
  }
}

DType DTypePolicy::Apply(DType dtype) const {
  if (!floating_target_.has_value() || !GetDTypeInfo(dtype).is_floating_point) return dtype;
  return *floating_target_;
}

absl::StatusOr<at::Tensor> PlaceTensor(const at::Tensor& tensor, const DeviceSpec& target,
                                       const DTypePolicy& policy) {
  ASSIGN_OR_RETURN(c10::Device device, ResolveTorchDevice(target));
  ASSIGN_OR_RETURN(DType dtype, FromScalarType(tensor.scalar_type()));
  ASSIGN_OR_RETURN(c10::ScalarType scalar_type, ToScalarType(policy.Apply(dtype)));
  if (tensor.device() == device && tensor.scalar_type() == scalar_type) return tensor;
  return CatchTorchErrors([&] { return tensor.to(device, scalar_type); });
}

}  // namespace ckpt
