#include "libs/store/testing/instrumented_store.h"

#include <utility>

#include "libs/status/status_macros.h"

namespace ckpt {

class InstrumentedStore::Reader final : public VersionReader {
 public:
  Reader(const InstrumentedStore& store, std::unique_ptr<VersionReader> base)
      : store_(store), base_(std::move(base)) {}

  const v1::Manifest& manifest() const override { return base_->manifest(); }

  absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                const ChunkCallback& callback) const override {
    store_.Called("ReadTensorChunks");
    store_.reader_chunk_reads_.fetch_add(1);
    if (store_.read_fault_) RETURN_IF_ERROR(store_.read_fault_("ReadTensorChunks"));
    return base_->ReadTensorChunks(meta, callback);
  }

  absl::Status ReadTensorRange(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                               char* destination) const override {
    store_.Called("ReadTensorRange");
    return base_->ReadTensorRange(meta, begin, end, destination);
  }

 private:
  const InstrumentedStore& store_;
  const std::unique_ptr<VersionReader> base_;
};

class InstrumentedStore::Session final : public ForwardingUploadSession {
 public:
  Session(InstrumentedStore& store, std::unique_ptr<UploadSession> base)
      : ForwardingUploadSession(std::move(base)), store_(store) {}

  absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) override {
    store_.Called("AddTensorData");
    absl::Status added = ForwardingUploadSession::AddTensorData(tensor_index, offset, bytes);
    store_.uploaded_bytes_.fetch_add(static_cast<int64_t>(bytes.size()));
    return added;
  }

  // Hooked and counted as AddTensorData, and stored before it returns: a test that holds
  // "AddTensorData" holds every byte of the upload there.
  absl::Status AddStableTensorData(int tensor_index, int64_t offset,
                                   absl::string_view bytes) override {
    return AddTensorData(tensor_index, offset, bytes);
  }

  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override {
    store_.Called("AddStoredChunk");
    return ForwardingUploadSession::AddStoredChunk(tensor_index, offset, sha256, length);
  }

  absl::StatusOr<CommitResult> Commit() override {
    store_.Called("Commit");
    if (store_.commit_fault_) RETURN_IF_ERROR(store_.commit_fault_("Commit"));
    absl::StatusOr<CommitResult> committed = ForwardingUploadSession::Commit();
    if (committed.ok() && store_.commit_answer_fault_) {
      RETURN_IF_ERROR(store_.commit_answer_fault_("Commit"));
    }
    return committed;
  }

 private:
  InstrumentedStore& store_;
};

absl::StatusOr<std::unique_ptr<UploadSession>> InstrumentedStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  Called("BeginUpload");
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   inner().BeginUpload(model, std::move(header), options));
  return std::unique_ptr<UploadSession>(new Session(*this, std::move(session)));
}

absl::StatusOr<std::unique_ptr<UploadPart>> InstrumentedStore::JoinUpload(
    absl::string_view upload_id, std::vector<UploadRange> ranges) {
  Called("JoinUpload");
  return inner().JoinUpload(upload_id, std::move(ranges));
}

absl::StatusOr<std::vector<std::string>> InstrumentedStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  Called("FindMissingChunks");
  return inner().FindMissingChunks(sha256s);
}

absl::StatusOr<v1::Manifest> InstrumentedStore::GetManifest(const v1::VersionRef& ref) {
  Called("GetManifest");
  return inner().GetManifest(ref);
}

absl::StatusOr<std::unique_ptr<VersionReader>> InstrumentedStore::OpenVersion(
    const v1::VersionRef& ref) {
  Called("OpenVersion");
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, inner().OpenVersion(ref));
  return std::unique_ptr<VersionReader>(new Reader(*this, std::move(reader)));
}

absl::Status InstrumentedStore::ReadTensorChunks(const v1::TensorMeta& meta,
                                                 const ChunkCallback& callback) {
  Called("ReadTensorChunks");
  return inner().ReadTensorChunks(meta, callback);
}

absl::StatusOr<std::vector<v1::ModelInfo>> InstrumentedStore::ListModels() {
  Called("ListModels");
  return inner().ListModels();
}

absl::StatusOr<std::vector<v1::VersionInfo>> InstrumentedStore::ListVersions(
    absl::string_view model) {
  Called("ListVersions");
  return inner().ListVersions(model);
}

absl::StatusOr<int64_t> InstrumentedStore::SetAlias(absl::string_view model,
                                                    absl::string_view alias, int64_t version,
                                                    int64_t expected_current_version,
                                                    const ChangeAttribution& attribution) {
  Called("SetAlias");
  return inner().SetAlias(model, alias, version, expected_current_version, attribution);
}

absl::Status InstrumentedStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                            const ChangeAttribution& attribution) {
  Called("DeleteAlias");
  return inner().DeleteAlias(model, alias, attribution);
}

absl::StatusOr<int64_t> InstrumentedStore::DeleteVersion(absl::string_view model, int64_t version,
                                                         bool force,
                                                         const ChangeAttribution& attribution) {
  Called("DeleteVersion");
  return inner().DeleteVersion(model, version, force, attribution);
}

absl::StatusOr<v1::ApplyRetentionResponse> InstrumentedStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  Called("ApplyRetention");
  return inner().ApplyRetention(model, policy, dry_run, attribution);
}

absl::StatusOr<v1::GarbageCollectResponse> InstrumentedStore::GarbageCollect(bool dry_run) {
  Called("GarbageCollect");
  return inner().GarbageCollect(dry_run);
}

absl::StatusOr<v1::VerifyResponse> InstrumentedStore::Verify(absl::string_view model,
                                                             int64_t version) {
  Called("Verify");
  return inner().Verify(model, version);
}

absl::StatusOr<v1::StoreStats> InstrumentedStore::GetStats() {
  Called("GetStats");
  return inner().GetStats();
}

absl::StatusOr<int64_t> InstrumentedStore::BeginAudit(v1::AuditRecord record) {
  Called("BeginAudit");
  if (audit_fault_) RETURN_IF_ERROR(audit_fault_("BeginAudit"));
  return inner().BeginAudit(std::move(record));
}

absl::Status InstrumentedStore::FinishAudit(int64_t sequence, const absl::Status& outcome,
                                            absl::string_view detail, int64_t version) {
  Called("FinishAudit");
  if (audit_fault_) RETURN_IF_ERROR(audit_fault_("FinishAudit"));
  return inner().FinishAudit(sequence, outcome, detail, version);
}

absl::StatusOr<std::vector<v1::AuditRecord>> InstrumentedStore::ListAudit(const AuditQuery& query) {
  Called("ListAudit");
  return inner().ListAudit(query);
}

absl::StatusOr<v1::ModelInfo> InstrumentedStore::CreateModel(absl::string_view model,
                                                             const v1::ModelDetails& details,
                                                             const ChangeAttribution& attribution) {
  Called("CreateModel");
  return inner().CreateModel(model, details, attribution);
}

absl::StatusOr<v1::ModelInfo> InstrumentedStore::UpdateModel(absl::string_view model,
                                                             const v1::ModelDetailsChange& change,
                                                             const ChangeAttribution& attribution) {
  Called("UpdateModel");
  return inner().UpdateModel(model, change, attribution);
}

absl::Status InstrumentedStore::RenameModel(absl::string_view model, absl::string_view new_name,
                                            const ChangeAttribution& attribution) {
  Called("RenameModel");
  return inner().RenameModel(model, new_name, attribution);
}

absl::StatusOr<v1::DeleteModelResponse> InstrumentedStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  Called("DeleteModel");
  return inner().DeleteModel(model, force, attribution);
}

absl::StatusOr<v1::VersionAnnotations> InstrumentedStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  Called("AnnotateVersion");
  return inner().AnnotateVersion(model, version, change, attribution);
}

absl::StatusOr<std::vector<v1::RegistryEvent>> InstrumentedStore::ListHistory(
    const HistoryQuery& query) {
  Called("ListHistory");
  return inner().ListHistory(query);
}

absl::StatusOr<RegistryState> InstrumentedStore::GetRegistryState(
    const std::vector<std::string>& models) {
  Called("GetRegistryState");
  return inner().GetRegistryState(models);
}

absl::StatusOr<bool> InstrumentedStore::WaitForHistory(int64_t after_sequence,
                                                       absl::Time deadline) {
  Called("WaitForHistory");
  return inner().WaitForHistory(after_sequence, deadline);
}

absl::StatusOr<std::unique_ptr<RegistryWatch>> InstrumentedStore::Watch(
    const v1::WatchRequest& request) {
  return CheckpointStore::Watch(request);
}

}  // namespace ckpt
