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

class InstrumentedStore::Session final : public UploadSession {
 public:
  Session(InstrumentedStore& store, std::unique_ptr<UploadSession> base)
      : store_(store), base_(std::move(base)) {}

  const v1::Manifest& header() const override { return base_->header(); }
  int tensor_count() const override { return base_->tensor_count(); }
  const std::vector<std::string>& warnings() const override { return base_->warnings(); }

  absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) override {
    store_.Called("AddTensorData");
    absl::Status added = base_->AddTensorData(tensor_index, offset, bytes);
    store_.uploaded_bytes_.fetch_add(static_cast<int64_t>(bytes.size()));
    return added;
  }

  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override {
    store_.Called("AddStoredChunk");
    return base_->AddStoredChunk(tensor_index, offset, sha256, length);
  }

  std::string upload_id() const override { return base_->upload_id(); }

  absl::StatusOr<CommitResult> Commit() override {
    store_.Called("Commit");
    if (store_.commit_fault_) RETURN_IF_ERROR(store_.commit_fault_("Commit"));
    absl::StatusOr<CommitResult> committed = base_->Commit();
    if (committed.ok() && store_.commit_answer_fault_) {
      RETURN_IF_ERROR(store_.commit_answer_fault_("Commit"));
    }
    return committed;
  }

 private:
  InstrumentedStore& store_;
  const std::unique_ptr<UploadSession> base_;
};

absl::StatusOr<std::unique_ptr<UploadSession>> InstrumentedStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  Called("BeginUpload");
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   base_.BeginUpload(model, std::move(header), options));
  return std::unique_ptr<UploadSession>(new Session(*this, std::move(session)));
}

absl::StatusOr<std::unique_ptr<UploadPart>> InstrumentedStore::JoinUpload(
    absl::string_view upload_id, std::vector<UploadRange> ranges) {
  Called("JoinUpload");
  return base_.JoinUpload(upload_id, std::move(ranges));
}

absl::StatusOr<std::vector<std::string>> InstrumentedStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  Called("FindMissingChunks");
  return base_.FindMissingChunks(sha256s);
}

absl::StatusOr<v1::Manifest> InstrumentedStore::GetManifest(const v1::VersionRef& ref) {
  Called("GetManifest");
  return base_.GetManifest(ref);
}

absl::StatusOr<std::unique_ptr<VersionReader>> InstrumentedStore::OpenVersion(
    const v1::VersionRef& ref) {
  Called("OpenVersion");
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, base_.OpenVersion(ref));
  return std::unique_ptr<VersionReader>(new Reader(*this, std::move(reader)));
}

absl::Status InstrumentedStore::ReadTensorChunks(const v1::TensorMeta& meta,
                                                 const ChunkCallback& callback) {
  Called("ReadTensorChunks");
  return base_.ReadTensorChunks(meta, callback);
}

absl::StatusOr<std::vector<v1::ModelInfo>> InstrumentedStore::ListModels() {
  Called("ListModels");
  return base_.ListModels();
}

absl::StatusOr<std::vector<v1::VersionInfo>> InstrumentedStore::ListVersions(
    absl::string_view model) {
  Called("ListVersions");
  return base_.ListVersions(model);
}

absl::StatusOr<int64_t> InstrumentedStore::SetAlias(absl::string_view model,
                                                    absl::string_view alias, int64_t version,
                                                    int64_t expected_current_version,
                                                    const ChangeAttribution& attribution) {
  Called("SetAlias");
  return base_.SetAlias(model, alias, version, expected_current_version, attribution);
}

absl::Status InstrumentedStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                            const ChangeAttribution& attribution) {
  Called("DeleteAlias");
  return base_.DeleteAlias(model, alias, attribution);
}

absl::StatusOr<int64_t> InstrumentedStore::DeleteVersion(absl::string_view model, int64_t version,
                                                         bool force,
                                                         const ChangeAttribution& attribution) {
  Called("DeleteVersion");
  return base_.DeleteVersion(model, version, force, attribution);
}

absl::StatusOr<v1::ApplyRetentionResponse> InstrumentedStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  Called("ApplyRetention");
  return base_.ApplyRetention(model, policy, dry_run, attribution);
}

absl::StatusOr<v1::GarbageCollectResponse> InstrumentedStore::GarbageCollect(bool dry_run) {
  Called("GarbageCollect");
  return base_.GarbageCollect(dry_run);
}

absl::StatusOr<v1::VerifyResponse> InstrumentedStore::Verify(absl::string_view model,
                                                             int64_t version) {
  Called("Verify");
  return base_.Verify(model, version);
}

absl::StatusOr<v1::StoreStats> InstrumentedStore::GetStats() {
  Called("GetStats");
  return base_.GetStats();
}

absl::StatusOr<int64_t> InstrumentedStore::BeginAudit(v1::AuditRecord record) {
  Called("BeginAudit");
  if (audit_fault_) RETURN_IF_ERROR(audit_fault_("BeginAudit"));
  return base_.BeginAudit(std::move(record));
}

absl::Status InstrumentedStore::FinishAudit(int64_t sequence, const absl::Status& outcome,
                                            absl::string_view detail, int64_t version) {
  Called("FinishAudit");
  if (audit_fault_) RETURN_IF_ERROR(audit_fault_("FinishAudit"));
  return base_.FinishAudit(sequence, outcome, detail, version);
}

absl::StatusOr<std::vector<v1::AuditRecord>> InstrumentedStore::ListAudit(const AuditQuery& query) {
  Called("ListAudit");
  return base_.ListAudit(query);
}

absl::StatusOr<v1::ModelInfo> InstrumentedStore::CreateModel(absl::string_view model,
                                                             const v1::ModelDetails& details,
                                                             const ChangeAttribution& attribution) {
  Called("CreateModel");
  return base_.CreateModel(model, details, attribution);
}

absl::StatusOr<v1::ModelInfo> InstrumentedStore::UpdateModel(absl::string_view model,
                                                             const v1::ModelDetailsChange& change,
                                                             const ChangeAttribution& attribution) {
  Called("UpdateModel");
  return base_.UpdateModel(model, change, attribution);
}

absl::Status InstrumentedStore::RenameModel(absl::string_view model, absl::string_view new_name,
                                            const ChangeAttribution& attribution) {
  Called("RenameModel");
  return base_.RenameModel(model, new_name, attribution);
}

absl::StatusOr<v1::DeleteModelResponse> InstrumentedStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  Called("DeleteModel");
  return base_.DeleteModel(model, force, attribution);
}

absl::StatusOr<v1::VersionAnnotations> InstrumentedStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  Called("AnnotateVersion");
  return base_.AnnotateVersion(model, version, change, attribution);
}

absl::StatusOr<std::vector<v1::RegistryEvent>> InstrumentedStore::ListHistory(
    const HistoryQuery& query) {
  Called("ListHistory");
  return base_.ListHistory(query);
}

absl::StatusOr<RegistryState> InstrumentedStore::GetRegistryState(
    const std::vector<std::string>& models) {
  Called("GetRegistryState");
  return base_.GetRegistryState(models);
}

absl::StatusOr<bool> InstrumentedStore::WaitForHistory(int64_t after_sequence,
                                                       absl::Time deadline) {
  Called("WaitForHistory");
  return base_.WaitForHistory(after_sequence, deadline);
}

}  // namespace ckpt
