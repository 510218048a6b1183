#ifndef CKPT_LIBS_LOADER_LOADER_H_
#define CKPT_LIBS_LOADER_LOADER_H_

// The loader: serves a stored version to any device, dtype, key layout and subset, into a plain
// state dict (Load) or straight into a LibTorch module (LoadInto), and checks beforehand whether
// a consumer's keys and shapes fit (Preflight).
//
// Memory stays bounded: the subset and the key policy are worked out from the manifest before any
// bytes move; then tensors are read one at a time, each streamed chunk by chunk straight into a
// CPU tensor allocated from the manifest's dtype and shape (ReadTensor, checkpoint_contents.h),
// and only then cast / placed. Beyond the result, at most one tensor (plus its cast or device
// copy) is held at a time.
//
// Thread-safety: the functions keep no state; concurrent calls on one store are fine (the store is
// thread-safe). LoadInto writes the module's tensors: one caller per module at a time.
//
// Example:
//   LoadTarget target;
//   target.keys = KeyPolicy::AddPrefix("module.");            // DDP-style consumer
//   target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
//   ASSIGN_OR_RETURN(LoadedState state, Load(store, *ParseVersionRef("resnet@best"), target));
//
//   ASSIGN_OR_RETURN(PreflightReport report,
//                    Preflight(store, ref, ExpectedTensorsOf(net)));   // no bytes read
//   ASSIGN_OR_RETURN(CompatibilityReport loaded, LoadInto(store, ref, net, {}));  // strict

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/loader/load_target.h"
#include "libs/store/checkpoint_store.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/key_normalization.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"
#include "proto/ckpt/v1/types.pb.h"

// Only references to modules here: the definition (torch/nn/module.h pulls all of ATen's
// operators, seconds of compile time in every includer) is included where a module is used.
namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace ckpt {

// What Load returns.
struct LoadedState {
  // The selected tensors under the target's key policy, on the target device, with the dtype
  // policy applied; entries keep the producer's original device.
  StateDict model;
  // Present only when asked for and the version holds them; tensors on the target device,
  // dtypes kept.
  std::optional<Value> optimizer;
  std::optional<Value> scheduler;
  // The version's manifest as stored (canonical keys, version number and aliases filled).
  v1::Manifest manifest;
};

// Loads `ref` adapted to `target`. Errors:
//   FAILED_PRECONDITION  the target device is unavailable in this process (e.g. "cuda" on a
//                        CPU-only build) — checked before the store is touched; also a dtype
//                        LibTorch cannot hold.
//   INVALID_ARGUMENT     a subset naming keys (or prefixes matching no key) the version lacks,
//                        all named; a target device LibTorch does not know.
//   NOT_FOUND            `ref` names no version.
//   DATA_LOSS            a chunk fails its checksum (from the store).
absl::StatusOr<LoadedState> Load(CheckpointStore& store, const v1::VersionRef& ref,
                                 const LoadTarget& target);

// The same from an open reader (e.g. one reading through a ChunkCache): errors as above, but the
// device is checked only after the manifest is planned.
absl::StatusOr<LoadedState> Load(const VersionReader& reader, const LoadTarget& target);

// A value tree of `manifest` (its optimizer_state, scheduler_state or extra_state) whose tensor
// references become what `make_tensor` returns for their stored metas. DATA_LOSS for a reference
// the manifest lacks; make_tensor's errors as they are.
absl::StatusOr<Value> ValueTreeFromManifest(
    const v1::Manifest& manifest, const v1::Value& tree,
    const std::function<absl::StatusOr<at::Tensor>(const v1::TensorMeta&)>& make_tensor);

// A value tree of `manifest` (its optimizer_state, scheduler_state or extra_state) with its
// tensors read from `reader` one at a time and put on `device`, dtypes kept. DATA_LOSS for a
// tensor reference the manifest lacks, and as ReadTensor (checkpoint_contents.h).
absl::StatusOr<Value> LoadValueTree(const VersionReader& reader, const v1::Manifest& manifest,
                                    const v1::Value& tree, const DeviceSpec& device);

// One model tensor a load selects: its key under the target's key policy, and its stored meta
// (pointing into the manifest given to PlanLoad).
struct PlannedTensor {
  std::string key;
  const v1::TensorMeta* meta = nullptr;
};

// The model tensors `target` selects from `manifest`, in manifest order, named under
// target.keys; reads no bytes and ignores target.device. INVALID_ARGUMENT as for Load's subset,
// or when the key policy maps two tensors to one key. What Load and the loader service's
// streaming Load and Export use, so that all three select and name tensors alike.
absl::StatusOr<std::vector<PlannedTensor>> PlanLoad(const v1::Manifest& manifest,
                                                    const LoadTarget& target);

// One tensor whose shape differs between checkpoint and consumer.
struct ShapeMismatch {
  std::string key;  // the consumer's key.
  std::vector<int64_t> checkpoint_shape;
  std::vector<int64_t> expected_shape;
};

// How a checkpoint's keys and shapes compare with a consumer's, keys as the consumer names them.
struct CompatibilityReport {
  std::vector<std::string> missing_keys;     // the consumer has them, the checkpoint does not.
  std::vector<std::string> unexpected_keys;  // the checkpoint has them, the consumer does not.
  std::vector<ShapeMismatch> shape_mismatches;
  // Keys whose values were copied (LoadInto only).
  std::vector<std::string> loaded_keys;

  bool compatible() const {
    return missing_keys.empty() && unexpected_keys.empty() && shape_mismatches.empty();
  }
  // "missing: [a, b]; unexpected: [c]; shape mismatch: fc.weight: [10, 512] in checkpoint,
  // [1000, 512] in module"; "compatible" when there is nothing to report.
  std::string ToString() const;
};

struct LoadIntoOptions {
  // As PyTorch's load_state_dict(strict=...): when true, any missing key, unexpected key or shape
  // mismatch fails the whole load before a byte is read. When false the matching tensors are
  // loaded and the rest is only reported.
  bool strict = true;
  // Applied to each checkpoint tensor before it is copied into the module's tensor; the copy
  // itself always lands in that tensor's own dtype and device.
  DTypePolicy dtype = DTypePolicy::Keep();
  // How the module names the checkpoint's keys (AddPrefix("module.") for a DDP-style module).
  KeyPolicy keys = KeyPolicy::Canonical();
};

// Copies `ref`'s model tensors in place (no autograd) into `module`'s named_parameters() and
// named_buffers(), each onto that tensor's own device and dtype. Returns the report (loaded_keys
// filled). Errors: INVALID_ARGUMENT when options.strict and the report is not compatible, listing
// every missing key, unexpected key and shape mismatch in one message; NOT_FOUND, DATA_LOSS as
// for Load.
absl::StatusOr<CompatibilityReport> LoadInto(CheckpointStore& store, const v1::VersionRef& ref,
                                             torch::nn::Module& module,
                                             const LoadIntoOptions& options = {});

// What a consumer expects one tensor to be.
struct ExpectedTensor {
  std::string key;
  std::vector<int64_t> shape;
  // kUnspecified: any. Otherwise a differing dtype (after the target's cast) is reported in
  // PreflightReport::dtype_differences; loading casts, so it is not an incompatibility.
  DType dtype = DType::kUnspecified;
};

// Keys and shapes of `module`'s named_parameters() and named_buffers().
std::vector<ExpectedTensor> ExpectedTensorsOf(const torch::nn::Module& module);

struct PreflightReport {
  // Under the key policy Preflight was given.
  CompatibilityReport report;
  // A key policy under which every expected key matches a checkpoint key and vice versa (shapes
  // aside). Tried in this order, first fit wins: the given one, canonical, AddPrefix of each dotted
  // prefix every expected key shares ("module.", then "module._orig_mod.", ...), original.
  // nullopt when none fits.
  std::optional<KeyPolicy> suggested_keys;
  // "fc.weight: bfloat16 in checkpoint, float32 expected" for expected tensors that declare a
  // dtype other than the one the load would give (informational: loading casts).
  std::vector<std::string> dtype_differences;
  // One human-readable paragraph.
  std::string summary;
};

// The manifest a stream of `planned` (from PlanLoad of `stored` with `target`) starts with: what
// the consumer receives, as it receives it -- tensors renamed and, where `target` casts, with the
// cast dtype and byte length and neither content hash nor chunk refs (both named the stored
// bytes); tensors sent as stored keep their chunk refs, which the consumer checks their bytes
// against (proto/ckpt/v1/loader.proto LoadResponse); optimizer / scheduler state (as stored)
// only when asked for; no extra state. INVALID_ARGUMENT for a shape whose cast byte length
// overflows.
absl::StatusOr<v1::Manifest> AdaptedManifest(const v1::Manifest& stored,
                                             const std::vector<PlannedTensor>& planned,
                                             const LoadTarget& target);

// Compares `manifest`'s model tensors, named under `keys`, with `expected`. Reads no bytes.
PreflightReport Preflight(const v1::Manifest& manifest, const std::vector<ExpectedTensor>& expected,
                          const KeyPolicy& keys = KeyPolicy::Canonical());

// The same for the version `ref` names (its manifest only). NOT_FOUND for a missing version.
absl::StatusOr<PreflightReport> Preflight(CheckpointStore& store, const v1::VersionRef& ref,
                                          const std::vector<ExpectedTensor>& expected,
                                          const KeyPolicy& keys = KeyPolicy::Canonical());

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_LOADER_H_
