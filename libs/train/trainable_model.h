#ifndef CKPT_LIBS_TRAIN_TRAINABLE_MODEL_H_
#define CKPT_LIBS_TRAIN_TRAINABLE_MODEL_H_

// What the training loop needs of a model, whatever it was built from: one of the built-in
// LibTorch modules (models.h) or a TorchScript module a team scripted in Python
// (scripted_model.h). The trainer, DDP and the checkpoints see only this, so both kinds train,
// checkpoint and resume through the same code.
//
// Methods that run the model (Loss, To) throw c10::Error as LibTorch does; the trainer calls them
// inside CatchTorchErrors. Not thread-safe, like the modules behind it.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<TrainableModel> model,
//                    WrapBuiltInModel(MakeModel(spec, data)));
//   ddp::DistributedDataParallel ddp(model->Replica(), comm);
//   LossResult result = model->Loss(batch.inputs, batch.targets);  // result.loss: a scalar
//   result.loss.backward();

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/ddp/distributed_data_parallel.h"
#include "libs/tensor/state_dict.h"
#include "libs/train/models.h"

namespace ckpt::train {

// The losses the trainer computes on forward(inputs) for a module that has no loss method of its
// own, as torch.nn.functional computes them (mean reduction):
//   kCrossEntropy   F.cross_entropy(outputs [N, C], int64 class ids [N])
//   kMse            F.mse_loss(outputs, targets), targets converted to the outputs' dtype
//   kBceWithLogits  F.binary_cross_entropy_with_logits(outputs, targets), likewise
enum class LossKind { kCrossEntropy, kMse, kBceWithLogits };

// "cross_entropy" | "mse" | "bce_with_logits"; INVALID_ARGUMENT listing them for anything else.
absl::StatusOr<LossKind> ParseLossKind(absl::string_view name);
std::string LossKindName(LossKind kind);

// The loss of `kind` over a batch. Throws c10::Error for outputs and targets it cannot pair
// (e.g. cross entropy on float targets), with LibTorch's message.
at::Tensor ComputeLoss(LossKind kind, const at::Tensor& outputs, const at::Tensor& targets);

struct LossResult {
  at::Tensor loss;  // what the model or the loss function returned; the trainer checks it.
  // The model's outputs when the trainer computed the loss from them (for accuracy); undefined
  // when the module's own loss method computed it.
  at::Tensor outputs;
};

// How a version names the model it holds, recorded as a label and checked on resume: a built-in
// model's PyTorch twin ("python_twin" = "MLP(in_features=144, ...)") or a scripted module's class
// ("torchscript_class" = "__torch__.mypkg.Net").
struct ModelIdentity {
  std::string label;  // "python_twin" | "torchscript_class"
  std::string value;
  // One line for the run's summary: where the model came from and how to get it back in Python.
  std::string summary_line;
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;

  // Every parameter in named_parameters() order: the optimizer's parameter ids, as Python numbers
  // them for an optimizer built over model.parameters().
  virtual std::vector<at::Tensor> parameters() const = 0;
  // The parameters and buffers DistributedDataParallel keeps in sync.
  virtual ddp::ReplicaTensors Replica() const = 0;
  // Parameters and persistent buffers under the keys and in the order Python's state_dict()
  // gives them. Tensors share storage with the model (detached).
  virtual StateDict Weights() const = 0;
  // Parameter id -> name, for CheckpointContents::optimizer_param_names.
  virtual std::map<int64_t, std::string> OptimizerParamNames() const = 0;
  virtual void SetTraining(bool training) = 0;
  virtual void To(at::Device device) = 0;
  // The loss of one batch (inputs and targets already on the model's device). The trainer
  // checks that it is a finite floating scalar.
  virtual LossResult Loss(const at::Tensor& inputs, const at::Tensor& targets) = 0;
  virtual ModelIdentity Identity() const = 0;
};

// A built-in model (models.h) as a TrainableModel: cross-entropy on its logits, as always.
// Passes an error through; INVALID_ARGUMENT for a null model.
absl::StatusOr<std::unique_ptr<TrainableModel>> WrapBuiltInModel(
    absl::StatusOr<std::shared_ptr<Model>> model);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_TRAINABLE_MODEL_H_
