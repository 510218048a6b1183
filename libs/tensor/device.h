#ifndef CKPT_LIBS_TENSOR_DEVICE_H_
#define CKPT_LIBS_TENSOR_DEVICE_H_

// Devices as checkpoints name them, and the C++ side of torch.load's map_location.
//
// A checkpoint records where each tensor lived ("cuda:1", "mps", "xla:0"); that device need not
// exist, or be known to this build, when the checkpoint is read. Only the *target* device is
// ever resolved against the running LibTorch.
//
// Example:
//   DeviceMap map = DeviceMap::AllTo(DeviceSpec::Cpu());  // map_location="cpu"
//   map.Map(*ParseDevice("cuda:1"), *ParseDevice("cuda:0"));  // map_location={"cuda:1": "cuda:0"}
//   DeviceSpec target = map.Resolve(*ParseDevice(meta.original_device()));
//   ASSIGN_OR_RETURN(at::Tensor placed, PlaceTensor(tensor, target, DTypePolicy::Keep()));

#include <map>
#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/Device.h"
#include "libs/tensor/dtype.h"

namespace ckpt {

// A device name: a type ("cpu", "cuda", "mps", ...) and an optional index.
struct DeviceSpec {
  std::string type;
  int index = -1;  // -1: no index ("cuda" means the current CUDA device).

  static DeviceSpec Cpu() { return DeviceSpec{"cpu", -1}; }
  std::string ToString() const;  // "cuda:1", "cpu".
  friend bool operator==(const DeviceSpec& a, const DeviceSpec& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator<(const DeviceSpec& a, const DeviceSpec& b) {
    return a.type != b.type ? a.type < b.type : a.index < b.index;
  }
};

// Parses "cpu", "cuda", "cuda:1", "mps", "xla:0", "privateuseone:3", ... The type is any
// lowercase identifier (PyTorch's list grows; a checkpoint may name one this build lacks).
// INVALID_ARGUMENT for empty text, a bad type or a bad index ("cuda:-1", "cuda:x").
absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text);

// map_location: where a tensor found on a source device goes.
class DeviceMap {
 public:
  // Every tensor to `target` (map_location=target).
  static DeviceMap AllTo(DeviceSpec target);
  // Tensors stay where they were, except for explicit mappings.
  static DeviceMap Identity();

  // Tensors from `source` go to `target` (overrides the default for that device).
  void Map(DeviceSpec source, DeviceSpec target);

  DeviceSpec Resolve(const DeviceSpec& source) const;

 private:
  std::optional<DeviceSpec> default_target_;
  std::map<DeviceSpec, DeviceSpec> explicit_;
};

// LibTorch's device for `spec`, checked against this process: FAILED_PRECONDITION when the
// build lacks the backend (e.g. "cuda" on a CPU-only LibTorch) or the index is out of range;
// INVALID_ARGUMENT for a type LibTorch does not know.
absl::StatusOr<c10::Device> ResolveTorchDevice(const DeviceSpec& spec);

// Dtype conversion applied when loading: keep, or cast floating-point tensors to one dtype.
// Integer, bool, complex and quantized tensors are never cast.
class DTypePolicy {
 public:
  static DTypePolicy Keep() { return DTypePolicy(std::nullopt); }
  // INVALID_ARGUMENT unless `dtype` is float16, bfloat16, float32 or float64.
  static absl::StatusOr<DTypePolicy> CastFloatingTo(DType dtype);

  const std::optional<DType>& floating_target() const { return floating_target_; }
  // The dtype a tensor of `dtype` gets under this policy.
  DType Apply(DType dtype) const;

 private:
  explicit DTypePolicy(std::optional<DType> target) : floating_target_(target) {}
  std::optional<DType> floating_target_;
};

// `tensor` on `target` with `policy` applied; shares memory when nothing changes. Errors as for
// ResolveTorchDevice.
absl::StatusOr<at::Tensor> PlaceTensor(const at::Tensor& tensor, const DeviceSpec& target,
                                       const DTypePolicy& policy);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_DEVICE_H_
