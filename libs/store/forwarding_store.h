#ifndef CKPT_LIBS_STORE_FORWARDING_STORE_H_
#define CKPT_LIBS_STORE_FORWARDING_STORE_H_

// ForwardingStore and ForwardingUploadSession: the base of every CheckpointStore decorator
// (AuditedStore, ScopedStore, the tests' InstrumentedStore), as RocksDB's StackableDB is of its
// wrappers. Each method forwards to the wrapped store or session unchanged; a decorator derives
// from it and overrides only the methods whose behaviour it changes, so a method added to
// CheckpointStore is written once here rather than in every decorator.
//
// The cost of that: a new CheckpointStore method passes through every decorator unchanged until
// someone decides otherwise. Whoever adds one must decide, for ScopedStore, whether the method
// reads or changes a model (check it against the scope, or refuse it for a restricted scope) and,
// for AuditedStore, whether it changes the store (audit it). checkpoint_store.h says so too.
//
// Ownership: the wrapped store is borrowed (it must outlive this object, and every session,
// reader and watch it returns) or owned. shared_inner() lets a session keep an owned store alive
// after its decorator is gone (AuditedStore's sessions do).
// Thread-safety: as the wrapped store.
//
// Example:
//   class CountingStore final : public ForwardingStore {
//    public:
//     using ForwardingStore::ForwardingStore;
//     absl::StatusOr<v1::StoreStats> GetStats() override {
//       ++stats_calls_;
//       return ForwardingStore::GetStats();
//     }
//     int stats_calls_ = 0;
//   };

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt {

class ForwardingStore : public CheckpointStore {
 public:
  // Borrows `inner` (not null). A pointer, not a reference: with a reference, wrapping another
  // ForwardingStore would pick the (deleted) copy constructor.
  explicit ForwardingStore(CheckpointStore* inner);
  // Owns `inner`.
  explicit ForwardingStore(std::unique_ptr<CheckpointStore> inner);
  ~ForwardingStore() override;
  ForwardingStore(const ForwardingStore&) = delete;
  ForwardingStore& operator=(const ForwardingStore&) = delete;

  absl::Duration CommitRetryWindow() const override;
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
  // The wrapped store's watch (a remote store's server stream), not CheckpointStore's default
  // polling through this object.
  absl::StatusOr<std::unique_ptr<RegistryWatch>> Watch(const v1::WatchRequest& request) override;

 protected:
  CheckpointStore& inner() const { return *inner_; }
  // The wrapped store, for what may outlive this object: shares ownership when this object owns
  // it; when borrowed, a pointer that owns nothing.
  const std::shared_ptr<CheckpointStore>& shared_inner() const { return inner_; }

 private:
  const std::shared_ptr<CheckpointStore> inner_;
};

// An UploadSession that forwards to another, with the failure latch every decorator needs: after
// Fail(error), every call returns `error` without reaching the wrapped session (UploadSession's
// contract: a failed session can only be destroyed), whatever the decorator refused.
class ForwardingUploadSession : public UploadSession {
 public:
  explicit ForwardingUploadSession(std::unique_ptr<UploadSession> base);
  ~ForwardingUploadSession() override;
  ForwardingUploadSession(const ForwardingUploadSession&) = delete;
  ForwardingUploadSession& operator=(const ForwardingUploadSession&) = delete;

  const v1::Manifest& header() const override;
  int tensor_count() const override;
  const std::vector<std::string>& warnings() const override;
  absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) override;
  absl::Status AddStableTensorData(int tensor_index, int64_t offset,
                                   absl::string_view bytes) override;
  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override;
  absl::StatusOr<CommitResult> Commit() override;
  std::string upload_id() const override;

 protected:
  UploadSession& base() const { return *base_; }
  // Fails the session with `error` (not OK) and returns it.
  absl::Status Fail(absl::Status error);
  // OK until Fail; then the error every call returns.
  const absl::Status& failure() const { return failure_; }

 private:
  const std::unique_ptr<UploadSession> base_;
  absl::Status failure_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_FORWARDING_STORE_H_
