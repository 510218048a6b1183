#ifndef CKPT_LIBS_TRAIN_OPTIMIZER_H_
#define CKPT_LIBS_TRAIN_OPTIMIZER_H_

// Optimizers for the trainer (LibTorch's torch::optim SGD, Adam, AdamW) and their state in
// PyTorch's own optimizer.state_dict() layout, as a ckpt::Value tree:
//
//   Adam / AdamW: {'state': {0: {'step': tensor(float32 scalar), 'exp_avg': T, 'exp_avg_sq': T
//                                [, 'max_exp_avg_sq': T]}, ...},
//                  'param_groups': [{'lr', 'betas': (b1, b2), 'eps', 'weight_decay', 'amsgrad',
//                                    'maximize', 'foreach', 'capturable', ..., 'params': [0, 1]}]}
//   SGD:          {'state': {0: {'momentum_buffer': T}, ...},
//                  'param_groups': [{'lr', 'momentum', 'dampening', 'weight_decay', 'nesterov',
//                                    'maximize', 'foreach', 'differentiable', 'params': [...]}]}
//
// with exactly the keys (and key order) Python torch 1.13 writes, so a checkpoint exported to a
// torch.save file feeds Python's optimizer.load_state_dict, and a Python state dict (1.12's int
// steps included) restores here. Parameter ids are positions over the groups' param lists, in
// order, as Python numbers them. Two limits of the layout: an Adam dict and an AdamW dict are
// told apart by nothing reliable (PyTorch versions differ in their flags), so either restores
// into either (their state is the same); and SGD without momentum keeps no state here, where
// Python keeps {'momentum_buffer': None} (both restore into either).
//
// Restoring copies every state tensor onto its PARAMETER's device (and, for floating state, its
// dtype), whatever device the state dict's tensors are on: the store hands back CPU tensors, and
// state left on the CPU for a CUDA parameter is the classic resume bug this rules out.
//
// Example:
//   ASSIGN_OR_RETURN(OptimizerSpec spec, ParseOptimizerKind("adam"));
//   spec.lr = 3e-4;
//   ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> optimizer,
//                    MakeOptimizer(spec, model->parameters()));
//   ... train ...
//   ASSIGN_OR_RETURN(Value state, OptimizerStateDict(*optimizer));   // to CheckpointContents
//   ... in a new process ...
//   RETURN_IF_ERROR(LoadOptimizerStateDict(*fresh_optimizer, loaded.contents.optimizer.value()));

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/value.h"
#include "torch/nn/module.h"
#include "torch/optim/optimizer.h"

namespace ckpt::train {

// What optimizer to build and its hyper-parameters.
struct OptimizerSpec {
  std::string kind = "adamw";  // "sgd" | "adam" | "adamw"
  double lr = 1e-3;            // learning rate of the single param group.
  double momentum = 0.9;       // sgd only; 0 keeps no momentum buffers.
  double weight_decay = 0.0;   // all kinds; adamw's usual 1e-2 is the caller's choice.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam / adamw.
};

// A spec of `kind` (case-insensitive; stored lower case) with default hyper-parameters.
// INVALID_ARGUMENT listing the kinds for anything else.
absl::StatusOr<OptimizerSpec> ParseOptimizerKind(absl::string_view kind);

// An optimizer of spec.kind over `parameters` (one param group). INVALID_ARGUMENT for an unknown
// kind or a hyper-parameter LibTorch rejects (negative lr, beta outside [0, 1), ...).
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const OptimizerSpec& spec, std::vector<at::Tensor> parameters);

// The optimizer's state in PyTorch's layout (see the file comment). Tensors are the optimizer's
// live tensors, not copies: serialize the Value before the next step() if you need a snapshot.
// Parameters that have no state yet (no step taken) are absent from 'state', as in Python.
// UNIMPLEMENTED for an optimizer other than SGD, Adam, AdamW.
absl::StatusOr<Value> OptimizerStateDict(const torch::optim::Optimizer& optimizer);

// Restores `state_dict` into `optimizer`, all or nothing: everything is validated before the
// optimizer is touched. INVALID_ARGUMENT when the dict is for another kind of optimizer (its
// keys say which), when group or parameter counts differ, when a state tensor's shape differs
// from its parameter's (naming the parameter index and both shapes), for a bad 'step', or for
// options LibTorch does not implement ('maximize': True). State tensors are copied onto the
// parameter's device (floating ones to its dtype); steps and group hyper-parameters (lr, betas,
// eps, weight_decay, amsgrad / momentum, dampening, nesterov) are restored exactly. 'step' may
// be a tensor, an int or an integral float. UNIMPLEMENTED as for OptimizerStateDict.
absl::Status LoadOptimizerStateDict(torch::optim::Optimizer& optimizer, const Value& state_dict);

// Parameter id -> parameter name in module.named_parameters() order, i.e. the ids of an optimizer
// built over module.parameters() (what CheckpointContents::optimizer_param_names wants).
std::map<int64_t, std::string> OptimizerParamNames(const torch::nn::Module& module);

// The learning rate of param group 0 (0 if the optimizer has no groups).
double CurrentLearningRate(const torch::optim::Optimizer& optimizer);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_OPTIMIZER_H_
