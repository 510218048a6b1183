// StoreService's model-registry calls: CreateModel, UpdateModel, RenameModel, DeleteModel,
// AnnotateVersion, ListHistory and the Watch stream (see store_service.h).

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libs/auth/access_policy.h"
#include "libs/auth/model_scope.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/audited_store.h"
#include "libs/store/scoped_store.h"
#include "services/checkpoint_store/internal/requests.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt {
namespace {

using store_service_internal::Because;
using store_service_internal::PageSize;

// How long a watch waits for the history between looks at its call's cancellation.
constexpr absl::Duration kWatchPollInterval = absl::Seconds(1);
// A write that takes longer than this was held by flow control (on loopback an unheld write
// completes in microseconds)...
constexpr absl::Duration kHeldWrite = absl::Milliseconds(2);
// ...and once writes were held this long in all since the last look, the client is not keeping
// up, and the watch checks how far behind the history it is. Summed, not per write: a client
// that reads steadily but too slowly holds each write only as long as it takes to read one.
constexpr absl::Duration kHeldWritesBeforeLagCheck = absl::Milliseconds(100);

}  // namespace

grpc::ServerUnaryReactor* StoreService::CreateModel(grpc::CallbackServerContext* context,
                                                    const v1::CreateModelRequest* request,
                                                    v1::ModelInfo* response) {
  return RunUnary(
      context, "CreateModel", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(*response, audited.CreateModel(request->model(), request->details(),
                                                        Because(request->reason())));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::UpdateModel(grpc::CallbackServerContext* context,
                                                    const v1::UpdateModelRequest* request,
                                                    v1::ModelInfo* response) {
  return RunUnary(
      context, "UpdateModel", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(*response, audited.UpdateModel(request->model(), request->change(),
                                                        Because(request->reason())));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::RenameModel(grpc::CallbackServerContext* context,
                                                    const v1::RenameModelRequest* request,
                                                    v1::RenameModelResponse*) {
  return RunUnary(context, "RenameModel", request->model(),
                  [this, request](const Caller& caller, CheckpointStore& store) -> absl::Status {
                    // The scoped store checks the new name too: a rename must not move a model out
                    // of the caller's scope.
                    AuditedStore audited(store, ActorOf(caller));
                    return audited.RenameModel(request->model(), request->new_name(),
                                               Because(request->reason()));
                  });
}

grpc::ServerUnaryReactor* StoreService::DeleteModel(grpc::CallbackServerContext* context,
                                                    const v1::DeleteModelRequest* request,
                                                    v1::DeleteModelResponse* response) {
  return RunUnary(
      context, "DeleteModel", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(*response, audited.DeleteModel(request->model(), request->force(),
                                                        Because(request->reason())));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::AnnotateVersion(grpc::CallbackServerContext* context,
                                                        const v1::AnnotateVersionRequest* request,
                                                        v1::VersionAnnotations* response) {
  return RunUnary(
      context, "AnnotateVersion", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(*response,
                         audited.AnnotateVersion(request->model(), request->version(),
                                                 request->change(), Because(request->reason())));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::ListHistory(grpc::CallbackServerContext* context,
                                                    const v1::ListHistoryRequest* request,
                                                    v1::ListHistoryResponse* response) {
  return RunUnary(
      context, "ListHistory", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        ASSIGN_OR_RETURN(const int page_size, PageSize(request->page_size()));
        if (request->after_sequence() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "after_sequence is ", request->after_sequence(), "; use 0 for the first page"));
        }
        HistoryQuery query;
        query.model = request->model();
        query.alias = request->alias();
        query.after_sequence = request->after_sequence();
        if (request->since_unix_micros() != 0) {
          query.since = absl::FromUnixMicros(request->since_unix_micros());
        }
        // One more than the page: whether it comes back says whether another page follows.
        query.limit = int64_t{page_size} + 1;
        ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> events, store.ListHistory(query));
        if (static_cast<int64_t>(events.size()) > page_size) {
          events.resize(page_size);
          response->set_next_after_sequence(events.back().sequence());
        }
        for (v1::RegistryEvent& event : events) *response->add_events() = std::move(event);
        return absl::OkStatus();
      });
}

// ---------------------------------------------------------------------------------------------
// Watch: a thread of its own runs the store's RegistryWatch and writes each update, one write in
// flight at a time, waiting for it to complete (so memory stays at one message plus the store
// watch's page). The wait for a write is bounded by watch_write_timeout (then the call is
// cancelled), and a slow write triggers the lag check (RESOURCE_EXHAUSTED).
class StoreService::WatchReactor final : public grpc::ServerWriteReactor<v1::WatchResponse> {
 public:
  WatchReactor(StoreService* service, grpc::CallbackServerContext* context,
               const v1::WatchRequest* request)
      : service_(*service), context_(*context) {
    service_.StreamStarted();
    absl::Status started = Start(*request);
    if (!started.ok()) {
      Finish(ToGrpcStatus(started));
      return;
    }
    thread_ = std::thread([this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    write_ok_ = ok;
  }

  void OnCancel() override {
    cancelled_.store(true);
    if (watch_ != nullptr) watch_->Cancel();  // set before the thread started; never reset.
  }

  void OnDone() override {
    if (thread_.joinable()) {
      // The thread's last act was Finish; gRPC may run OnDone inside that call.
      if (thread_.get_id() == std::this_thread::get_id()) {
        thread_.detach();
      } else {
        thread_.join();
      }
    }
    StoreService& service = service_;
    const bool counted = counted_;
    delete this;
    service.WatchDone(counted);
  }

 private:
  absl::Status Start(const v1::WatchRequest& request) {
    ASSIGN_OR_RETURN(caller_, service_.Authorize(context_, "Watch", ""));
    // The scope's refusals (every model watched, or one outside it) come before a watch slot is
    // taken. The store's watch it returns needs nothing of the scoped view, and starts reading
    // only at its first Next.
    ScopedStore scoped(service_.store_, ModelScope(caller_.models), Who(caller_));
    absl::StatusOr<std::unique_ptr<RegistryWatch>> watch = scoped.Watch(request);
    if (!watch.ok()) {
      service_.NoteRefusal(caller_, "Watch", absl::StrJoin(request.models(), ","), watch.status());
      return watch.status();
    }
    watch_ = *std::move(watch);
    RETURN_IF_ERROR(service_.WatchStarted());
    counted_ = true;
    what_ = absl::StrCat("identity '", caller_.identity, "' at ", caller_.peer, " watching ",
                         request.models().empty() ? std::string("every model")
                                                  : absl::StrJoin(request.models(), ", "));
    sent_token_ = request.resume_token();
    return absl::OkStatus();
  }

  // On thread_. Its last statement is Finish, after which `this` may be gone.
  void Run() { Finish(Serve()); }

  grpc::Status Serve() {
    while (!cancelled_.load()) {
      absl::StatusOr<std::optional<v1::WatchResponse>> next =
          watch_->Next(absl::Now() + kWatchPollInterval);
      if (cancelled_.load()) break;
      if (service_.ending_watches_.load()) {
        // Whatever `next` holds was not sent: the client's resume token still points before it.
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("the checkpoint store is shutting down; resume with "
                                         "resume_token ",
                                         sent_token_));
      }
      if (!next.ok()) return ToGrpcStatus(next.status());
      if (!next->has_value()) continue;
      response_ = **std::move(next);
      absl::Status written = Write();
      if (!written.ok()) return ToGrpcStatus(written);
      sent_token_ = response_.resume_token();
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "the watch was cancelled");
  }

  // Writes response_ and waits until the write completed, or until watch_write_timeout passed
  // (then cancels the call). When writes were held by flow control for a while and the watcher
  // is more than watch_max_lag events behind the history, ends the watch.
  absl::Status Write() {
    const absl::Time started = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      writing_ = true;
    }
    StartWrite(&response_);
    bool cut_off = false;
    {
      absl::MutexLock lock(&mu_);
      const auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
      if (!mu_.AwaitWithDeadline(absl::Condition(&written),
                                 started + service_.options_.watch_write_timeout)) {
        cut_off = true;
      }
    }
    if (cut_off) {
      std::fprintf(stderr,
                   "watch cut off: %s has not taken a message for %s (the write is still "
                   "blocked); it may resume with resume_token %lld\n",
                   what_.c_str(),
                   absl::FormatDuration(service_.options_.watch_write_timeout).c_str(),
                   static_cast<long long>(sent_token_));
      service_.WatchCutOff();
      context_.TryCancel();
      // A cancelled call completes its pending write (not ok).
      absl::MutexLock lock(&mu_);
      const auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
      mu_.Await(absl::Condition(&written));
      return absl::CancelledError("the watcher stopped reading");
    }
    {
      absl::MutexLock lock(&mu_);
      if (!write_ok_) return absl::CancelledError("the watcher went away");
    }
    const absl::Duration took = absl::Now() - started;
    if (took < kHeldWrite) return absl::OkStatus();
    held_ += took;
    if (held_ < kHeldWritesBeforeLagCheck) return absl::OkStatus();
    held_ = absl::ZeroDuration();
    // Held by flow control: is the watcher falling further behind than it may?
    const int64_t token = response_.resume_token();
    HistoryQuery beyond;
    beyond.after_sequence = token + service_.options_.watch_max_lag;
    beyond.limit = 1;
    ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> later, service_.store_.ListHistory(beyond));
    if (later.empty()) return absl::OkStatus();
    std::fprintf(stderr,
                 "watch cut off: %s fell more than %lld events behind the history (it reads "
                 "too slowly); it may resume with resume_token %lld\n",
                 what_.c_str(), static_cast<long long>(service_.options_.watch_max_lag),
                 static_cast<long long>(token));
    service_.WatchCutOff();
    return absl::ResourceExhaustedError(absl::StrCat(
        "watcher fell behind the registry's history by more than ", service_.options_.watch_max_lag,
        " events (it reads too slowly); resume with resume_token ", token));
  }

  StoreService& service_;
  grpc::CallbackServerContext& context_;
  Caller caller_;
  bool counted_ = false;  // whether WatchStarted admitted it (WatchDone undoes that).
  std::string what_;      // who watches what, for the log.
  std::unique_ptr<RegistryWatch> watch_;
  std::atomic<bool> cancelled_{false};
  v1::WatchResponse response_;  // the message being written.
  int64_t sent_token_ = 0;      // resume token of the last message written.
  absl::Duration held_;         // time writes were held by flow control since the last lag check.
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  std::thread thread_;
};

grpc::ServerWriteReactor<v1::WatchResponse>* StoreService::Watch(
    grpc::CallbackServerContext* context, const v1::WatchRequest* request) {
  return new WatchReactor(this, context, request);
}

void StoreService::EndWatches() { ending_watches_.store(true); }

absl::Status StoreService::WatchStarted() {
  if (ending_watches_.load()) {
    return absl::UnavailableError("the checkpoint store is shutting down; watch again later");
  }
  absl::MutexLock lock(&mu_);
  if (active_watches_ >= options_.max_watches) {
    return absl::ResourceExhaustedError(absl::StrCat("this checkpoint store serves at most ",
                                                     options_.max_watches,
                                                     " watches at once; try again later"));
  }
  ++active_watches_;
  return absl::OkStatus();
}

void StoreService::WatchDone(bool counted) {
  absl::MutexLock lock(&mu_);
  if (counted) --active_watches_;
  --active_streams_;
}

void StoreService::WatchCutOff() {
  absl::MutexLock lock(&mu_);
  ++watches_cut_off_;
}

int StoreService::active_watches() const {
  absl::MutexLock lock(&mu_);
  return active_watches_;
}

int64_t StoreService::watches_cut_off() const {
  absl::MutexLock lock(&mu_);
  return watches_cut_off_;
}

}  // namespace ckpt
