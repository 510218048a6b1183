#ifndef CKPT_LIBS_TRAIN_TRAINER_STATE_H_
#define CKPT_LIBS_TRAIN_TRAINER_STATE_H_

// The trainer's own part of a checkpoint, beside model, optimizer and scheduler: where the data
// continues, the run's goal, and how the run was set up. Stored as the version's extra state
// {"trainer": {...}} (plain values and one tensor, so any reader, Python included, sees it),
// encoded and decoded here only.
//
// Example:
//   TrainerState state;
//   state.global_step = 120;
//   contents.extra = EncodeTrainerState(state);
//   ...
//   ASSIGN_OR_RETURN(TrainerState resumed, DecodeTrainerState(loaded.contents.extra, "mlp@3"));

#include <cstdint>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/value.h"
#include "libs/train/models.h"

namespace ckpt::train {

// The key of the trainer's dict in a version's extra state.
inline constexpr char kTrainerStateKey[] = "trainer";

struct TrainerState {
  // Where the data continues: `sampler_position` samples of `epoch` each rank has consumed.
  int64_t epoch = 0;
  int64_t sampler_position = 0;
  int64_t global_step = 0;
  // The run's goal: a run resumed before it finishes it (see trainer.h).
  int64_t target_step = 0;
  // How the run was set up, for resuming with another world size and for people reading it.
  int world_size = 1;
  std::string backend;
  uint64_t seed = 0;
  int64_t batch_size = 0;
  int64_t accumulation_steps = 1;
  ModelSpec model;
  std::string data;
  // The fraction of `data` held out for evaluation (libs/train/dataset.h, SplitHeldOut with
  // `seed`): the sampler's positions count the training part only. 0: none.
  double eval_fraction = 0;
  // The CPU generator's state (at::Generator::get_state); undefined when not recorded.
  at::Tensor rng_cpu;
  // The default generator's state of the rank's accelerator (torch.cuda.get_rng_state() of its
  // cuda:<local rank>), as rank 0 recorded it; undefined for a run on the CPU. Dropout and other
  // random kernels on a GPU draw from it, not from the CPU generator.
  at::Tensor rng_device;
};

// {"trainer": {epoch, sampler_position, global_step, target_step, world_size, backend, seed,
// batch_size, accumulation_steps, model: {kind, hidden, layers, heads, path, loss}, data, eval_fraction,
// rng_cpu, rng_device}}.
Value EncodeTrainerState(const TrainerState& state);

// The state EncodeTrainerState wrote into `extra`. FAILED_PRECONDITION naming `version` when
// `extra` holds no trainer dict (the version was not written by the trainer). Fields missing
// from older versions take their defaults (target_step: global_step; world_size: 0, meaning
// unknown; eval_fraction: 0).
absl::StatusOr<TrainerState> DecodeTrainerState(const Value& extra, absl::string_view version);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_TRAINER_STATE_H_
