#ifndef CKPT_TOOLS_BENCH_SCRIPTED_TRAINING_BENCH_H_
#define CKPT_TOOLS_BENCH_SCRIPTED_TRAINING_BENCH_H_

// R9: training throughput of a team's scripted model (torchvision's ResNet-18 on 32x32 images,
// torch.jit.script'ed) with the real C++ trainer (//services/trainer, 2 Gloo ranks, shard data)
// against the same architecture in a plain Python torch.nn.parallel.DistributedDataParallel loop
// (Debian's torch, Gloo, 2 ranks), same batch size, optimizer and threads per rank, run one
// after the other in each run (tools/bench/scripted_training_baseline.py is the Python side).
//
// Both sides leave out their first `warmup_steps` (TorchScript's profiling runs, allocator
// warm-up): the trainer's throughput is read from its progress lines at the end of the warm-up
// and at the last step (it prints samples/s since its first step), Python's is timed between
// barriers.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct ScriptedTrainingOptions {
  std::string python;           // /usr/bin/python3
  std::string baseline_script;  // scripted_training_baseline.py
  std::string trainer;          // the //services/trainer binary
  std::string work_dir;
  // Environment assignments put before both sides' commands (and so inherited by the trainer's
  // ranks), e.g. glibc's MALLOC_*_ settings of a memory regime: this VM faults fresh memory in
  // so slowly that a side left to malloc's defaults measured the regime, not the training (5x
  // for Python's loop here).
  std::string environment;
  int runs = 3;
  int warmup_steps = 5;
  int timed_steps = 30;
  int batch_per_rank = 32;
  int threads_per_rank = 1;
};

struct ScriptedTrainingSamples {
  std::vector<double> trainer_samples_per_s;  // both ranks together, one per run.
  std::vector<double> python_samples_per_s;
};

// Writes the model and shards (once per work_dir), then each run trains with the trainer and
// with Python.
// Progress lines go to stderr. INTERNAL naming the command when a side fails or prints no figure.
absl::StatusOr<ScriptedTrainingSamples> MeasureScriptedTraining(
    const ScriptedTrainingOptions& options);

// The trainer's samples/s between the progress lines of steps `from` and `to` of its log
// (lines "... step S/T ... R samples/s ..."; R counts from the run's first step). INVALID_ARGUMENT
// when either line is missing.
absl::StatusOr<double> TrainerSamplesPerSecond(const std::string& log, int from, int to);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_SCRIPTED_TRAINING_BENCH_H_
