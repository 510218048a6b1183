#ifndef CKPT_LIBS_TRAIN_RANK_RUN_H_
#define CKPT_LIBS_TRAIN_RANK_RUN_H_

// Internal to //libs/train:trainer (RunTrainingRank in trainer.h is the interface): the state of
// one rank's run and the phases that advance it, split over several sources by concern, as
// RocksDB splits DBImpl.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Generator.h"
#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/ddp/distributed_data_parallel.h"
#include "libs/ddp/distributed_sampler.h"
#include "libs/ddp/process_group.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_store.h"
#include "libs/train/async_checkpointer.h"
#include "libs/train/dataset.h"
#include "libs/train/lr_scheduler.h"
#include "libs/train/trainable_model.h"
#include "libs/train/trainer.h"
#include "libs/train/trainer_control.h"
#include "libs/train/zero_optimizer.h"
#include "proto/ckpt/v1/types.pb.h"
#include "torch/optim/optimizer.h"

namespace ckpt::train::internal {

// Where the data continues and the run's goal: what the loop advances and a checkpoint records.
struct LoopState {
  int64_t epoch = 0;
  int64_t sampler_position = 0;  // samples of `epoch` each rank has consumed.
  int64_t global_step = 0;
  int64_t target_step = 0;
};

// The per-step collective: mean loss plus control flags, so every rank agrees on when to stop
// and checkpoint without an extra round trip.
struct StepConsensus {
  double mean_loss = 0;
  bool stop = false;
  bool skip_checkpoint = false;
  bool checkpoint_now = false;
  // Of a parallel checkpoint still being written: how many ranks' parts are written and how many
  // failed (AsyncCheckpointer::PartState), so every rank reaches the same verdict on it.
  int parts_written = 0;
  int parts_failed = 0;
};

// "H:MM:SS".
std::string FormatClock(absl::Duration duration);

// "a tensor of shape [16, 10] and dtype Float", or "an undefined tensor", for messages.
std::string DescribeTensor(const at::Tensor& tensor);

// "<model kind>-<data kind>", e.g. "mlp-synthetic"; a scripted model goes by its file's name
// ("/teams/vision/resnet18.ts" with --data=pt:FILE: "resnet18-pt").
std::string DefaultModelName(const TrainerConfig& config);

// Saves the CPU generator's state and puts it back when it goes out of scope, so that work done
// under it (a check, an evaluation) cannot shift the training's random stream.
class CpuRngGuard {
 public:
  CpuRngGuard();
  ~CpuRngGuard();
  CpuRngGuard(const CpuRngGuard&) = delete;
  CpuRngGuard& operator=(const CpuRngGuard&) = delete;

 private:
  at::Generator generator_;
  at::Tensor state_;
};

// One rank's run, from building the model to the final checkpoint. The phases are methods so
// that each reads on its own; the state they share is the members below. Used once, by
// RunTrainingRank, on one thread. Its methods live in three files by concern:
//   rank_run_setup.cc       Build, Resume, RestoreFrom, SetUpLineage, SetUpDataParallel;
//   rank_run_loop.cc        TrainLoop, TrainStep, AfterStep, Evaluate, CheckModelOnFirstBatch;
//   rank_run_checkpoint.cc  TakeCheckpoint, CheckpointFailed, RecordCommitted, Finish.
class RankRun {
 public:
  RankRun(const TrainerConfig& config, const ddp::ProcessGroupHandle& group, CheckpointStore& store,
          TrainerControl& control)
      : config_(config),
        group_(group),
        store_(store),
        control_(control),
        leader_(group.rank == 0) {}

  absl::StatusOr<TrainingSummary> Run() {
    RETURN_IF_ERROR(Build());
    RETURN_IF_ERROR(Resume());
    RETURN_IF_ERROR(SetUpLineage());
    loop_.target_step = loop_.global_step < loop_.target_step ? loop_.target_step
                                                              : loop_.global_step + config_.steps;
    summary_.target_step = loop_.target_step;
    RETURN_IF_ERROR(SetUpDataParallel());
    RETURN_IF_ERROR(TrainLoop());
    RETURN_IF_ERROR(Finish());
    return summary_;
  }

 private:
  // Device, data, model, optimizer and scheduler: the same on every rank (same seed).
  absl::Status Build();
  // The model's loss on the first training batch, in eval mode without gradients: a model that
  // does not fit the data (shapes, dtypes, a loss that is not a scalar) is named here, before
  // any collective and any checkpoint, with the batch it was given.
  absl::Status CheckModelOnFirstBatch();
  // Rank 0 picks the version to resume from (the model's latest), every rank loads that one.
  absl::Status Resume();
  absl::Status RestoreFrom(const v1::VersionRef& ref);
  // The run id (rank 0's, so every rank reports the same) and the lineage every version carries.
  absl::Status SetUpLineage();
  absl::Status SetUpDataParallel();
  // How many of split_.train's examples each shard of the data holds, in shard order.
  std::vector<int64_t> TrainingExamplesPerShard(const std::vector<int64_t>& shard_sizes) const;
  absl::Status TrainLoop();
  // One optimizer step over `micro_batches`; the mean loss of this rank. `upcoming`: the next
  // step's first examples, for the data to prefetch.
  absl::StatusOr<double> TrainStep(const std::vector<std::vector<int64_t>>& micro_batches,
                                   const std::vector<int64_t>& upcoming);
  // XXH3 over the bytes of every parameter and buffer, in the module's order, then of every
  // optimizer state tensor in state_dict() order: equal digests, equal training state.
  absl::StatusOr<uint64_t> StateDigest() const;
  // Rank 0: the progress line and status after a step; then a checkpoint when one is due (on
  // every rank with parallel checkpoints).
  absl::Status AfterStep(const StepConsensus& consensus, bool checkpoint_due, bool final,
                         bool last_step, int64_t steps_done, absl::Duration elapsed);
  // All ranks, before a checkpoint: the held-out metrics (a no-op without a held-out part).
  absl::Status Evaluate();
  // Fatal errors only: a failed checkpoint that training may go past is recorded instead
  // (failed_checkpoint_step_, CheckpointFailed).
  absl::Status TakeCheckpoint(bool wait);
  // Counts and reports a failed checkpoint; the error once too many failed in a row.
  absl::Status CheckpointFailed(const absl::Status& error);
  // Parallel checkpoints, every rank: the verdict on the one still being written, once the ranks'
  // part counts say every part is written (commit) or one failed (abandon); no-op otherwise.
  void JudgeSharedCheckpoint(int parts_written, int parts_failed);
  // Parallel checkpoints, every rank (a collective): waits for this rank's part of the checkpoint
  // still being written, agrees with the others on the outcome, and gives the verdict.
  absl::Status SettleSharedCheckpoint();
  void RecordCommitted();
  absl::Status Finish();

  const TrainerConfig& config_;
  const ddp::ProcessGroupHandle& group_;
  CheckpointStore& store_;
  TrainerControl& control_;
  const bool leader_;

  at::Device device_{at::kCPU};
  std::unique_ptr<Dataset> data_;
  DataSplit split_;  // the sampler deals indices into split_.train.
  std::unique_ptr<TrainableModel> model_;
  ModelIdentity identity_;
  std::vector<at::Tensor> parameters_;
  // The optimizer the loop steps: optimizer_, or with ZeRO-1 zero_ (whose shard optimizer holds
  // the param group's hyper-parameters). Optimizer() is the one the scheduler and the logs see.
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<ZeroOptimizer> zero_;
  torch::optim::Optimizer& Optimizer() const {
    return zero_ != nullptr ? zero_->shard_optimizer() : *optimizer_;
  }
  // The optimizer's logical state dict (gathered from every rank with ZeRO-1: a collective).
  absl::StatusOr<Value> OptimizerState() const;
  std::unique_ptr<LrScheduler> scheduler_;
  std::unique_ptr<ddp::DistributedDataParallel> data_parallel_;
  std::unique_ptr<ddp::DistributedSampler> sampler_;
  // Rank 0's, and with parallel checkpoints every rank's.
  std::unique_ptr<AsyncCheckpointer> checkpointer_;
  // Every rank writes its part of each checkpoint (parallel_checkpoints with several ranks).
  bool shared_checkpoints_ = false;
  // The step of the parallel checkpoint whose verdict is pending; -1: none.
  int64_t shared_checkpoint_step_ = -1;

  LoopState loop_;
  v1::Lineage lineage_;
  // The latest evaluation: with a held-out part, every checkpoint is preceded by one.
  std::optional<EvalMetrics> eval_;
  TrainingSummary summary_;
  v1::TrainerStatus status_;
  absl::Time start_;
  int64_t first_step_ = 0;
  int64_t last_checkpoint_step_ = -1;
  int64_t failed_checkpoint_step_ = -1;  // the step whose own checkpoint failed last.
  absl::Status last_checkpoint_error_;
  int consecutive_failed_checkpoints_ = 0;
  bool skip_final_checkpoint_ = false;
  double last_loss_ = 0;
  double samples_per_second_ = 0;
  // The loop waiting for uploads: for the previous one before each checkpoint (what Submit used to
  // wait for itself), and with synchronous_checkpoints for every one.
  absl::Duration upload_waits_;
};

}  // namespace ckpt::train::internal

#endif  // CKPT_LIBS_TRAIN_RANK_RUN_H_
