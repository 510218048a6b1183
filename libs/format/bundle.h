#ifndef CKPT_LIBS_FORMAT_BUNDLE_H_
#define CKPT_LIBS_FORMAT_BUNDLE_H_

// A training bundle put back together: the object a producer saved --
//   torch.save({"epoch": e, "model": model.state_dict(), "optimizer": opt.state_dict(),
//               "scheduler": sched.state_dict(), "best_acc": acc}, path)
// -- rebuilt from its parts and the BundleLayout that says where each part sat, so that Python
// resumes from the file exactly as from the one it saved. `ckpt convert` (from a file) and
// `ckpt export --bundle` / the loader's Export (from a stored version) both write bundles through
// here, so the two cannot differ.
//
// What is rebuilt is data only: every value keeps its Python type (int, float, str, bytes, None,
// bool, list, tuple, dict or OrderedDict, tensor) and every dict its order. Objects the
// restricted reader kept as opaque descriptions (a user class, the bound method OneCycleLR
// pickles in torch 1.13) are never turned back into code: AssembleBundle leaves them out and
// names each one, so the file loads with torch.load(weights_only=True)'s globals alone.
//
// Example:
//   ASSIGN_OR_RETURN(CheckpointFile file, ReadCheckpointFile("run.pt"));
//   BundleParts parts;
//   parts.model = StateDictToValue(file.bundle.model);
//   parts.optimizer = file.bundle.optimizer;
//   parts.scheduler = file.bundle.scheduler;
//   parts.extra = file.bundle.extra;
//   ASSIGN_OR_RETURN(AssembledBundle bundle, AssembleBundle(file.bundle.layout, parts));
//   ASSIGN_OR_RETURN(TorchWriteReport written, WriteTorchFile("out.pt", bundle.root));

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/tensor/value.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

struct BundleParts {
  // The model's state dict as a dict of tensors (StateDictToValue, or a plain Dict when the
  // layout says the producer saved a plain dict; AssembleBundle applies that flag itself).
  Value model;
  // Absent parts are left out of the result, whatever the layout says.
  std::optional<Value> optimizer;
  std::optional<Value> scheduler;
  // The saved dict without the parts (epoch, step and every other field); None when the saved
  // object was the state dict itself.
  Value extra;
};

struct AssembledBundle {
  // What to pass to WriteTorchFile.
  Value root;
  // What was left out and why, e.g. "scheduler/anneal_func: a builtins.getattr object (never
  // written back as code)"; paths join dict keys and sequence indices with '/'.
  std::vector<std::string> left_out;
};

// True when `layout` describes a bundle, i.e. the model sat inside a dict rather than being the
// saved object itself (or there is no layout at all).
bool IsBundleLayout(const v1::BundleLayout& layout);

// OK for a layout an export can follow (or none at all): known parts, each placed once, a model
// among them, a key on every path step, no negative position, and a part at the root only for a
// model placed alone. INVALID_ARGUMENT naming the problem otherwise. The store runs it on every
// commit (manifest_validation.h), AssembleBundle on every use.
absl::Status ValidateBundleLayout(const v1::BundleLayout& layout);

// Puts each present part at its placement, in order of position within its dict, and leaves out
// every opaque object: a dict entry holding one (directly, or inside a list or tuple) is removed
// and named. INVALID_ARGUMENT for a layout ValidateBundleLayout refuses or one without
// placements, and when a part belongs under a path that `extra` lacks or that is not a dict, or
// at a key `extra` already holds.
absl::StatusOr<AssembledBundle> AssembleBundle(const v1::BundleLayout& layout, BundleParts parts);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_BUNDLE_H_
