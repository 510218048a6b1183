// CheckpointStore's registry conveniences built on its virtual methods: FindVersions and the
// default Watch (see checkpoint_store.h).

#include <algorithm>
#include <atomic>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/version_filter.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

// Events read from the history per ListHistory call: what bounds a watch's memory.
constexpr int64_t kWatchPageSize = 256;
// How often a waiting watch looks at its Cancel flag.
constexpr absl::Duration kCancelPollInterval = absl::Milliseconds(100);

// Whether a watch of `request` reports `event`.
bool WatchReports(const v1::WatchRequest& request, const v1::RegistryEvent& event) {
  if (request.models_size() > 0) {
    const bool watched = std::any_of(
        request.models().begin(), request.models().end(), [&](const std::string& model) {
          return model == event.model() ||
                 (event.kind() == v1::RegistryEvent::MODEL_RENAMED && model == event.new_name());
        });
    if (!watched) return false;
  }
  const bool alias_event = event.kind() == v1::RegistryEvent::ALIAS_SET ||
                           event.kind() == v1::RegistryEvent::ALIAS_DELETED;
  if (alias_event && request.aliases_size() > 0) {
    return std::find(request.aliases().begin(), request.aliases().end(), event.alias()) !=
           request.aliases().end();
  }
  return true;
}

class HistoryWatch final : public RegistryWatch {
 public:
  HistoryWatch(CheckpointStore& store, v1::WatchRequest request)
      : store_(store),
        request_(std::move(request)),
        last_read_(request_.resume_token()),
        state_due_(request_.resume_token() == 0 && !request_.resume()) {}

  absl::StatusOr<std::optional<v1::WatchResponse>> Next(absl::Time deadline) override {
    if (state_due_) {
      if (cancelled_.load()) return Cancelled();
      ASSIGN_OR_RETURN(RegistryState state, store_.GetRegistryState({request_.models().begin(),
                                                                     request_.models().end()}));
      state_due_ = false;
      last_read_ = state.sequence;
      v1::WatchResponse response;
      v1::WatchState& watched = *response.mutable_state();  // set even when no model exists.
      for (v1::ModelInfo& model : state.models) *watched.add_models() = std::move(model);
      response.set_resume_token(state.sequence);
      return response;
    }
    while (true) {
      if (cancelled_.load()) return Cancelled();
      if (!pending_.empty()) {
        v1::WatchResponse response;
        *response.mutable_event() = std::move(pending_.front());
        pending_.pop_front();
        response.set_resume_token(response.event().sequence());
        return response;
      }
      // Unfiltered: the history is keyed by sequence alone, so a model filter would scan the
      // same events, and a rename into a watched name is an event of the old name.
      HistoryQuery query;
      query.after_sequence = last_read_;
      query.limit = kWatchPageSize;
      ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> events, store_.ListHistory(query));
      if (!events.empty()) {
        last_read_ = events.back().sequence();
        for (v1::RegistryEvent& event : events) {
          if (WatchReports(request_, event)) pending_.push_back(std::move(event));
        }
        continue;
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) return std::nullopt;
      ASSIGN_OR_RETURN(bool more, store_.WaitForHistory(
                                      last_read_, std::min(deadline, now + kCancelPollInterval)));
      (void)more;  // either way: read again, or look at the deadline and the flag.
    }
  }

  void Cancel() override { cancelled_.store(true); }

 private:
  static absl::Status Cancelled() { return absl::CancelledError("the watch was cancelled"); }

  CheckpointStore& store_;
  const v1::WatchRequest request_;
  int64_t last_read_;  // sequence of the newest event read from the history (sent or skipped).
  bool state_due_;
  std::deque<v1::RegistryEvent> pending_;  // at most one page.
  std::atomic<bool> cancelled_{false};
};

}  // namespace

absl::StatusOr<std::vector<v1::VersionInfo>> CheckpointStore::FindVersions(
    absl::string_view model, const v1::VersionFilter& filter) {
  RETURN_IF_ERROR(ValidateVersionFilter(filter));
  ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> versions, ListVersions(model));
  versions.erase(std::remove_if(versions.begin(), versions.end(),
                                [&](const v1::VersionInfo& info) {
                                  return !MatchesVersionFilter(info, filter);
                                }),
                 versions.end());
  return versions;
}

absl::StatusOr<std::unique_ptr<RegistryWatch>> CheckpointStore::Watch(
    const v1::WatchRequest& request) {
  for (const std::string& model : request.models()) RETURN_IF_ERROR(ValidateModelName(model));
  for (const std::string& alias : request.aliases()) {
    if (alias != kLatestAlias) RETURN_IF_ERROR(ValidateAliasName(alias));
  }
  if (request.resume_token() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a watch's resume token is never negative; got ", request.resume_token()));
  }
  return std::unique_ptr<RegistryWatch>(new HistoryWatch(*this, request));
}

}  // namespace ckpt
