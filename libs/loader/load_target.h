#ifndef CKPT_LIBS_LOADER_LOAD_TARGET_H_
#define CKPT_LIBS_LOADER_LOAD_TARGET_H_

// LoadTarget: what a consumer wants a stored version to look like when it arrives — the device
// (the C++ map_location: every tensor goes there, wherever the producer had it), the dtype policy,
// the key layout, and which subset of the model's tensors.
//
// Example:
//   LoadTarget target;
//   target.device = *ParseDevice("cuda:0");
//   target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
//   target.keys = KeyPolicy::AddPrefix("module.");   // a DDP-wrapped consumer
//   target.include_prefixes = {"encoder."};

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/tensor/device.h"
#include "libs/tensor/key_normalization.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {

struct LoadTarget {
  // Where every loaded tensor goes. Default: the CPU.
  DeviceSpec device = DeviceSpec::Cpu();
  // Floating tensors keep their dtype or are cast; integer and bool tensors are never cast.
  DTypePolicy dtype = DTypePolicy::Keep();
  // Keys of the returned state dict. Default: canonical (no wrapper prefix).
  KeyPolicy keys = KeyPolicy::Canonical();
  // Subset, by canonical key. When both are empty every tensor is loaded; otherwise a tensor is
  // loaded when its key is in include_keys or starts with one of include_prefixes.
  std::vector<std::string> include_keys;
  std::vector<std::string> include_prefixes;
  // Whether optimizer / scheduler state, and the bundle's other entries (Manifest.extra_state),
  // are loaded as well.
  bool include_optimizer = false;
  bool include_scheduler = false;
  bool include_extra = false;
};

// The LoadTarget a v1::LoadTarget message describes: an empty device is the CPU,
// cast_floating_to UNSPECIFIED keeps dtypes, KEY_POLICY_ADD_PREFIX with an empty key_prefix is
// "module.". INVALID_ARGUMENT for an unparsable device, a cast to a non-floating dtype, or an
// unknown key policy. The device is not checked against this process here (see Load).
absl::StatusOr<LoadTarget> LoadTargetFromProto(const v1::LoadTarget& proto);

// The message describing `target` (what a client sends); LoadTargetFromProto inverts it.
v1::LoadTarget LoadTargetToProto(const LoadTarget& target);

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_LOAD_TARGET_H_
