#ifndef CKPT_LIBS_TRAIN_MODELS_H_
#define CKPT_LIBS_TRAIN_MODELS_H_

// The models the trainer trains. Each has a PyTorch twin in libs/train/python/twins.py whose
// state_dict() has exactly the same keys, in the same order, with the same shapes, so an
// exported checkpoint loads in Python with load_state_dict(strict=True) and computes the same
// logits (eval mode; no dropout anywhere, so training is deterministic too).
//
//   mlp          flatten -> `layers` x (Linear(hidden) + ReLU) -> Linear(num_classes)
//                keys: hidden.0.weight, hidden.0.bias, ..., head.weight, head.bias
//   cnn          [C,H,W] -> conv1 3x3 (hidden ch) -> bn1 -> ReLU -> maxpool 2 -> conv2 3x3 -> bn2
//                -> ReLU -> global average pool -> head Linear
//                keys: conv1.*, bn1.{weight,bias,running_mean,running_var,num_batches_tracked}, ...
//   transformer  int64 tokens [S] -> embed (Embedding) + pos (learned [S, hidden]) ->
//                TransformerEncoder(layers x post-norm layer: heads, feed-forward 2*hidden, ReLU,
//                LayerNorm eps 1e-5, dropout 0) -> mean over positions -> head Linear
//                keys: pos, embed.weight, encoder.layers.0.self_attn.in_proj_weight, ..., head.*
//
// Initialisation uses LibTorch's default generator: deterministic under torch::manual_seed.
// A Model is a torch::nn::Module; like any Module it is not thread-safe.
//
// Example:
//   torch::manual_seed(0);
//   ASSIGN_OR_RETURN(std::shared_ptr<Model> model, MakeModel({.kind = "cnn"}, *data));
//   at::Tensor logits = model->forward(batch.inputs);  // [N, data->num_classes()]
//   StateDict weights = ModelStateDict(*model);          // what Python's state_dict() lists

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "libs/tensor/state_dict.h"
#include "libs/train/dataset.h"
#include "torch/nn/module.h"

namespace ckpt::train {

struct ModelSpec {
  // "mlp" | "cnn" | "transformer", or "torchscript": a module a team scripted in Python, loaded
  // from `path` (libs/train/scripted_model.h; the sizes below do not apply to it).
  std::string kind = "mlp";
  std::string path;  // torchscript only.
  // torchscript only: the loss applied to forward(inputs) when the module has no loss() method
  // ("cross_entropy" | "mse" | "bce_with_logits"; "": cross_entropy).
  std::string loss;
  int64_t hidden = 64;       // mlp hidden width; cnn channels; transformer d_model
  int64_t layers = 2;        // transformer encoder layers (mlp: hidden layers; cnn: unused)
  int64_t heads = 4;         // transformer attention heads; must divide `hidden`
};

class Model : public torch::nn::Module {
 public:
  // Logits [N, num_classes] for a batch shaped [N, example_shape...] (float features or int64
  // tokens, as the dataset gives them). LibTorch throws on a wrongly shaped input.
  virtual at::Tensor forward(const at::Tensor& inputs) = 0;

  // A Python expression constructing the twin from libs/train/python/twins.py, e.g.
  // "MLP(in_features=144, hidden=64, layers=2, num_classes=10)".
  virtual std::string PythonTwin() const = 0;
};

// The model `spec` describes, sized for `data` (input shape, number of classes, vocabulary).
// INVALID_ARGUMENT for an unknown kind, non-positive sizes, heads not dividing hidden, or a
// combination that cannot work: mlp / cnn on token ids, cnn on inputs that are not [C,H,W]
// images, transformer on float features or on inputs that are not [S] sequences.
absl::StatusOr<std::shared_ptr<Model>> MakeModel(const ModelSpec& spec, const Dataset& data);

// {"mlp", "cnn", "transformer"}.
std::vector<std::string> ModelKinds();

// `module`'s parameters and buffers under the names and in the order Python's
// Module.state_dict() gives them: per module (pre-order from the root), its own parameters,
// then its own buffers, then its children's. The tensors are detached but share storage with
// the module (as in Python), so copy them before training on if they must not change.
StateDict ModelStateDict(const torch::nn::Module& module);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_MODELS_H_
