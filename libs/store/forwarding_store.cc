#include "libs/store/forwarding_store.h"

#include <utility>

#include "libs/status/status_macros.h"

namespace ckpt {

// Aliasing constructor with no owner: a shared_ptr that never deletes `inner`.
ForwardingStore::ForwardingStore(CheckpointStore* inner)
    : inner_(std::shared_ptr<CheckpointStore>(std::shared_ptr<void>(), inner)) {}

ForwardingStore::ForwardingStore(std::unique_ptr<CheckpointStore> inner)
    : inner_(std::move(inner)) {}

ForwardingStore::~ForwardingStore() = default;

absl::Duration ForwardingStore::CommitRetryWindow() const { return inner_->CommitRetryWindow(); }

absl::StatusOr<std::unique_ptr<UploadSession>> ForwardingStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  return inner_->BeginUpload(model, std::move(header), options);
}

absl::StatusOr<std::unique_ptr<UploadPart>> ForwardingStore::JoinUpload(
    absl::string_view upload_id, std::vector<UploadRange> ranges) {
  return inner_->JoinUpload(upload_id, std::move(ranges));
}

absl::StatusOr<std::vector<std::string>> ForwardingStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  return inner_->FindMissingChunks(sha256s);
}

absl::StatusOr<v1::Manifest> ForwardingStore::GetManifest(const v1::VersionRef& ref) {
  return inner_->GetManifest(ref);
}

absl::StatusOr<std::unique_ptr<VersionReader>> ForwardingStore::OpenVersion(
    const v1::VersionRef& ref) {
  return inner_->OpenVersion(ref);
}

absl::Status ForwardingStore::ReadTensorChunks(const v1::TensorMeta& meta,
                                               const ChunkCallback& callback) {
  return inner_->ReadTensorChunks(meta, callback);
}

absl::StatusOr<std::vector<v1::ModelInfo>> ForwardingStore::ListModels() {
  return inner_->ListModels();
}

absl::StatusOr<std::vector<v1::VersionInfo>> ForwardingStore::ListVersions(
    absl::string_view model) {
  return inner_->ListVersions(model);
}

absl::StatusOr<int64_t> ForwardingStore::SetAlias(absl::string_view model, absl::string_view alias,
                                                  int64_t version, int64_t expected_current_version,
                                                  const ChangeAttribution& attribution) {
  return inner_->SetAlias(model, alias, version, expected_current_version, attribution);
}

absl::Status ForwardingStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                          const ChangeAttribution& attribution) {
  return inner_->DeleteAlias(model, alias, attribution);
}

absl::StatusOr<int64_t> ForwardingStore::DeleteVersion(absl::string_view model, int64_t version,
                                                       bool force,
                                                       const ChangeAttribution& attribution) {
  return inner_->DeleteVersion(model, version, force, attribution);
}

absl::StatusOr<v1::ApplyRetentionResponse> ForwardingStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  return inner_->ApplyRetention(model, policy, dry_run, attribution);
}

absl::StatusOr<v1::GarbageCollectResponse> ForwardingStore::GarbageCollect(bool dry_run) {
  return inner_->GarbageCollect(dry_run);
}

absl::StatusOr<v1::VerifyResponse> ForwardingStore::Verify(absl::string_view model,
                                                           int64_t version) {
  return inner_->Verify(model, version);
}

absl::StatusOr<v1::StoreStats> ForwardingStore::GetStats() { return inner_->GetStats(); }

absl::StatusOr<int64_t> ForwardingStore::BeginAudit(v1::AuditRecord record) {
  return inner_->BeginAudit(std::move(record));
}

absl::Status ForwardingStore::FinishAudit(int64_t sequence, const absl::Status& outcome,
                                          absl::string_view detail, int64_t version) {
  return inner_->FinishAudit(sequence, outcome, detail, version);
}

absl::StatusOr<std::vector<v1::AuditRecord>> ForwardingStore::ListAudit(const AuditQuery& query) {
  return inner_->ListAudit(query);
}

absl::StatusOr<v1::ModelInfo> ForwardingStore::CreateModel(absl::string_view model,
                                                           const v1::ModelDetails& details,
                                                           const ChangeAttribution& attribution) {
  return inner_->CreateModel(model, details, attribution);
}

absl::StatusOr<v1::ModelInfo> ForwardingStore::UpdateModel(absl::string_view model,
                                                           const v1::ModelDetailsChange& change,
                                                           const ChangeAttribution& attribution) {
  return inner_->UpdateModel(model, change, attribution);
}

absl::Status ForwardingStore::RenameModel(absl::string_view model, absl::string_view new_name,
                                          const ChangeAttribution& attribution) {
  return inner_->RenameModel(model, new_name, attribution);
}

absl::StatusOr<v1::DeleteModelResponse> ForwardingStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  return inner_->DeleteModel(model, force, attribution);
}

absl::StatusOr<v1::VersionAnnotations> ForwardingStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  return inner_->AnnotateVersion(model, version, change, attribution);
}

absl::StatusOr<std::vector<v1::RegistryEvent>> ForwardingStore::ListHistory(
    const HistoryQuery& query) {
  return inner_->ListHistory(query);
}

absl::StatusOr<RegistryState> ForwardingStore::GetRegistryState(
    const std::vector<std::string>& models) {
  return inner_->GetRegistryState(models);
}

absl::StatusOr<bool> ForwardingStore::WaitForHistory(int64_t after_sequence, absl::Time deadline) {
  return inner_->WaitForHistory(after_sequence, deadline);
}

absl::StatusOr<std::unique_ptr<RegistryWatch>> ForwardingStore::Watch(
    const v1::WatchRequest& request) {
  return inner_->Watch(request);
}

// ---------------------------------------------------------------------------------------------

ForwardingUploadSession::ForwardingUploadSession(std::unique_ptr<UploadSession> base)
    : base_(std::move(base)) {}

ForwardingUploadSession::~ForwardingUploadSession() = default;

const v1::Manifest& ForwardingUploadSession::header() const { return base_->header(); }

int ForwardingUploadSession::tensor_count() const { return base_->tensor_count(); }

const std::vector<std::string>& ForwardingUploadSession::warnings() const {
  return base_->warnings();
}

absl::Status ForwardingUploadSession::AddTensorData(int tensor_index, int64_t offset,
                                                    absl::string_view bytes) {
  RETURN_IF_ERROR(failure_);
  return base_->AddTensorData(tensor_index, offset, bytes);
}

absl::Status ForwardingUploadSession::AddStableTensorData(int tensor_index, int64_t offset,
                                                          absl::string_view bytes) {
  RETURN_IF_ERROR(failure_);
  return base_->AddStableTensorData(tensor_index, offset, bytes);
}

absl::Status ForwardingUploadSession::AddStoredChunk(int tensor_index, int64_t offset,
                                                     absl::string_view sha256, int64_t length) {
  RETURN_IF_ERROR(failure_);
  return base_->AddStoredChunk(tensor_index, offset, sha256, length);
}

absl::StatusOr<CommitResult> ForwardingUploadSession::Commit() {
  RETURN_IF_ERROR(failure_);
  return base_->Commit();
}

std::string ForwardingUploadSession::upload_id() const { return base_->upload_id(); }

absl::Status ForwardingUploadSession::Fail(absl::Status error) {
  // Fail(OK) is a decorator's bug: latch an INTERNAL error rather than let the session go on as
  // if nothing had been refused.
  if (error.ok()) {
    error = absl::InternalError("ForwardingUploadSession::Fail was given OK");
  }
  failure_ = error;
  return error;
}

}  // namespace ckpt
