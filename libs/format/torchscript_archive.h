#ifndef CKPT_LIBS_FORMAT_TORCHSCRIPT_ARCHIVE_H_
#define CKPT_LIBS_FORMAT_TORCHSCRIPT_ARCHIVE_H_

// The weights of a TorchScript archive (torch.jit.save of a scripted or traced module), keyed as
// the module's state_dict(), read without running any of its code.
//
// The archive is a torch.save-style zip: <stem>/data.pkl pickles the module as objects of its
// TorchScript classes (GLOBAL '__torch__.Net', NEWOBJ, then BUILD with every attribute in the
// class's slot order), with tensors in <stem>/data/<key> records; <stem>/code/ holds each
// class's TorchScript source, where
//   class BatchNorm2d(Module):
//     __parameters__ = ["weight", "bias", ]
//     __buffers__ = ["running_mean", "running_var", "num_batches_tracked", ]
// says which tensor attributes are parameters and buffers. The class __torch__.a.b.C is declared
// in code/__torch__/a/b.py ("__torch__.N" in code/__torch__.py). Those two lines are read as
// text, never evaluated.
//
// TorchScript does not record whether a buffer is persistent: like torch.jit.load(...)
// .state_dict(), the result includes non-persistent buffers, unless the archive carries the
// extra file state_dict_keys.txt (one key per line, what the Python module's state_dict() had;
// docs/trainer.md, "Train your own model", shows how to save it), which then selects and checks the keys.
//
// Example (torch_reader.cc does this for every TorchScript archive it opens):
//   TorchScriptClasses classes;
//   RETURN_IF_ERROR(AddTorchScriptClasses("code/__torch__/torch/nn/modules/conv.py", text,
//                                         &classes));
//   ASSIGN_OR_RETURN(Value state_dict, TorchScriptStateDict(module_object, classes, nullptr));

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/value.h"

namespace ckpt {

struct TorchScriptClass {
  std::vector<std::string> parameters;
  std::vector<std::string> buffers;
};

// By qualified name, e.g. "__torch__.torch.nn.modules.conv.Conv2d".
using TorchScriptClasses = std::map<std::string, TorchScriptClass>;

// Adds the module classes declared in the source `text` of the archive entry `path` (its name
// after "<stem>/", e.g. "code/__torch__/torch/nn/modules/conv.py") to `classes`. Classes without
// __parameters__ / __buffers__ lines (TorchScript classes that are not modules) are skipped.
// INVALID_ARGUMENT for a path outside code/ or a malformed __parameters__ / __buffers__ list.
absl::Status AddTorchScriptClasses(absl::string_view path, absl::string_view text,
                                   TorchScriptClasses* classes);

// The state dict of the module object `module` (the Value data.pkl holds: an opaque object of a
// __torch__ class whose state is its attributes): its parameters, then its buffers, then each
// submodule's entries under "<attribute>.", in the order of the class's slots, which is Python's
// registration order, so the order of the module's state_dict(). A parameter or buffer that is
// None (a Linear without bias) is left out, as Python leaves it out. `keys` (nullable): the
// keys state_dict_keys.txt lists; entries not in it are dropped (non-persistent buffers), and one
// it names that the module lacks is an error. The result is a dict Value of tensors.
// INVALID_ARGUMENT naming the attribute for an object of a class `classes` lacks, or a
// parameter or buffer that is not a tensor; NOT_FOUND for a key of `keys` not found.
absl::StatusOr<Value> TorchScriptStateDict(const Value& module, const TorchScriptClasses& classes,
                                           const std::vector<std::string>* keys);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_TORCHSCRIPT_ARCHIVE_H_
