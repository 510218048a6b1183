// RankRun's training loop: the steps, the per-step agreement between ranks, progress and
// status, and running the model without training it (the first-batch check, evaluation).

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <mutex>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/version_ref.h"
#include "libs/train/optimizer.h"
#include "libs/train/rank_run.h"
#include "libs/train/scripted_model.h"
#include "torch/nn/utils/clip_grad.h"

namespace ckpt::train::internal {
namespace {

// `part`: this rank's part of a parallel checkpoint still being written (kNone without one).
StepConsensus AgreeOnStep(const ddp::Communicator& comm, double loss,
                          const TrainerControl::Requests& requests,
                          AsyncCheckpointer::PartState part) {
  using PartState = AsyncCheckpointer::PartState;
  const std::vector<double> sums =
      comm.AllReduceSum({loss, requests.stop ? 1.0 : 0.0, requests.skip_checkpoint ? 1.0 : 0.0,
                         requests.checkpoint ? 1.0 : 0.0, part == PartState::kWritten ? 1.0 : 0.0,
                         part == PartState::kFailed ? 1.0 : 0.0});
  StepConsensus consensus;
  consensus.mean_loss = sums[0] / comm.size();
  consensus.stop = sums[1] > 0;
  consensus.skip_checkpoint = sums[2] > 0;
  consensus.checkpoint_now = sums[3] > 0;
  consensus.parts_written = static_cast<int>(sums[4]);
  consensus.parts_failed = static_cast<int>(sums[5]);
  return consensus;
}

}  // namespace

CpuRngGuard::CpuRngGuard() : generator_(at::detail::getDefaultCPUGenerator()) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  state_ = generator_.get_state();
}

CpuRngGuard::~CpuRngGuard() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(state_);
}

absl::Status RankRun::CheckModelOnFirstBatch() {
  const size_t count = std::min(split_.train.size(), static_cast<size_t>(config_.batch_size));
  if (count == 0) return absl::OkStatus();  // SetUpDataParallel names an empty data set.
  const std::vector<int64_t> examples(split_.train.begin(), split_.train.begin() + count);
  Batch batch;
  ASSIGN_OR_RETURN(batch, CatchTorchErrors([&] { return data_->Get(examples); }));
  const std::string given = absl::StrCat("inputs ", c10::str(batch.inputs.sizes()), " ",
                                         c10::toString(batch.inputs.scalar_type()), " and targets ",
                                         c10::str(batch.targets.sizes()), " ",
                                         c10::toString(batch.targets.scalar_type()));
  at::Tensor loss;
  absl::Status ran = CatchTorchErrors([&] {
    CpuRngGuard rng;  // the check must not shift the training's random stream.
    at::NoGradGuard no_grad;
    model_->SetTraining(false);
    loss = model_->Loss(batch.inputs.to(device_), batch.targets.to(device_)).loss;
    model_->SetTraining(true);
  });
  if (!ran.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model does not run on the data: its loss on the first batch (", given, " from ",
        data_->Describe(), ") failed: ", TorchScriptErrorCause(std::string(ran.message()))));
  }
  if (!loss.defined() || loss.dim() != 0 || !at::isFloatingType(loss.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's loss on the first batch (", given, ") is ", DescribeTensor(loss),
        ", not a floating-point scalar: reduce it (e.g. .mean()) before returning it"));
  }
  return absl::OkStatus();
}

absl::Status RankRun::Evaluate() {
  if (split_.held_out.empty()) return absl::OkStatus();
  // This rank's share: held-out examples rank, rank + world_size, ...
  std::vector<int64_t> share;
  for (size_t i = group_.rank; i < split_.held_out.size(); i += group_.world_size) {
    share.push_back(split_.held_out[i]);
  }
  ASSIGN_OR_RETURN(
      const std::vector<double> totals, CatchTorchErrors([&] {
        // Rank 0's buffers (BatchNorm statistics), as the next forward would use.
        data_parallel_->PrepareForward();
        // Nothing below should draw random numbers; the guard makes sure evaluation cannot
        // shift the training's stream.
        CpuRngGuard rng;
        // Accuracy where the outputs are class scores for class-id targets; a module whose own
        // loss() computes the loss records val_loss only.
        double loss_sum = 0, correct = 0, classified = 0;
        {
          at::NoGradGuard no_grad;
          model_->SetTraining(false);
          for (size_t begin = 0; begin < share.size(); begin += config_.batch_size) {
            const size_t end =
                std::min(share.size(), begin + static_cast<size_t>(config_.batch_size));
            Batch batch =
                data_->Get(std::vector<int64_t>(share.begin() + begin, share.begin() + end));
            const at::Tensor targets = batch.targets.to(device_);
            const LossResult result = model_->Loss(batch.inputs.to(device_), targets);
            const double examples = static_cast<double>(end - begin);
            // The batch's mean loss weighted by its size: the mean over the held-out part.
            loss_sum += result.loss.item<double>() * examples;
            const at::Tensor& outputs = result.outputs;
            if (outputs.defined() && outputs.dim() == 2 && targets.dim() == 1 &&
                targets.scalar_type() == at::kLong && outputs.size(0) == targets.size(0)) {
              correct += outputs.argmax(1).eq(targets).sum().item<double>();
              classified += examples;
            }
          }
          model_->SetTraining(true);
        }
        return group_.comm.AllReduceSum(
            {loss_sum, correct, static_cast<double>(share.size()), classified});
      }));
  const double examples = totals[2];
  EvalMetrics metrics;
  metrics.global_step = loop_.global_step;
  metrics.examples = static_cast<int64_t>(examples);
  metrics.loss = totals[0] / examples;
  if (totals[3] == examples) metrics.accuracy = totals[1] / examples;
  eval_ = metrics;
  summary_.last_eval = metrics;
  return absl::OkStatus();
}

absl::StatusOr<Value> RankRun::OptimizerState() const {
  if (zero_ != nullptr) return zero_->GatherStateDict();
  return OptimizerStateDict(*optimizer_);
}

absl::StatusOr<uint64_t> RankRun::StateDigest() const {
  ASSIGN_OR_RETURN(const Value optimizer_state, OptimizerState());
  return CatchTorchErrors([&] {
    const ddp::ReplicaTensors replica = model_->Replica();
    std::vector<at::Tensor> tensors = replica.parameters;
    for (const at::Tensor& buffer : replica.buffers()) tensors.push_back(buffer);
    optimizer_state.ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { tensors.push_back(tensor); });
    XXH64_hash_t digest = 0;
    for (const at::Tensor& tensor : tensors) {
      const at::Tensor bytes = tensor.detach().to(at::kCPU).contiguous();
      digest = XXH3_64bits_withSeed(bytes.data_ptr(), bytes.nbytes(), digest);
    }
    return static_cast<uint64_t>(digest);
  });
}

absl::StatusOr<double> RankRun::TrainStep(const std::vector<std::vector<int64_t>>& micro_batches,
                                          const std::vector<int64_t>& upcoming) {
  return CatchTorchErrors([&] {
    model_->SetTraining(true);
    if (zero_ != nullptr) {
      zero_->ZeroGrad();
    } else {
      optimizer_->zero_grad();
    }
    double loss_sum = 0;
    const double scale = 1.0 / static_cast<double>(micro_batches.size());
    for (size_t i = 0; i < micro_batches.size(); ++i) {
      std::vector<int64_t> examples;
      examples.reserve(micro_batches[i].size());
      for (int64_t index : micro_batches[i]) examples.push_back(split_.train[index]);
      Batch batch = data_->Get(examples);
      // Sharded data reads the next step's shard while this one computes (after this step's
      // last read, so the shard it evicts is not one this step still needs).
      if (i + 1 == micro_batches.size()) data_->Prefetch(upcoming);
      std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
      if (i + 1 < micro_batches.size()) no_sync.emplace(data_parallel_->NoSync());
      data_parallel_->PrepareForward();
      at::Tensor loss = model_->Loss(batch.inputs.to(device_), batch.targets.to(device_)).loss;
      TORCH_CHECK(loss.defined() && loss.dim() == 0 && at::isFloatingType(loss.scalar_type()),
                  "the loss at step ", loop_.global_step + 1, " is ", DescribeTensor(loss),
                  ", not a floating-point scalar: reduce it (e.g. .mean()) before returning it");
      (micro_batches.size() > 1 ? loss * scale : loss).backward();
      loss_sum += loss.item<double>();
    }
    data_parallel_->FinishGradientSync();
    if (config_.clip_grad_norm > 0) {
      torch::nn::utils::clip_grad_norm_(parameters_, config_.clip_grad_norm);
    }
    // The last checkpoint may still be copying the parameters and optimizer state this step
    // writes; it has had the forward and backward passes to finish.
    if (checkpointer_ != nullptr) checkpointer_->BeforeOptimizerStep();
    if (zero_ != nullptr) {
      zero_->Step();  // this rank's slices, then every rank's broadcast: a collective.
    } else {
      optimizer_->step();
    }
    scheduler_->Step();
    return loss_sum * scale;
  });
}

absl::Status RankRun::TrainLoop() {
  start_ = absl::Now();
  first_step_ = loop_.global_step;
  last_checkpoint_step_ = summary_.resumed_from ? loop_.global_step : -1;
  bool stop = false;
  while (loop_.global_step < loop_.target_step && !stop) {
    // One optimizer step: accumulation_steps micro-batches (fewer at the end of an epoch), all
    // but the last inside NoSync so only the last backward pass communicates.
    std::vector<std::vector<int64_t>> micro_batches;
    for (int64_t i = 0; i < config_.accumulation_steps; ++i) {
      std::vector<int64_t> indices = sampler_->NextBatch(config_.batch_size);
      if (indices.empty()) break;
      micro_batches.push_back(std::move(indices));
    }
    if (micro_batches.empty()) {  // epoch end (its checkpoint was taken with its last step).
      ++loop_.epoch;
      sampler_->set_epoch(loop_.epoch);
      sampler_->set_position(0);
      continue;
    }
    std::vector<int64_t> upcoming = sampler_->Peek(config_.batch_size);
    for (int64_t& index : upcoming) index = split_.train[index];
    ASSIGN_OR_RETURN(const double step_loss, TrainStep(micro_batches, upcoming));
    ++loop_.global_step;
    if (config_.log_state_digests) {
      ASSIGN_OR_RETURN(const uint64_t digest, StateDigest());
      std::cerr << absl::StrFormat("trainer: rank %d step %d state %016x\n", group_.rank,
                                   loop_.global_step, digest);
    }
    loop_.sampler_position = sampler_->position();
    const bool epoch_end = sampler_->position() >= sampler_->num_samples();
    if (epoch_end) {  // the checkpoint should continue with the next epoch.
      ++loop_.epoch;
      loop_.sampler_position = 0;
      sampler_->set_epoch(loop_.epoch);
      sampler_->set_position(0);
    }

    const AsyncCheckpointer::PartState part = shared_checkpoint_step_ >= 0
                                                  ? checkpointer_->part_state()
                                                  : AsyncCheckpointer::PartState::kNone;
    ASSIGN_OR_RETURN(StepConsensus consensus, CatchTorchErrors([&] {
                       return AgreeOnStep(group_.comm, step_loss, control_.pending(), part);
                     }));
    JudgeSharedCheckpoint(consensus.parts_written, consensus.parts_failed);
    last_loss_ = consensus.mean_loss;
    if (!std::isfinite(last_loss_)) {
      // Every rank sees the same mean, so all stop here together; the state this step made is
      // never checkpointed (an upload of an earlier step still completes: a parallel one gets
      // its verdict here, while every rank can still take part).
      if (shared_checkpoints_) RETURN_IF_ERROR(SettleSharedCheckpoint());
      const std::string latest = !summary_.versions_written.empty()
                                     ? FormatVersionRef(summary_.versions_written.back())
                                 : summary_.resumed_from ? FormatVersionRef(*summary_.resumed_from)
                                                         : std::string("none");
      return absl::FailedPreconditionError(absl::StrFormat(
          "the loss at step %d is %f (mean over %d rank(s)): training stopped without "
          "checkpointing that state, so the latest good version stays the model's latest (%s, "
          "or one whose upload was in flight). Lower the learning rate, clip gradients, or check "
          "the data for NaN / inf.",
          loop_.global_step, last_loss_, group_.world_size, latest));
    }
    stop = consensus.stop;
    skip_final_checkpoint_ = consensus.skip_checkpoint;

    const absl::Duration elapsed = absl::Now() - start_;
    const int64_t steps_done = loop_.global_step - first_step_;
    samples_per_second_ = steps_done * config_.batch_size * config_.accumulation_steps *
                          group_.world_size / std::max(absl::ToDoubleSeconds(elapsed), 1e-9);
    const bool last_step = loop_.global_step == loop_.target_step;
    if (steps_done % std::max<int64_t>(config_.log_every, 1) == 0 || last_step) {
      summary_.loss_curve.emplace_back(loop_.global_step, last_loss_);
    }
    // Every rank knows whether a checkpoint is due (all inputs are agreed), so all can evaluate.
    const bool periodic =
        config_.checkpoint_every > 0 && loop_.global_step % config_.checkpoint_every == 0;
    const bool final = last_step || (consensus.stop && !skip_final_checkpoint_);
    const bool checkpoint_due = periodic || (epoch_end && config_.checkpoint_at_epoch_end) ||
                                consensus.checkpoint_now || final;
    if (checkpoint_due) RETURN_IF_ERROR(Evaluate());
    if (leader_ || (checkpoint_due && shared_checkpoints_)) {
      RETURN_IF_ERROR(AfterStep(consensus, checkpoint_due, final, last_step, steps_done, elapsed));
    }
    if (checkpoint_due) last_checkpoint_step_ = loop_.global_step;
  }
  if (config_.progress_line && leader_) std::cerr << "\n";
  return absl::OkStatus();
}

absl::Status RankRun::AfterStep(const StepConsensus& consensus, bool checkpoint_due, bool final,
                                bool last_step, int64_t steps_done, absl::Duration elapsed) {
  if (!leader_) {  // a part of a parallel checkpoint; rank 0 reports it.
    return TakeCheckpoint(
        /*wait=*/consensus.checkpoint_now || final || config_.synchronous_checkpoints);
  }
  const double seconds_per_step = absl::ToDoubleSeconds(elapsed) / steps_done;
  const absl::Duration eta =
      absl::Seconds(seconds_per_step * (loop_.target_step - loop_.global_step));
  const std::string line =
      absl::StrFormat("epoch %d  step %d/%d  loss %.4f  lr %.3g  %.0f samples/s  ETA %s",
                      loop_.epoch, loop_.global_step, loop_.target_step, last_loss_,
                      CurrentLearningRate(Optimizer()), samples_per_second_, FormatClock(eta));
  if (config_.progress_line) {
    std::cerr << "\r\x1b[K" << line << std::flush;
  } else if (steps_done % std::max<int64_t>(config_.log_every, 1) == 0 || last_step) {
    std::cerr << "trainer: " << line << "\n";
  }
  status_.set_epoch(loop_.epoch);
  status_.set_global_step(loop_.global_step);
  status_.set_loss(last_loss_);
  status_.set_samples_per_second(samples_per_second_);
  if (!summary_.versions_written.empty()) {
    *status_.mutable_last_committed_version() = summary_.versions_written.back();
  }
  control_.SetStatus(status_);

  if (!checkpoint_due) return absl::OkStatus();
  status_.set_state(v1::TrainerStatus::STATE_CHECKPOINTING);
  control_.SetStatus(status_);
  // A requested or final checkpoint is waited for; the others upload in the background.
  absl::Status taken = TakeCheckpoint(
      /*wait=*/consensus.checkpoint_now || final || config_.synchronous_checkpoints);
  if (taken.ok() && failed_checkpoint_step_ == loop_.global_step &&
      (consensus.checkpoint_now || final)) {
    // Trained past in the middle of a run, but not when a client waits for this very version or
    // when it is the run's result.
    taken = last_checkpoint_error_;
  }
  if (!taken.ok()) {
    control_.CheckpointFinished(taken);
    return absl::Status(taken.code(), absl::StrCat("checkpoint at step ", loop_.global_step,
                                                   " failed: ", taken.message()));
  }
  if ((consensus.checkpoint_now || final) && !summary_.versions_written.empty()) {
    control_.CheckpointFinished(summary_.versions_written.back());
  }
  status_.set_state(v1::TrainerStatus::STATE_TRAINING);
  if (!summary_.versions_written.empty()) {
    *status_.mutable_last_committed_version() = summary_.versions_written.back();
  }
  control_.SetStatus(status_);
  return absl::OkStatus();
}

}  // namespace ckpt::train::internal
