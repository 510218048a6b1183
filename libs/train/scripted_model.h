#ifndef CKPT_LIBS_TRAIN_SCRIPTED_MODEL_H_
#define CKPT_LIBS_TRAIN_SCRIPTED_MODEL_H_

// A model a team brings from Python: a TorchScript module (torch.jit.script(model).save(PATH), or
// torch.jit.trace) loaded with torch::jit::load and trained as a TrainableModel. Autograd runs
// through the TorchScript interpreter; the parameters are the module's own tensors, so DDP's
// gradient hooks, the optimizer and the checkpoints work on them directly.
//
// Keys. Weights() walks the module tree as Python's Module.state_dict() does (per module, from the
// root in pre-order: its own parameters, then its own buffers, then its children), so the keys,
// their order, shapes and dtypes are the original Python module's, num_batches_tracked included.
// TorchScript does not record which buffers are persistent: a module with non-persistent buffers
// (register_buffer(..., persistent=False)) should be saved with its state_dict's keys in the
// archive's extra file "state_dict_keys.txt", one per line:
//   torch.jit.script(model).save(path, _extra_files={
//       "state_dict_keys.txt": "\n".join(model.state_dict().keys())})
// and only those buffers are then checkpointed. Without the file every buffer is kept (as
// torch.jit.load(path).state_dict() does in Python).
//
// Loss. A module with a method `loss(inputs, targets) -> Tensor` (decorated @torch.jit.export so
// that scripting keeps it) computes its own loss; otherwise `loss` (LossKind) is applied to
// forward(inputs).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/train/trainable_model.h"

namespace ckpt::train {

// ModelSpec::kind of a scripted model.
inline constexpr char kTorchScriptKind[] = "torchscript";

struct ScriptedModelOptions {
  std::string path;
  // "" : the module's loss() if it has one, else cross_entropy. A name (ParseLossKind) for a
  // module without loss(); a module that has one keeps using it, and Load says so on stderr.
  std::string loss;
};

// Loads the module onto the CPU (To() moves it). Errors:
//   NOT_FOUND         no file at path;
//   INVALID_ARGUMENT  not a TorchScript archive (a torch.save checkpoint, anything else: saying
//                     how to make one), a module without parameters that require grad, an
//                     unknown loss name, a loss() that does not take (inputs, targets), a key of
//                     state_dict_keys.txt the module does not have.
absl::StatusOr<std::unique_ptr<TrainableModel>> LoadScriptedModel(
    const ScriptedModelOptions& options);

// The line of a TorchScript interpreter error that says what went wrong (its last non-empty
// line, e.g. "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x144 and 10x5)"), without
// the interpreter's traceback; the message itself when it has no traceback.
std::string TorchScriptErrorCause(const std::string& message);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_SCRIPTED_MODEL_H_
