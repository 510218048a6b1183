#ifndef CKPT_LIBS_FORMAT_MODULE_STATE_H_
#define CKPT_LIBS_FORMAT_MODULE_STATE_H_

// From what torch.save wrote to what a checkpoint store keeps: the model's state dict, the
// optimizer and scheduler state, the training position, and everything else.
//
// StateDictFromModule recovers model.state_dict() from a whole pickled model (torch.save(model))
// without its Python classes: torch_reader keeps each nn.Module as Value::Opaque whose state is
// the module's __dict__, and this walks its `_parameters`, `_buffers` and `_modules` the way
// Module.state_dict() does: own parameters, then own buffers (skipping None entries and the
// names in `_non_persistent_buffers_set`), then each child under "<child name>." in order.
// Parameters come back detached (requires_grad false), as state_dict() returns them; tied
// parameters share storage. Not reproducible without the class's code, and so not done:
// state-dict hooks (`_state_dict_hooks`, reported as a warning) and `get_extra_state()`
// overrides.
//
// ExtractCheckpointBundle splits a loaded object into a CheckpointBundle. The model is, first
// match wins:
//   - the root itself, when it is a dict of tensors (a plain state dict) or a module object;
//   - else the value under the first of 'model', 'state_dict', 'model_state_dict',
//     'model_state', 'module', 'net', 'network', 'weights' that is (or, one or two levels
//     down, contains) a dict of tensors or a module object;
//   - else the first other str-keyed dict entry that contains one (two levels at most), never
//     looking inside an optimizer state dict (a dict with 'param_groups').
// The optimizer is the value under 'optimizer', 'optim', 'optimizer_state_dict',
// 'optimizer_state' or (PyTorch Lightning) 'optimizer_states'; the scheduler under 'scheduler',
// 'lr_scheduler', 'scheduler_state_dict' or 'lr_schedulers'; epoch under 'epoch'; step under
// 'step', 'global_step' or 'iteration'. Each is looked for in the root dict, then in the dict
// that holds the model. Model, optimizer and scheduler are taken out of `extra`, and where each
// sat is recorded in `layout`; everything else -- epoch and step included, which are only read --
// stays in `extra` as saved, so WriteBundle (bundle.h) can give the producer's object back.
//
// Example:
//   ASSIGN_OR_RETURN(TorchFile file, ReadTorchFile(path));
//   ASSIGN_OR_RETURN(CheckpointBundle bundle, ExtractCheckpointBundle(file.root));
//   for (const StateDict::Entry& e : bundle.model) { ... }

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// True when `value` is a pickled torch.nn.Module: an Opaque whose state is a dict holding
// `_parameters`, `_buffers` and `_modules`.
bool IsModuleObject(const Value& value);

// "a meta tensor: shape only, no bytes" (or "a sparse tensor of a dtype LibTorch 1.13 cannot
// hold") for a value the reader kept as the torch call that would rebuild such a tensor, which
// ckpt cannot store; "" for anything else.
std::string UnstoredTensorKind(const Value& value);

// A root that holds no model state dict, as inspect and convert describe it: what it is ("a
// list of 2 items", "a tensor", "a dict of 3 entries", "a plain value") and the values at its
// top level that ckpt does not store (path -> UnstoredTensorKind; "<root>" for the root itself).
struct RootDescription {
  std::string kind;
  std::vector<std::pair<std::string, std::string>> unstored;
};
RootDescription DescribeRoot(const Value& root);

// True for a non-empty dict with str keys whose values are all tensors (a state dict).
bool IsTensorDict(const Value& value);

// What `module`.state_dict() returns in Python. INVALID_ARGUMENT (naming the key) when the
// object is not a module, or a parameter, buffer or child is something else than a tensor /
// module / None. Hooks the walk cannot run are appended to `warnings` when given.
absl::StatusOr<StateDict> StateDictFromModule(const Value& module,
                                              std::vector<std::string>* warnings = nullptr);

// A dict of tensors as a StateDict (same order, original devices kept). INVALID_ARGUMENT when a
// value is not a tensor or a key is not a non-empty str.
absl::StatusOr<StateDict> StateDictFromTensorDict(const Value& dict);

struct CheckpointBundle {
  // The model's state dict.
  StateDict model;
  // Where the model was: dict keys joined by '/' ("model", "checkpoint/state_dict"); empty when
  // it was the root.
  std::string model_key_path;
  // The optimizer's / scheduler's state dict (or whatever those keys hold), as read.
  std::optional<Value> optimizer;
  std::optional<Value> scheduler;
  // -1 when absent.
  int64_t epoch = -1;
  int64_t step = -1;
  // The root dict without model, optimizer and scheduler; None when the root was not a dict.
  Value extra;
  // Where model, optimizer and scheduler sat in the root (for a bare state dict or module: the
  // model alone, at the root). Empty when the model was named by the caller (ReadCheckpointFile's
  // model_key) rather than found.
  v1::BundleLayout layout;
  // E.g. module hooks that were not run.
  std::vector<std::string> warnings;
};

// NOT_FOUND (describing the root's keys) when no model state dict or module is found;
// INVALID_ARGUMENT from StateDictFromModule / StateDictFromTensorDict.
absl::StatusOr<CheckpointBundle> ExtractCheckpointBundle(const Value& root);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_MODULE_STATE_H_
