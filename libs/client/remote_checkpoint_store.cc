// RemoteCheckpointStore: connecting, and the unary calls -- listing, aliases, deletes, retention,
// GC, verify, stats and the audit log (see internal/remote_store_connection.h for how the remote
// store's files divide).

#include "libs/client/remote_checkpoint_store.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/client/internal/remote_store_connection.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/status_macros.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {
namespace {

// Listing pages asked for: the service's maximum (libs/rpc/wire_constants.h).
constexpr int kListPageSize = kMaxPageSize;

using Stub = v1::CheckpointStore::Stub;

}  // namespace

// The store's methods that only read: ClientChannel::CallUnary retries these on UNAVAILABLE;
// every other call may have changed the store and is sent once.
const std::vector<std::string>& ReadOnlyMethods() {
  static const auto* methods = new std::vector<std::string>{
      "FindMissingChunks", "ListModels", "ListVersions", "GetManifest", "Verify",
      "GetStats",          "ListAudit",  "ListHistory"};
  return *methods;
}

using Connection = RemoteCheckpointStore::Connection;

absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> RemoteCheckpointStore::Connect(
    const RemoteStoreOptions& options) {
  if (options.max_receive_message_bytes <= kMaxTensorDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RemoteStoreOptions.max_receive_message_bytes must exceed ", kMaxTensorDataBytes,
        " (a TensorData message), got ", options.max_receive_message_bytes));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<ClientChannel> channel,
      ClientChannel::Open(options, {std::string(v1::CheckpointStore::service_full_name()),
                                    "checkpoint store", ReadOnlyMethods()}));
  auto connection = std::make_shared<Connection>(channel);
  return std::unique_ptr<RemoteCheckpointStore>(
      new RemoteCheckpointStore(std::move(connection), std::move(channel)));
}

RemoteCheckpointStore::RemoteCheckpointStore(std::shared_ptr<Connection> connection,
                                             std::shared_ptr<ClientChannel> channel)
    : connection_(std::move(connection)),
      channel_(std::move(channel)),
      stub_(v1::CheckpointStore::NewStub(channel_->channel())) {}

RemoteCheckpointStore::~RemoteCheckpointStore() = default;

const std::string& RemoteCheckpointStore::address() const { return connection_->options().address; }

absl::Duration RemoteCheckpointStore::CommitRetryWindow() const {
  return connection_->options().connect_timeout;
}

absl::StatusOr<std::vector<std::string>> RemoteCheckpointStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  v1::FindMissingChunksRequest request;
  for (const std::string& sha256 : sha256s) request.add_sha256(sha256);
  v1::FindMissingChunksResponse response;
  RETURN_IF_ERROR(connection_->Call("FindMissingChunks", &Stub::FindMissingChunks, request,
                                    &response, connection_->options().deadline));
  return std::vector<std::string>(response.missing_sha256().begin(),
                                  response.missing_sha256().end());
}

absl::StatusOr<v1::Manifest> RemoteCheckpointStore::GetManifest(const v1::VersionRef& ref) {
  v1::GetManifestRequest request;
  *request.mutable_ref() = ref;
  v1::Manifest manifest;
  RETURN_IF_ERROR(connection_->Call("GetManifest", &Stub::GetManifest, request, &manifest,
                                    connection_->options().deadline));
  return manifest;
}

absl::StatusOr<std::vector<v1::ModelInfo>> RemoteCheckpointStore::ListModels() {
  std::vector<v1::ModelInfo> models;
  v1::ListModelsRequest request;
  request.set_page_size(kListPageSize);
  do {
    v1::ListModelsResponse response;
    RETURN_IF_ERROR(connection_->Call("ListModels", &Stub::ListModels, request, &response,
                                      connection_->options().deadline));
    for (v1::ModelInfo& model : *response.mutable_models()) models.push_back(std::move(model));
    if (!response.next_page_token().empty() && response.next_page_token() == request.page_token()) {
      return absl::InternalError("ListModels returned the same page token twice");
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return models;
}

absl::StatusOr<std::vector<v1::VersionInfo>> RemoteCheckpointStore::ListVersions(
    absl::string_view model) {
  std::vector<v1::VersionInfo> versions;
  v1::ListVersionsRequest request;
  request.set_model(std::string(model));
  request.set_page_size(kListPageSize);
  do {
    v1::ListVersionsResponse response;
    RETURN_IF_ERROR(connection_->Call("ListVersions", &Stub::ListVersions, request, &response,
                                      connection_->options().deadline));
    for (v1::VersionInfo& version : *response.mutable_versions()) {
      versions.push_back(std::move(version));
    }
    if (!response.next_page_token().empty() && response.next_page_token() == request.page_token()) {
      return absl::InternalError("ListVersions returned the same page token twice");
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return versions;
}

absl::StatusOr<int64_t> RemoteCheckpointStore::SetAlias(absl::string_view model,
                                                        absl::string_view alias, int64_t version,
                                                        int64_t expected_current_version,
                                                        const ChangeAttribution& attribution) {
  v1::SetAliasRequest request;
  request.set_reason(attribution.reason);
  request.set_model(std::string(model));
  request.set_alias(std::string(alias));
  request.set_version(version);
  request.set_expected_current_version(expected_current_version);
  v1::SetAliasResponse response;
  RETURN_IF_ERROR(connection_->Call("SetAlias", &Stub::SetAlias, request, &response,
                                    connection_->options().deadline));
  return response.previous_version();
}

absl::Status RemoteCheckpointStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                                const ChangeAttribution& attribution) {
  v1::DeleteAliasRequest request;
  request.set_reason(attribution.reason);
  request.set_model(std::string(model));
  request.set_alias(std::string(alias));
  v1::DeleteAliasResponse response;
  return connection_->Call("DeleteAlias", &Stub::DeleteAlias, request, &response,
                           connection_->options().deadline);
}

absl::StatusOr<int64_t> RemoteCheckpointStore::DeleteVersion(absl::string_view model,
                                                             int64_t version, bool force,
                                                             const ChangeAttribution& attribution) {
  v1::DeleteVersionRequest request;
  request.set_reason(attribution.reason);
  request.set_model(std::string(model));
  request.set_version(version);
  request.set_force(force);
  v1::DeleteVersionResponse response;
  RETURN_IF_ERROR(connection_->Call("DeleteVersion", &Stub::DeleteVersion, request, &response,
                                    connection_->options().deadline));
  return response.bytes_released();
}

absl::StatusOr<v1::ApplyRetentionResponse> RemoteCheckpointStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  v1::ApplyRetentionRequest request;
  request.set_model(std::string(model));
  *request.mutable_policy() = policy;
  request.set_dry_run(dry_run);
  request.set_reason(attribution.reason);
  v1::ApplyRetentionResponse response;
  RETURN_IF_ERROR(connection_->Call("ApplyRetention", &Stub::ApplyRetention, request, &response,
                                    connection_->options().stream_deadline));
  return response;
}

absl::StatusOr<v1::GarbageCollectResponse> RemoteCheckpointStore::GarbageCollect(bool dry_run) {
  v1::GarbageCollectRequest request;
  request.set_dry_run(dry_run);
  v1::GarbageCollectResponse response;
  RETURN_IF_ERROR(connection_->Call("GarbageCollect", &Stub::GarbageCollect, request, &response,
                                    connection_->options().stream_deadline));
  return response;
}

absl::StatusOr<v1::VerifyResponse> RemoteCheckpointStore::Verify(absl::string_view model,
                                                                 int64_t version) {
  v1::VerifyRequest request;
  request.set_model(std::string(model));
  request.set_version(version);
  v1::VerifyResponse response;
  RETURN_IF_ERROR(connection_->Call("Verify", &Stub::Verify, request, &response,
                                    connection_->options().stream_deadline));
  return response;
}

absl::StatusOr<v1::StoreStats> RemoteCheckpointStore::GetStats() {
  v1::GetStatsRequest request;
  v1::StoreStats stats;
  RETURN_IF_ERROR(connection_->Call("GetStats", &Stub::GetStats, request, &stats,
                                    connection_->options().deadline));
  return stats;
}

absl::StatusOr<int64_t> RemoteCheckpointStore::BeginAudit(v1::AuditRecord record) {
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot write the audit record of a '", record.action(), "' call to the store at ", address(),
      ": a store server records its own audit of the calls made to it, naming the caller it "
      "authenticated, so a client must not write records on anyone's behalf; make the call "
      "itself instead"));
}

absl::Status RemoteCheckpointStore::FinishAudit(int64_t sequence, const absl::Status&,
                                                absl::string_view, int64_t) {
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot finish audit record ", sequence, " of the store at ", address(),
      ": a store server records its own audit of the calls made to it; a client writes none"));
}

absl::StatusOr<std::vector<v1::AuditRecord>> RemoteCheckpointStore::ListAudit(
    const AuditQuery& query) {
  if (query.after_sequence < 0 || query.limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("audit query: after_sequence (",
                                                   query.after_sequence, ") and limit (",
                                                   query.limit, ") must not be negative"));
  }
  std::vector<v1::AuditRecord> records;
  v1::ListAuditRequest request;
  request.set_model(query.model);
  request.set_since_unix_micros(
      query.since == absl::InfinitePast() ? 0 : absl::ToUnixMicros(query.since));
  request.set_after_sequence(query.after_sequence);
  while (true) {
    const int64_t wanted = query.limit > 0 ? query.limit - static_cast<int64_t>(records.size())
                                           : int64_t{kListPageSize};
    request.set_page_size(static_cast<int32_t>(std::min<int64_t>(wanted, kListPageSize)));
    v1::ListAuditResponse response;
    RETURN_IF_ERROR(connection_->Call("ListAudit", &Stub::ListAudit, request, &response,
                                      connection_->options().deadline));
    for (v1::AuditRecord& record : *response.mutable_records()) {
      records.push_back(std::move(record));
    }
    if (response.next_after_sequence() == 0) break;
    if (response.next_after_sequence() <= request.after_sequence()) {
      return absl::InternalError(absl::StrCat("ListAudit returned next_after_sequence ",
                                              response.next_after_sequence(), " for a page after ",
                                              request.after_sequence()));
    }
    if (query.limit > 0 && static_cast<int64_t>(records.size()) >= query.limit) break;
    request.set_after_sequence(response.next_after_sequence());
  }
  return records;
}

}  // namespace ckpt
