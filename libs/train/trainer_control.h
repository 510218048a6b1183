#ifndef CKPT_LIBS_TRAIN_TRAINER_CONTROL_H_
#define CKPT_LIBS_TRAIN_TRAINER_CONTROL_H_

// TrainerControl: the meeting point of the training loop (rank 0) and whoever controls it from
// another thread: the Trainer gRPC service (services/trainer) and signal handlers.
//
// The loop publishes its status and, at every step boundary, reads the pending requests
// (checkpoint now, stop). Requesters block until the loop has acted: CheckpointNow returns the
// committed version, Stop the final one. Nothing here touches tensors or the network.
//
// Thread-safety: every method may be called from any thread.

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ckpt/v1/trainer.pb.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt::train {

class TrainerControl {
 public:
  // ---- Requesters (service threads).
  v1::TrainerStatus status() const;
  // Blocks until the loop has committed a checkpoint taken after this call, and returns it.
  // DEADLINE_EXCEEDED after `timeout`; FAILED_PRECONDITION once training has ended; the commit's
  // error if it failed.
  absl::StatusOr<v1::VersionRef> CheckpointNow(absl::Duration timeout);
  // Asks the loop to stop after the current step (checkpointing first unless skip_checkpoint) and
  // blocks until it has: the final version, or nullopt when none was taken.
  absl::StatusOr<std::optional<v1::VersionRef>> Stop(bool skip_checkpoint, absl::Duration timeout);
  // Async-signal-safe: a graceful stop with a checkpoint (SIGTERM, SIGINT).
  void RequestStopFromSignal() { signal_stop_.store(true, std::memory_order_relaxed); }

  // ---- The training loop.
  struct Requests {
    bool checkpoint = false;
    bool stop = false;
    bool skip_checkpoint = false;
  };
  Requests pending() const;
  void SetStatus(const v1::TrainerStatus& status);
  // A checkpoint was committed (or failed): completes CheckpointNow callers waiting for one.
  void CheckpointFinished(const absl::StatusOr<v1::VersionRef>& result);
  // The loop has ended: completes Stop callers and fails later requests.
  void Finished(std::optional<v1::VersionRef> final_version);

 private:
  std::atomic<bool> signal_stop_{false};
  mutable absl::Mutex mu_;
  v1::TrainerStatus status_ ABSL_GUARDED_BY(mu_);
  int64_t checkpoints_requested_ ABSL_GUARDED_BY(mu_) = 0;  // tickets handed out.
  int64_t checkpoints_served_ ABSL_GUARDED_BY(mu_) = 0;     // tickets a commit has answered.
  absl::StatusOr<v1::VersionRef> last_checkpoint_ ABSL_GUARDED_BY(mu_) =
      absl::UnavailableError("no checkpoint yet");
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool skip_checkpoint_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::VersionRef> final_version_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_TRAINER_CONTROL_H_
