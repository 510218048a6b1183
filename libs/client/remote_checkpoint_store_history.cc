// RemoteCheckpointStore's model-registry methods (see remote_checkpoint_store.h): the registry's
// unary calls and the Watch stream, which resumes across server restarts.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/io/backoff.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {
namespace {

using Stub = v1::CheckpointStore::Stub;

// Messages a watch reads ahead of its caller: enough to smooth bursts, few enough that a caller
// who stops calling Next soon stops the server through flow control.
constexpr size_t kWatchBuffer = 16;

// One unary call of `method`, named `name`, within the client's deadline: sent once after the
// channel is connected, or retried on UNAVAILABLE when `name` only reads (ReadOnlyMethods in
// remote_checkpoint_store.cc): ClientChannel::CallUnary decides.
template <typename Request, typename Response>
absl::Status Call(const ClientChannel& channel, Stub& stub, absl::string_view name,
                  grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                  const Request& request, Response* response) {
  return channel.CallUnary(name, channel.options().deadline, [&](grpc::ClientContext* context) {
    response->Clear();
    return (stub.*method)(context, request, response);
  });
}

// Names as a local store checks them, so a bad request fails from Watch itself.
absl::Status ValidateWatchRequest(const v1::WatchRequest& request) {
  for (const std::string& model : request.models()) RETURN_IF_ERROR(ValidateModelName(model));
  for (const std::string& alias : request.aliases()) {
    if (alias != kLatestAlias) RETURN_IF_ERROR(ValidateAliasName(alias));
  }
  if (request.resume_token() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a watch's resume token is never negative; got ", request.resume_token()));
  }
  return absl::OkStatus();
}

// One Watch, kept going across server restarts. A reader thread reads the stream into buffer_;
// Next takes from it. When the stream breaks with UNAVAILABLE the thread waits for the channel
// and opens a new stream resuming after the last message it read, so buffer_ continues exactly.
class RemoteWatch final : public RegistryWatch {
 public:
  RemoteWatch(std::shared_ptr<ClientChannel> channel, std::shared_ptr<Stub> stub,
              v1::WatchRequest request)
      : channel_(std::move(channel)), stub_(std::move(stub)), request_(std::move(request)) {
    thread_ = std::thread([this] { ReadStreams(); });
  }

  ~RemoteWatch() override {
    Cancel();
    thread_.join();
  }

  absl::StatusOr<std::optional<v1::WatchResponse>> Next(absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !buffer_.empty() || ended_.has_value() || cancelled_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (cancelled_) return absl::CancelledError("the watch was cancelled");
    if (!buffer_.empty()) {
      v1::WatchResponse response = std::move(buffer_.front());
      buffer_.pop_front();
      return std::optional<v1::WatchResponse>(std::move(response));
    }
    if (ended_.has_value()) return *ended_;
    return std::optional<v1::WatchResponse>();
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }

 private:
  // On thread_: streams until one ends with something other than UNAVAILABLE, or reconnecting
  // fails; then sets ended_.
  void ReadStreams() {
    const ClientOptions& options = channel_->options();
    int failures = 0;  // streams in a row that broke before delivering anything.
    // A watch has no deadline of its own; each wait is capped like every other retry's.
    Backoff backoff = channel_->RetryBackoff(absl::InfiniteFuture());
    while (true) {
      auto context = std::shared_ptr<grpc::ClientContext>(
          channel_->NewContext(absl::InfiniteFuture()).release());
      v1::WatchRequest request = request_;
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return EndLocked(absl::CancelledError("the watch was cancelled"));
        // Once anything was read (a state may carry token 0), continue after it, never from a
        // second state.
        if (read_any_) {
          request.set_resume_token(last_token_);
          request.set_resume(true);
        }
        context_ = context;
      }
      std::unique_ptr<grpc::ClientReader<v1::WatchResponse>> reader =
          stub_->Watch(context.get(), request);
      bool delivered = false;
      v1::WatchResponse response;
      while (reader->Read(&response)) {
        delivered = true;
        absl::MutexLock lock(&mu_);
        const auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return buffer_.size() < kWatchBuffer || cancelled_;
        };
        mu_.Await(absl::Condition(&room));
        if (cancelled_) break;
        last_token_ = response.resume_token();
        read_any_ = true;
        buffer_.push_back(std::move(response));
        response = v1::WatchResponse();
      }
      const grpc::Status status = reader->Finish();
      {
        absl::MutexLock lock(&mu_);
        context_.reset();
        if (cancelled_) return EndLocked(absl::CancelledError("the watch was cancelled"));
      }
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
        return End(status.ok() ? absl::InternalError(absl::StrCat("the ", channel_->ServerName(),
                                                                  " ended a watch without error"))
                               : channel_->FromCall(status));
      }
      // The server went away: resume once it is back.
      if (delivered) {
        failures = 0;
        backoff.Reset();
      }
      if (++failures > options.max_retries) return End(channel_->FromCall(status));
      backoff.Wait();
      absl::Status connected = channel_->WaitUntilConnected(absl::Now() + options.connect_timeout);
      if (!connected.ok()) return End(connected);
    }
  }

  void End(absl::Status status) {
    absl::MutexLock lock(&mu_);
    EndLocked(std::move(status));
  }
  void EndLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ended_ = std::move(status);
  }

  const std::shared_ptr<ClientChannel> channel_;
  const std::shared_ptr<Stub> stub_;
  const v1::WatchRequest request_;
  absl::Mutex mu_;
  std::deque<v1::WatchResponse> buffer_ ABSL_GUARDED_BY(mu_);  // read, not yet taken by Next.
  int64_t last_token_ ABSL_GUARDED_BY(mu_) = 0;                // of the last message read.
  bool read_any_ ABSL_GUARDED_BY(mu_) = false;                 // whether a message was read.
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);     // how the watch ended.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);  // the open stream's.
  std::thread thread_;
};

}  // namespace

absl::StatusOr<v1::ModelInfo> RemoteCheckpointStore::CreateModel(
    absl::string_view model, const v1::ModelDetails& details,
    const ChangeAttribution& attribution) {
  v1::CreateModelRequest request;
  request.set_model(std::string(model));
  *request.mutable_details() = details;
  request.set_reason(attribution.reason);
  v1::ModelInfo response;
  RETURN_IF_ERROR(Call(*channel_, *stub_, "CreateModel", &Stub::CreateModel, request, &response));
  return response;
}

absl::StatusOr<v1::ModelInfo> RemoteCheckpointStore::UpdateModel(
    absl::string_view model, const v1::ModelDetailsChange& change,
    const ChangeAttribution& attribution) {
  v1::UpdateModelRequest request;
  request.set_model(std::string(model));
  *request.mutable_change() = change;
  request.set_reason(attribution.reason);
  v1::ModelInfo response;
  RETURN_IF_ERROR(Call(*channel_, *stub_, "UpdateModel", &Stub::UpdateModel, request, &response));
  return response;
}

absl::Status RemoteCheckpointStore::RenameModel(absl::string_view model, absl::string_view new_name,
                                                const ChangeAttribution& attribution) {
  v1::RenameModelRequest request;
  request.set_model(std::string(model));
  request.set_new_name(std::string(new_name));
  request.set_reason(attribution.reason);
  v1::RenameModelResponse response;
  return Call(*channel_, *stub_, "RenameModel", &Stub::RenameModel, request, &response);
}

absl::StatusOr<v1::DeleteModelResponse> RemoteCheckpointStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  v1::DeleteModelRequest request;
  request.set_model(std::string(model));
  request.set_force(force);
  request.set_reason(attribution.reason);
  v1::DeleteModelResponse response;
  RETURN_IF_ERROR(Call(*channel_, *stub_, "DeleteModel", &Stub::DeleteModel, request, &response));
  return response;
}

absl::StatusOr<v1::VersionAnnotations> RemoteCheckpointStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  v1::AnnotateVersionRequest request;
  request.set_model(std::string(model));
  request.set_version(version);
  *request.mutable_change() = change;
  request.set_reason(attribution.reason);
  v1::VersionAnnotations response;
  RETURN_IF_ERROR(
      Call(*channel_, *stub_, "AnnotateVersion", &Stub::AnnotateVersion, request, &response));
  return response;
}

absl::StatusOr<std::vector<v1::RegistryEvent>> RemoteCheckpointStore::ListHistory(
    const HistoryQuery& query) {
  if (query.after_sequence < 0 || query.limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("history query: after_sequence (",
                                                   query.after_sequence, ") and limit (",
                                                   query.limit, ") must not be negative"));
  }
  std::vector<v1::RegistryEvent> events;
  v1::ListHistoryRequest request;
  request.set_model(query.model);
  request.set_alias(query.alias);
  request.set_since_unix_micros(
      query.since == absl::InfinitePast() ? 0 : absl::ToUnixMicros(query.since));
  request.set_after_sequence(query.after_sequence);
  while (true) {
    const int64_t wanted =
        query.limit > 0 ? query.limit - static_cast<int64_t>(events.size()) : int64_t{kMaxPageSize};
    request.set_page_size(static_cast<int32_t>(std::min<int64_t>(wanted, kMaxPageSize)));
    v1::ListHistoryResponse response;
    RETURN_IF_ERROR(Call(*channel_, *stub_, "ListHistory", &Stub::ListHistory, request, &response));
    for (v1::RegistryEvent& event : *response.mutable_events()) events.push_back(std::move(event));
    if (response.next_after_sequence() == 0) break;
    if (response.next_after_sequence() <= request.after_sequence()) {
      return absl::InternalError(absl::StrCat("ListHistory returned next_after_sequence ",
                                              response.next_after_sequence(), " for a page after ",
                                              request.after_sequence()));
    }
    if (query.limit > 0 && static_cast<int64_t>(events.size()) >= query.limit) break;
    request.set_after_sequence(response.next_after_sequence());
  }
  return events;
}

absl::StatusOr<RegistryState> RemoteCheckpointStore::GetRegistryState(
    const std::vector<std::string>& models) {
  v1::WatchRequest request;
  for (const std::string& model : models) request.add_models(model);
  RETURN_IF_ERROR(ValidateWatchRequest(request));
  v1::WatchResponse response;
  RETURN_IF_ERROR(channel_->RestartOnUnavailable(
      channel_->options().deadline, [&](std::unique_ptr<grpc::ClientContext> context) {
        std::unique_ptr<grpc::ClientReader<v1::WatchResponse>> reader =
            stub_->Watch(context.get(), request);
        const bool read = reader->Read(&response);
        // The state is all this needs; the rest of the stream is not wanted.
        if (read) context->TryCancel();
        const grpc::Status status = reader->Finish();
        if (read && response.has_state()) return absl::OkStatus();
        if (!status.ok()) return channel_->FromCall(status);
        return absl::InternalError(
            absl::StrCat("the ", channel_->ServerName(), " began a watch without its state"));
      }));
  RegistryState state;
  state.sequence = response.resume_token();
  for (v1::ModelInfo& model : *response.mutable_state()->mutable_models()) {
    state.models.push_back(std::move(model));
  }
  return state;
}

absl::StatusOr<bool> RemoteCheckpointStore::WaitForHistory(int64_t after_sequence,
                                                           absl::Time deadline) {
  if (after_sequence < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("after_sequence is never negative; got ", after_sequence));
  }
  // Already there? (Also the answer when the deadline has passed.)
  HistoryQuery probe;
  probe.after_sequence = after_sequence;
  probe.limit = 1;
  ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> events, ListHistory(probe));
  if (!events.empty()) return true;
  if (absl::Now() >= deadline) return false;
  // A watch resuming after it: nothing between the probe and the stream is missed. A token of
  // 0 asks for the state first, whose token says whether any event exists.
  v1::WatchRequest request;
  request.set_resume_token(after_sequence);
  std::unique_ptr<grpc::ClientContext> context = channel_->NewContext(deadline);
  std::unique_ptr<grpc::ClientReader<v1::WatchResponse>> reader =
      stub_->Watch(context.get(), request);
  bool found = false;
  v1::WatchResponse response;
  while (reader->Read(&response)) {
    if (response.has_event() || response.resume_token() > after_sequence) {
      found = true;
      context->TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  if (found) return true;
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return false;
  if (status.ok()) {
    return absl::InternalError(
        absl::StrCat("the ", channel_->ServerName(), " ended a watch without error"));
  }
  return channel_->FromCall(status);
}

absl::StatusOr<std::unique_ptr<RegistryWatch>> RemoteCheckpointStore::Watch(
    const v1::WatchRequest& request) {
  RETURN_IF_ERROR(ValidateWatchRequest(request));
  return std::unique_ptr<RegistryWatch>(new RemoteWatch(channel_, stub_, request));
}

}  // namespace ckpt
