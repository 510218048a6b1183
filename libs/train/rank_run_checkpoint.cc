// RankRun's checkpoints: what one holds, handing it to the asynchronous checkpointer, failures
// that training may go past and those it may not, and the final one.

#include <unistd.h>

#include <iostream>
#include <mutex>
#include <optional>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/train/optimizer.h"
#include "libs/train/rank_run.h"
#include "libs/train/scripted_model.h"
#include "libs/train/trainer_state.h"

namespace ckpt::train::internal {
namespace {

// What optimizer.step() writes in place, in the order it writes it: each parameter with its state
// (`optimizer_state`'s "state" entry under the parameter's id). A checkpoint copies these on the
// upload thread in this order while the next forward and backward passes run, and TrainStep waits
// for that copy right before the step (AsyncCheckpointer::SubmitOverlapped). The forward pass
// writes only buffers (BatchNorm statistics), which are not here: those are copied at once.
std::vector<at::Tensor> StepWrites(const torch::optim::Optimizer& optimizer,
                                   const Value& optimizer_state) {
  std::vector<at::Tensor> writes;
  const Value* state = optimizer_state.Find("state");
  int64_t id = 0;
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    for (const at::Tensor& parameter : group.params()) {
      writes.push_back(parameter);
      const Value* own = state != nullptr && state->is_dict() ? state->Find(id) : nullptr;
      if (own != nullptr) {
        own->ForEachTensor(
            [&](const std::string&, const at::Tensor& tensor) { writes.push_back(tensor); });
      }
      ++id;
    }
  }
  return writes;
}

}  // namespace

void RankRun::RecordCommitted() {
  std::optional<CommitResult> last = checkpointer_->stats().last_commit;
  if (!last) return;
  if (summary_.versions_written.empty() ||
      summary_.versions_written.back().version() != last->version.version()) {
    summary_.versions_written.push_back(last->version);
    consecutive_failed_checkpoints_ = 0;
  }
}

absl::Status RankRun::CheckpointFailed(const absl::Status& error) {
  ++summary_.failed_checkpoints;
  ++consecutive_failed_checkpoints_;
  summary_.last_checkpoint_error = error.ToString();
  last_checkpoint_error_ = error;
  if (consecutive_failed_checkpoints_ >= config_.max_consecutive_failed_checkpoints) {
    return absl::Status(error.code(),
                        absl::StrCat(consecutive_failed_checkpoints_,
                                     " checkpoints in a row failed, the last: ", error.message(),
                                     "; stopping rather than training on with nothing saved "
                                     "(max_failed_checkpoints)"));
  }
  std::cerr << "trainer: a checkpoint failed (" << consecutive_failed_checkpoints_
            << " in a row; training goes on, the next one retries): " << error << "\n";
  return absl::OkStatus();
}

void RankRun::JudgeSharedCheckpoint(int parts_written, int parts_failed) {
  if (shared_checkpoint_step_ < 0) return;
  if (parts_failed > 0 || parts_written == group_.world_size) {
    checkpointer_->EndSharedUpload(/*commit=*/parts_failed == 0);
    shared_checkpoint_step_ = -1;
  }
}

absl::Status RankRun::SettleSharedCheckpoint() {
  if (shared_checkpoint_step_ < 0) return absl::OkStatus();
  const bool written = checkpointer_->WaitForPart() == AsyncCheckpointer::PartState::kWritten;
  ASSIGN_OR_RETURN(const std::vector<double> sums, CatchTorchErrors([&] {
                     return group_.comm.AllReduceSum({written ? 1.0 : 0.0});
                   }));
  // Every part has ended now: any not written failed, so this gives the verdict.
  const int parts_written = static_cast<int>(sums[0]);
  JudgeSharedCheckpoint(parts_written, group_.world_size - parts_written);
  return absl::OkStatus();
}

absl::Status RankRun::TakeCheckpoint(bool wait) {
  CheckpointContents contents;
  contents.model = model_->Weights();
  // A ZeRO-1 rank of a parallel checkpoint gathers nothing: its part is its slices, and the
  // optimizer state no rank holds whole stands in the contents as shape-only placeholders. A lone
  // ZeRO rank (one rank: no parallel checkpoint) holds the whole state, and saves a copy of it.
  std::optional<ZeroOptimizer::ShardedState> sharded;
  if (zero_ != nullptr && shared_checkpoints_) {
    ASSIGN_OR_RETURN(sharded, zero_->ShardedStateDict());
    contents.optimizer = sharded->state_dict;
  } else if (zero_ != nullptr) {
    ASSIGN_OR_RETURN(contents.optimizer, zero_->GatherStateDict());
  } else {
    ASSIGN_OR_RETURN(contents.optimizer, OptimizerStateDict(*optimizer_));
  }
  contents.scheduler = scheduler_->StateDict();
  contents.optimizer_param_names = model_->OptimizerParamNames();
  TrainerState state;
  state.epoch = loop_.epoch;
  state.sampler_position = loop_.sampler_position;
  state.global_step = loop_.global_step;
  state.target_step = loop_.target_step;
  state.world_size = group_.world_size;
  state.backend = group_.backend;
  state.seed = config_.seed;
  state.batch_size = config_.batch_size;
  state.accumulation_steps = config_.accumulation_steps;
  state.model = config_.model;
  state.data = config_.data.source;
  state.eval_fraction = config_.eval_fraction;
  ASSIGN_OR_RETURN(state.rng_cpu, CatchTorchErrors([&] {
                     at::Generator generator = at::detail::getDefaultCPUGenerator();
                     std::lock_guard<std::mutex> lock(generator.mutex());
                     return generator.get_state();
                   }));
  if (device_.type() != at::kCPU) {
    ASSIGN_OR_RETURN(state.rng_device, CatchTorchErrors([&] {
                       at::Generator generator = at::globalContext().defaultGenerator(device_);
                       std::lock_guard<std::mutex> lock(generator.mutex());
                       return generator.get_state();
                     }));
  }
  contents.extra = EncodeTrainerState(state);
  v1::VersionMetadata& metadata = contents.metadata;
  metadata.set_epoch(loop_.epoch);
  metadata.set_global_step(loop_.global_step);
  (*metadata.mutable_metrics())["loss"] = last_loss_;
  (*metadata.mutable_metrics())["samples_per_second"] = samples_per_second_;
  (*metadata.mutable_metrics())["learning_rate"] = CurrentLearningRate(Optimizer());
  if (eval_) {
    (*metadata.mutable_metrics())["val_loss"] = eval_->loss;
    if (eval_->accuracy) (*metadata.mutable_metrics())["val_acc"] = *eval_->accuracy;
  }
  *metadata.mutable_lineage() = lineage_;
  metadata.set_world_size(group_.world_size);
  metadata.set_backend(group_.backend);
  metadata.set_source_format("trainer");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  metadata.set_producer(absl::StrCat("ckpt trainer on ", host));
  (*metadata.mutable_labels())["model_kind"] = config_.model.kind;
  (*metadata.mutable_labels())["data"] = config_.data.source;
  (*metadata.mutable_labels())[identity_.label] = identity_.value;
  if (config_.model.kind == kTorchScriptKind) {
    (*metadata.mutable_labels())["model_file"] = config_.model.path;
  }
  if (zero_ != nullptr) (*metadata.mutable_labels())["zero_stage"] = "1";
  metadata.set_description(absl::StrCat(config_.model.kind, " step ", loop_.global_step, " epoch ",
                                        loop_.epoch, " loss ", last_loss_));
  CommitOptions options;
  options.attribution.reason = absl::StrCat("checkpoint at epoch ", loop_.epoch, " step ",
                                            loop_.global_step, " of run ", summary_.run_id);
  // The previous upload first (Submit would wait for it as well, and the stall counts it just
  // the same): its failure is that checkpoint's, reported before this one is taken. A parallel
  // one gets its verdict first (a collective: every rank is here).
  const absl::Time join_start = absl::Now();
  if (shared_checkpoints_) RETURN_IF_ERROR(SettleSharedCheckpoint());
  const absl::Status previous = checkpointer_->Wait().status();
  upload_waits_ += absl::Now() - join_start;
  if (leader_) {
    RecordCommitted();
    if (!previous.ok()) RETURN_IF_ERROR(CheckpointFailed(previous));
  }
  // Parameters and optimizer state are copied while the next step's forward and backward passes
  // run; TrainStep's guard waits for them before the optimizer writes them. They are also what
  // every rank holds alike, so a parallel checkpoint splits them between the ranks.
  std::vector<at::Tensor> step_writes;
  if (zero_ != nullptr) {
    // The parameters (ZeroOptimizer::Step writes them all, by broadcast) and this rank's live
    // optimizer state, which its slices are copied from (a lone rank's gathered state is a
    // private copy already).
    step_writes = parameters_;
    if (sharded) {
      for (const OwnedTensorBytes& owned : sharded->owned) step_writes.push_back(owned.source);
    }
  } else {
    step_writes = StepWrites(*optimizer_, *contents.optimizer);
  }
  absl::Status submitted;
  if (shared_checkpoints_) {
    AsyncCheckpointer::SharedUpload share;
    // Every rank names it alike: the run, the step, and how many this rank submitted (a
    // checkpoint retried at the same step gets a name of its own).
    share.upload_name = absl::StrCat(summary_.run_id, "/step-", loop_.global_step, "/",
                                     checkpointer_->stats().submitted);
    share.rank = group_.rank;
    share.world_size = group_.world_size;
    share.replicated = step_writes;
    if (sharded) {
      share.partitioned = std::move(sharded->partitioned);
      share.owned = std::move(sharded->owned);
    }
    submitted =
        checkpointer_->SubmitShared(contents, std::move(options), step_writes, std::move(share));
    // Even when this rank's part failed to start: the ranks judge the checkpoint together.
    shared_checkpoint_step_ = loop_.global_step;
  } else {
    submitted = checkpointer_->SubmitOverlapped(contents, std::move(options), step_writes);
  }
  absl::Status failure = submitted;
  if (!submitted.ok() && !leader_) {  // rank 0 reports it, from the ranks' verdict.
    std::cerr << "trainer: rank " << group_.rank << "'s part of the checkpoint at step "
              << loop_.global_step << " failed: " << submitted << "\n";
  }
  // With a parallel checkpoint every rank goes on to the same collectives, failed or not.
  if (wait && (submitted.ok() || shared_checkpoints_)) {
    const absl::Time wait_start = absl::Now();
    if (shared_checkpoints_) RETURN_IF_ERROR(SettleSharedCheckpoint());
    const absl::Status uploaded = checkpointer_->Wait().status();
    if (config_.synchronous_checkpoints) upload_waits_ += absl::Now() - wait_start;
    if (leader_) RecordCommitted();
    if (failure.ok()) failure = uploaded;
  }
  if (failure.ok() || !leader_) return absl::OkStatus();
  failed_checkpoint_step_ = loop_.global_step;
  return CheckpointFailed(failure);
}

absl::Status RankRun::Finish() {
  std::optional<v1::VersionRef> final_version;
  // e.g. a zero-step leg; known on every rank, which all evaluate for it.
  const bool final_due = last_checkpoint_step_ != loop_.global_step && !skip_final_checkpoint_;
  if (final_due) RETURN_IF_ERROR(Evaluate());
  if (shared_checkpoints_) {
    // Every rank writes its part of the final checkpoint, or settles the one in flight.
    if (final_due) {
      RETURN_IF_ERROR(TakeCheckpoint(/*wait=*/true));
    } else {
      RETURN_IF_ERROR(SettleSharedCheckpoint());
    }
  }
  if (leader_) {
    if (final_due && !shared_checkpoints_) {
      RETURN_IF_ERROR(TakeCheckpoint(/*wait=*/true));
    }
    if (final_due) {
      if (failed_checkpoint_step_ == loop_.global_step) {
        return absl::Status(last_checkpoint_error_.code(),
                            absl::StrCat("the final checkpoint at step ", loop_.global_step,
                                         " failed: ", last_checkpoint_error_.message()));
      }
    }
    ASSIGN_OR_RETURN(std::optional<CommitResult> last, checkpointer_->Wait());
    RecordCommitted();
    if (!skip_final_checkpoint_ && last) final_version = last->version;
    summary_.checkpoint_stall = checkpointer_->stats().total_stall + upload_waits_;
  }
  if (shared_checkpoints_) {
    const AsyncCheckpointer::Stats stats = checkpointer_->stats();
    std::cerr << absl::StrFormat(
        "trainer: rank %d wrote its part of %d parallel checkpoint(s): %d bytes (%.1f MiB)\n",
        group_.rank, stats.parts_written, stats.part_bytes_written,
        static_cast<double>(stats.part_bytes_written) / (1 << 20));
  }
  if (zero_ != nullptr) {
    std::cerr << absl::StrFormat("trainer: rank %d held %d bytes of optimizer state (ZeRO-1)\n",
                                 group_.rank, zero_->shard_state_bytes());
  }
  // Nobody leaves before rank 0's store has committed: the other ranks may still be reading it.
  RETURN_IF_ERROR(CatchTorchErrors([&] { group_.comm.Barrier(); }));
  status_.set_state(v1::TrainerStatus::STATE_FINISHED);
  control_.SetStatus(status_);
  control_.Finished(final_version);

  summary_.final_step = loop_.global_step;
  summary_.final_epoch = loop_.epoch;
  summary_.stopped_early = loop_.global_step < loop_.target_step;
  summary_.wall_time = absl::Now() - start_;
  summary_.samples_per_second = samples_per_second_;
  return absl::OkStatus();
}

}  // namespace ckpt::train::internal
