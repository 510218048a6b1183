#ifndef CKPT_LIBS_TRAIN_LR_SCHEDULER_H_
#define CKPT_LIBS_TRAIN_LR_SCHEDULER_H_

// Learning-rate schedulers over a torch::optim::Optimizer that behave as PyTorch's do and keep
// their state in PyTorch's scheduler.state_dict() layout (a ckpt::Value tree), so a resumed run
// gets exactly the learning rates an uninterrupted one would.
//
// As in Python, constructing a scheduler counts as its first step (last_epoch 0, _step_count 1),
// and Step() is called after each optimizer.step(): it advances last_epoch and writes the new
// learning rate into every param group (options().set_lr).
//
// Kinds:
//   "none":   the learning rate never changes.
//   "step":   PyTorch's StepLR: lr = base_lr * gamma^(last_epoch / step_size), computed the way
//             Python's StepLR.step() does (multiplying the group's lr by gamma at each multiple
//             of step_size), so the doubles equal Python's bit for bit.
//   "cosine": a LambdaLR with factor(e) = e / warmup_steps while e < warmup_steps (linear
//             warmup from 0, the Hugging Face convention), then
//             min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * p)) / 2 with
//             p = min(1, (e - warmup_steps) / max(1, total_steps - warmup_steps)).
//
// Not thread-safe; the scheduler holds a reference to the optimizer, which must outlive it.
//
// Example:
//   SchedulerSpec spec;
//   spec.kind = "step";
//   spec.step_size = 10;
//   ASSIGN_OR_RETURN(std::unique_ptr<LrScheduler> scheduler, MakeScheduler(spec, *optimizer));
//   for (...) { ...; optimizer->step(); scheduler->Step(); }
//   contents.scheduler = scheduler->StateDict();

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/tensor/value.h"
#include "torch/optim/optimizer.h"

namespace ckpt::train {

struct SchedulerSpec {
  std::string kind = "none";   // "none" | "step" | "cosine" (case-insensitive).
  int64_t step_size = 100;     // step: steps between decays; > 0.
  double gamma = 0.5;          // step: decay factor.
  int64_t warmup_steps = 0;    // cosine: steps of linear warmup; >= 0.
  int64_t total_steps = 1000;  // cosine: steps until the lr reaches min_lr_ratio * base_lr; > 0.
  double min_lr_ratio = 0.0;   // cosine: final lr as a fraction of base_lr, in [0, 1].
};

class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  // After optimizer.step(), like PyTorch's scheduler.step(): sets the optimizer groups' lr.
  virtual void Step() = 0;
  // The learning rates the last Step() (or the constructor) set, one per param group.
  virtual std::vector<double> last_lr() const = 0;
  virtual int64_t last_epoch() const = 0;
  // PyTorch layout. StepLR: {'step_size', 'gamma', 'base_lrs', 'last_epoch', 'verbose',
  // '_step_count', '_get_lr_called_within_step', '_last_lr'}; cosine: LambdaLR's keys
  // ('lr_lambdas': [None] per group) plus 'warmup_steps', 'total_steps', 'min_lr_ratio'; none:
  // the keys every scheduler has.
  virtual Value StateDict() const = 0;
  // Restores exactly, including the kind's own parameters (step_size, gamma, warmup_steps, ...),
  // and sets each group's lr to the dict's '_last_lr' so the order of restoring optimizer and
  // scheduler does not matter. INVALID_ARGUMENT when the dict is of another kind (naming both),
  // when its group count differs from the optimizer's, or for missing / mistyped keys; the
  // scheduler is unchanged then.
  virtual absl::Status LoadStateDict(const Value& state) = 0;
};

// A scheduler of spec.kind over `optimizer`'s param groups, whose current lrs become base_lrs.
// INVALID_ARGUMENT for an unknown kind (listing the kinds) or out-of-range parameters.
absl::StatusOr<std::unique_ptr<LrScheduler>> MakeScheduler(const SchedulerSpec& spec,
                                                           torch::optim::Optimizer& optimizer);

// The cosine schedule's factor at `epoch` (see the file comment); spec must be valid.
double CosineWarmupFactor(const SchedulerSpec& spec, int64_t epoch);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_LR_SCHEDULER_H_
