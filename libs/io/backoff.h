#ifndef CKPT_LIBS_IO_BACKOFF_H_
#define CKPT_LIBS_IO_BACKOFF_H_

// The one pacing of every retry loop in ckpt: exponential, capped, jittered and deadline-aware.
// The client channel's unary retries, the remote loader's stream resumptions, the registry
// watch's reconnects, `ckpt sync`'s reopen and re-sync, and the S3 client's request retries all
// wait through it (the Python client's `_retry.py` mirrors it), so a change of policy is made once.
//
// Example (a loop that retries UNAVAILABLE until a deadline):
//   Backoff backoff(options.backoff, deadline);
//   while (true) {
//     absl::Status status = Attempt();
//     if (!absl::IsUnavailable(status)) return status;
//     if (!backoff.Wait()) return status;   // the next wait would pass the deadline
//   }
//
// The waits grow as initial * multiplier^n up to `max`; with jitter j each wait is drawn
// uniformly from [cap * (1 - j), cap], so a fleet of clients that lost the same server does not
// come back in lockstep (gRPC's own reconnects use j = 0.2; "full jitter", j = 1, suits S3's
// throttling). A caller that made progress calls Reset(): the next failure waits `initial` again.

#include <functional>
#include <optional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckpt {

struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(5);
  double multiplier = 2.0;
  // The randomized fraction of each wait, in [0, 1]: 0 waits exactly the cap.
  double jitter = 0.2;
};

class Backoff {
 public:
  // `uniform01` draws from [0, 1) (tests pass a fixed one); the default is a per-thread generator.
  explicit Backoff(BackoffPolicy policy, absl::Time deadline = absl::InfiniteFuture(),
                   std::function<double()> uniform01 = nullptr);

  // The wait before the next retry, or nullopt when waiting it would reach the deadline. Each
  // call advances the exponent.
  std::optional<absl::Duration> Next();

  // Sleeps the next wait and returns true, or returns false at once when it would reach the
  // deadline.
  bool Wait();

  // After progress: the next wait starts from `initial` again.
  void Reset() { retries_ = 0; }

  // How many waits were handed out since construction or the last Reset().
  int retries() const { return retries_; }
  absl::Time deadline() const { return deadline_; }

  // The wait before retry `retry` (0-based) for a draw `uniform01` in [0, 1]: the formula above,
  // exposed for tests and for callers that schedule rather than sleep.
  static absl::Duration Delay(const BackoffPolicy& policy, int retry, double uniform01);

 private:
  BackoffPolicy policy_;
  absl::Time deadline_;
  std::function<double()> uniform01_;
  int retries_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_BACKOFF_H_
