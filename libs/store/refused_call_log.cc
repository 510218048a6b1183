#include "libs/store/refused_call_log.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckpt {
namespace {

// Where a summary's identity and peer say the record comes from: the store itself.
constexpr absl::string_view kStoreIdentity = "checkpoint store";

}  // namespace

RefusedCallLog::RefusedCallLog(CheckpointStore& store, Options options)
    : store_(store),
      options_(std::move(options)),
      tokens_(static_cast<double>(options_.burst)),
      refilled_(absl::Now()) {}

RefusedCallLog::~RefusedCallLog() {
  std::function<void()> summary;
  {
    absl::MutexLock lock(&mu_);
    summary = TakeDroppedSummaryLocked();
  }
  if (summary) summary();
}

void RefusedCallLog::Record(RefusedCall call) {
  std::function<void()> summary;
  {
    absl::MutexLock lock(&mu_);
    ++seen_;
    const absl::Time now = absl::Now();
    tokens_ =
        std::min(static_cast<double>(options_.burst),
                 tokens_ + absl::ToDoubleSeconds(now - refilled_) * options_.records_per_second);
    refilled_ = now;
    // A record that follows dropped ones brings their summary: two records' worth.
    const double needed = unreported_ > 0 ? 2.0 : 1.0;
    if (tokens_ < needed) {
      ++dropped_;
      if (unreported_++ == 0) first_unreported_ = now;
      last_unreported_ = now;
      return;
    }
    tokens_ -= needed;
    ++recorded_;
    summary = TakeDroppedSummaryLocked();
  }
  v1::AuditRecord record;
  record.set_identity(call.identity.empty() ? "unknown" : call.identity);
  record.set_peer(std::move(call.peer));
  record.set_action(std::string(kAuditRefused));
  record.set_model(std::move(call.model));
  std::function<void()> write = [this, summary = std::move(summary), record = std::move(record),
                                 status = std::move(call.status),
                                 method = std::move(call.method)]() mutable {
    if (summary) summary();
    Write(std::move(record), std::move(status), std::move(method));
  };
  if (options_.schedule) {
    options_.schedule(std::move(write));
  } else {
    write();
  }
}

std::function<void()> RefusedCallLog::TakeDroppedSummaryLocked() {
  if (unreported_ == 0) return nullptr;
  v1::AuditRecord record;
  record.set_identity(std::string(kStoreIdentity));
  record.set_peer("local");
  record.set_action(std::string(kAuditRefusalsDropped));
  std::string detail =
      absl::StrCat(unreported_, " refused calls from ", absl::FormatTime(first_unreported_), " to ",
                   absl::FormatTime(last_unreported_),
                   " were not recorded: more were refused than the log records (",
                   options_.records_per_second, " a second, ", options_.burst, " at once)");
  unreported_ = 0;
  return [this, record = std::move(record), detail = std::move(detail)]() mutable {
    Write(std::move(record), absl::OkStatus(), std::move(detail));
  };
}

void RefusedCallLog::Write(v1::AuditRecord record, absl::Status outcome, std::string detail) {
  const std::string action = record.action();
  absl::StatusOr<int64_t> sequence = store_.BeginAudit(std::move(record));
  absl::Status written = sequence.status();
  if (sequence.ok()) written = store_.FinishAudit(*sequence, outcome, detail, /*version=*/0);
  if (!written.ok()) {
    std::cerr << "audit: a '" << action << "' record (" << detail
              << ") could not be written: " << written << "\n";
  }
}

int64_t RefusedCallLog::seen() const {
  absl::MutexLock lock(&mu_);
  return seen_;
}

int64_t RefusedCallLog::recorded() const {
  absl::MutexLock lock(&mu_);
  return recorded_;
}

int64_t RefusedCallLog::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace ckpt
