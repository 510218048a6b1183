#ifndef CKPT_LIBS_STORE_TESTING_INSTRUMENTED_STORE_H_
#define CKPT_LIBS_STORE_TESTING_INSTRUMENTED_STORE_H_

// InstrumentedStore (testonly): a CheckpointStore that forwards every call to another store and
// lets a test watch or hold calls: a hook runs at the start of each method, and of each chunk read
// through a VersionReader it opened and of each UploadSession call, with the method's name
// ("GetStats", "BeginUpload", "ReadTensorChunks", "AddTensorData", "Commit", "BeginAudit", ...). A
// hook that blocks holds the call there, which is how tests make a server call outlast a client
// deadline without sleeping.
//
// Thread-safe as the wrapped store is; set the hook before the store is used.
//
// Example:
//   InstrumentedStore store(rocksdb_store.get());
//   absl::Notification release;
//   store.set_hook([&](absl::string_view method) {
//     if (method == "GetStats") release.WaitForNotification();
//   });

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/forwarding_store.h"

namespace ckpt {

class InstrumentedStore final : public ForwardingStore {
 public:
  using Hook = std::function<void(absl::string_view method)>;

  // `base` is not owned and must outlive this store and every reader it returns.
  explicit InstrumentedStore(CheckpointStore* base) : ForwardingStore(base) {}

  void set_hook(Hook hook) { hook_ = std::move(hook); }
  // BeginAudit and FinishAudit return the error `fault` gives for their name instead of calling
  // the wrapped store: a full disk or a broken store as the audit log alone sees it.
  using Fault = std::function<absl::Status(absl::string_view method)>;
  void set_audit_fault(Fault fault) { audit_fault_ = std::move(fault); }
  // UploadSession::Commit returns the error `fault` gives for "Commit" instead of committing (the
  // session is then abandoned, as after a failed commit): a full disk as a writer sees it.
  void set_commit_fault(Fault fault) { commit_fault_ = std::move(fault); }
  // UploadSession::Commit commits, then returns the error `fault` gives for "Commit" (when not
  // OK) instead of the version: an answer lost on its way back to the writer.
  void set_commit_answer_fault(Fault fault) { commit_answer_fault_ = std::move(fault); }
  // A chunk read through a reader from OpenVersion (ReadTensorChunks, which ReadTensorInto and a
  // Download's reads go through) returns the error `fault` gives for "ReadTensorChunks" (when not
  // OK) instead of reading: a store that dies in the middle of a Download, as its client sees it.
  void set_read_fault(Fault fault) { read_fault_ = std::move(fault); }
  // Chunk reads made through readers from OpenVersion (one per ReadTensorChunks call).
  int64_t reader_chunk_reads() const { return reader_chunk_reads_.load(); }
  // Bytes given to AddTensorData of sessions from BeginUpload (accepted or not).
  int64_t uploaded_bytes() const { return uploaded_bytes_.load(); }

  // Every method but CommitRetryWindow runs the hook first, then forwards.
  absl::StatusOr<std::unique_ptr<UploadSession>> BeginUpload(absl::string_view model,
                                                             v1::Manifest header,
                                                             const CommitOptions& options) override;
  absl::StatusOr<std::unique_ptr<UploadPart>> JoinUpload(absl::string_view upload_id,
                                                         std::vector<UploadRange> ranges) override;
  absl::StatusOr<std::vector<std::string>> FindMissingChunks(
      const std::vector<std::string>& sha256s) override;
  absl::StatusOr<v1::Manifest> GetManifest(const v1::VersionRef& ref) override;
  absl::StatusOr<std::unique_ptr<VersionReader>> OpenVersion(const v1::VersionRef& ref) override;
  absl::Status ReadTensorChunks(const v1::TensorMeta& meta, const ChunkCallback& callback) override;
  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() override;
  absl::StatusOr<std::vector<v1::VersionInfo>> ListVersions(absl::string_view model) override;
  absl::StatusOr<int64_t> SetAlias(absl::string_view model, absl::string_view alias,
                                   int64_t version, int64_t expected_current_version = 0,
                                   const ChangeAttribution& attribution = {}) override;
  absl::Status DeleteAlias(absl::string_view model, absl::string_view alias,
                           const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<int64_t> DeleteVersion(absl::string_view model, int64_t version, bool force,
                                        const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<v1::ApplyRetentionResponse> ApplyRetention(
      absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
      const ChangeAttribution& attribution = {}) override;
  absl::StatusOr<v1::GarbageCollectResponse> GarbageCollect(bool dry_run) override;
  absl::StatusOr<v1::VerifyResponse> Verify(absl::string_view model, int64_t version) override;
  absl::StatusOr<v1::StoreStats> GetStats() override;
  absl::StatusOr<int64_t> BeginAudit(v1::AuditRecord record) override;
  absl::Status FinishAudit(int64_t sequence, const absl::Status& outcome, absl::string_view detail,
                           int64_t version) override;
  absl::StatusOr<std::vector<v1::AuditRecord>> ListAudit(const AuditQuery& query) override;
  absl::StatusOr<v1::ModelInfo> CreateModel(absl::string_view model,
                                            const v1::ModelDetails& details,
                                            const ChangeAttribution& attribution) override;
  absl::StatusOr<v1::ModelInfo> UpdateModel(absl::string_view model,
                                            const v1::ModelDetailsChange& change,
                                            const ChangeAttribution& attribution) override;
  absl::Status RenameModel(absl::string_view model, absl::string_view new_name,
                           const ChangeAttribution& attribution) override;
  absl::StatusOr<v1::DeleteModelResponse> DeleteModel(
      absl::string_view model, bool force, const ChangeAttribution& attribution) override;
  absl::StatusOr<v1::VersionAnnotations> AnnotateVersion(
      absl::string_view model, int64_t version, const v1::AnnotationChange& change,
      const ChangeAttribution& attribution) override;
  absl::StatusOr<std::vector<v1::RegistryEvent>> ListHistory(const HistoryQuery& query) override;
  absl::StatusOr<RegistryState> GetRegistryState(const std::vector<std::string>& models) override;
  absl::StatusOr<bool> WaitForHistory(int64_t after_sequence, absl::Time deadline) override;
  // CheckpointStore's default watch, over this store's hooked GetRegistryState, ListHistory and
  // WaitForHistory (so a test can hold a watch there), not the wrapped store's.
  absl::StatusOr<std::unique_ptr<RegistryWatch>> Watch(const v1::WatchRequest& request) override;

 private:
  class Reader;
  class Session;

  void Called(absl::string_view method) const {
    if (hook_) hook_(method);
  }

  Hook hook_;
  Fault audit_fault_;
  Fault commit_fault_;
  Fault commit_answer_fault_;
  Fault read_fault_;
  mutable std::atomic<int64_t> reader_chunk_reads_{0};
  std::atomic<int64_t> uploaded_bytes_{0};
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_TESTING_INSTRUMENTED_STORE_H_
