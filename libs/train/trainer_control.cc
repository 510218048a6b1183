#include "libs/train/trainer_control.h"

#include <utility>

namespace ckpt::train {

v1::TrainerStatus TrainerControl::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void TrainerControl::SetStatus(const v1::TrainerStatus& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
}

TrainerControl::Requests TrainerControl::pending() const {
  absl::MutexLock lock(&mu_);
  Requests requests;
  requests.checkpoint = checkpoints_requested_ > checkpoints_served_;
  requests.stop = stop_requested_ || signal_stop_.load(std::memory_order_relaxed);
  requests.skip_checkpoint = stop_requested_ && skip_checkpoint_;
  return requests;
}

absl::StatusOr<v1::VersionRef> TrainerControl::CheckpointNow(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (finished_) return absl::FailedPreconditionError("training has ended");
  const int64_t ticket = ++checkpoints_requested_;
  auto answered = [this, ticket]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return checkpoints_served_ >= ticket || finished_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&answered), timeout)) {
    return absl::DeadlineExceededError("no checkpoint was committed in time");
  }
  if (checkpoints_served_ < ticket) {
    return absl::FailedPreconditionError("training ended before the checkpoint was taken");
  }
  return last_checkpoint_;
}

absl::StatusOr<std::optional<v1::VersionRef>> TrainerControl::Stop(bool skip_checkpoint,
                                                                   absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!finished_) {
    // A second Stop can only make the stop stricter, never undo a skip.
    skip_checkpoint_ = stop_requested_ ? (skip_checkpoint_ && skip_checkpoint) : skip_checkpoint;
    stop_requested_ = true;
  }
  auto finished = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return finished_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished), timeout)) {
    return absl::DeadlineExceededError(
        "the trainer did not stop in time (it stops at the next "
        "step boundary, after its checkpoint)");
  }
  return final_version_;
}

void TrainerControl::CheckpointFinished(const absl::StatusOr<v1::VersionRef>& result) {
  absl::MutexLock lock(&mu_);
  last_checkpoint_ = result;
  checkpoints_served_ = checkpoints_requested_;
  if (result.ok()) *status_.mutable_last_committed_version() = *result;
}

void TrainerControl::Finished(std::optional<v1::VersionRef> final_version) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  final_version_ = std::move(final_version);
}

}  // namespace ckpt::train
