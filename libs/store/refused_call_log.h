#ifndef CKPT_LIBS_STORE_REFUSED_CALL_LOG_H_
#define CKPT_LIBS_STORE_REFUSED_CALL_LOG_H_

// RefusedCallLog: writes the calls that access control refused (UNAUTHENTICATED,
// PERMISSION_DENIED) into a store's audit log -- after an incident, "who tried what they may
// not" is the record that matters most -- without letting a flood of refused calls fill the disk
// or slow the calls being served.
//
// Each refused call is one audit record: action "refused", the caller's identity (or
// "unknown (token sha256:1a2b3c4d)" / "unknown (certificate CN=...)" / "unknown (no
// credentials)" when it could not be authenticated), its peer, the model it named, the method as
// detail, and outcome FAILED with the refusal's code and message.
//
// Bounded by a token bucket: `burst` records at once, refilled at `records_per_second`. Refusals
// beyond it are counted, not written; the next record written is preceded by one
// "refusals_dropped" record saying how many went unrecorded and over what time (and the
// destructor writes it if refusals stopped coming). Deciding costs a mutex and arithmetic; the
// writes go to `schedule` (the service's work queue), so the thread that refused the call never
// waits for the disk.
//
// Thread-safe. The store must outlive the log, and the log every write it scheduled.
//
// Example:
//   RefusedCallLog refused(*store, {});
//   refused.Record({"unknown (no credentials)", "ipv4:10.0.0.9:4711", "ListModels", "",
//                   absl::UnauthenticatedError("...")});

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt {

struct RefusedCall {
  std::string identity;  // who, or "unknown (...)"; "unknown" when empty.
  std::string peer;      // gRPC's peer ("ipv4:10.0.0.7:51234").
  std::string method;    // "ListModels", "Upload", ...
  std::string model;     // the model the call named; empty for none.
  absl::Status status;   // the refusal.
};

class RefusedCallLog {
 public:
  struct Options {
    // Sustained records a second, and how many may be written at once before the rate applies.
    double records_per_second = 20;
    int64_t burst = 200;
    // Runs a write; empty: at once, on the calling thread.
    std::function<void(std::function<void()>)> schedule;
  };

  RefusedCallLog(CheckpointStore& store, Options options);
  // Writes the count of refusals left unrecorded, if any (on the calling thread).
  ~RefusedCallLog();
  RefusedCallLog(const RefusedCallLog&) = delete;
  RefusedCallLog& operator=(const RefusedCallLog&) = delete;

  // Records `call` (see above). A write that fails goes to stderr only: the call was refused
  // either way.
  void Record(RefusedCall call);

  // Refused calls seen, records scheduled for them, and those left unrecorded.
  int64_t seen() const;
  int64_t recorded() const;
  int64_t dropped() const;

 private:
  // A "refusals_dropped" record for the refusals dropped since the last one; none when none were.
  std::function<void()> TakeDroppedSummaryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Write(v1::AuditRecord record, absl::Status outcome, std::string detail);

  CheckpointStore& store_;
  const Options options_;
  mutable absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  int64_t seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // Dropped since the last summary, and the time of the first and last of them.
  int64_t unreported_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_unreported_ ABSL_GUARDED_BY(mu_);
  absl::Time last_unreported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_REFUSED_CALL_LOG_H_
