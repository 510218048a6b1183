#ifndef CKPT_LIBS_STORE_SCOPED_STORE_H_
#define CKPT_LIBS_STORE_SCOPED_STORE_H_

// ScopedStore: a CheckpointStore that shows a caller only the models of its ModelScope
// (libs/auth/model_scope.h), including through the calls that name no model. A store shared by
// several teams wraps each scoped caller's calls in one (the store service does, per call), so a
// team sees nothing of another team's models: not their names, sizes, aliases, history or audit
// records, and not whether their content exists (deduplication stays store-wide on disk, but no
// answer reveals it).
//
// Call by call, for a restricted scope (an unrestricted one forwards everything unchanged):
//   named model             (GetManifest, OpenVersion, ListVersions, BeginUpload, SetAlias,
//                           DeleteAlias, DeleteVersion, ApplyRetention, the registry calls,
//                           ListAudit / ListHistory with a model) PERMISSION_DENIED outside the
//                           scope; RenameModel checks both names; Watch every watched model.
//   ListModels              only the models in scope.
//   ListAudit, no model     only records of models in scope (records of calls naming no model,
//                           e.g. garbage collection and refused calls, are left out).
//   Verify, no model        verifies every version of every model in scope (not the whole store:
//                           its orphaned chunks and packs are an administrator's business).
//   GetStats                the scope's figures: its models, versions and logical bytes, and the
//                           distinct chunks its versions reference with their bytes (its physical
//                           size had no other team shared a chunk); uploads_in_progress 0.
//   FindMissingChunks       a chunk is reported present only when a version in scope references
//                           it: otherwise the answer would be an oracle for other teams' weights.
//                           A client then re-sends such a chunk; the store still keeps it once.
//   Commit's new_bytes      bytes of chunks no other version in scope references (so "0 new"
//                           never says another team holds the same weights); the audit record
//                           of the commit (AuditedStore over this) carries the same figure.
//   ReadTensorChunks        only chunks a version in scope references.
//   GarbageCollect,         PERMISSION_DENIED: they act on (and report) the whole store.
//   ListHistory, Watch and GetRegistryState without models
// The audit methods (BeginAudit, FinishAudit) and WaitForHistory forward: they are the store's
// plumbing for AuditedStore and watches, not answers to a caller.
//
// Cost: the answers that depend on chunk references (FindMissingChunks, GetStats, a commit that
// deduplicated, ReadTensorChunks) read the manifests of every version in scope, once per call;
// see docs/benchmarks/history.md (D1 scoped) for what that costs on ten 260 MiB versions.
//
// Ownership and threading as AuditedStore: the wrapped store is borrowed (it must outlive this
// object and every session and watch it returns); sessions keep the wrapped store, so a
// ScopedStore made for one call may go while its upload goes on. Thread-safe as the wrapped
// store.
//
// Example:
//   ScopedStore scoped(*store, ModelScope({"team-a-*"}));
//   ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, scoped.ListModels());  // team-a's only
//   scoped.GetManifest(ParseVersionRef("team-b-net@1"));  // PERMISSION_DENIED

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/auth/model_scope.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/forwarding_store.h"

namespace ckpt {

class ScopedStore final : public ForwardingStore {
 public:
  // Borrows `inner`. `who` names the caller in refusals ("identity 'team-a'").
  ScopedStore(CheckpointStore& inner, ModelScope scope, std::string who);
  ~ScopedStore() override;
  ScopedStore(const ScopedStore&) = delete;
  ScopedStore& operator=(const ScopedStore&) = delete;

  const ModelScope& scope() const { return scope_; }

  // Every call that names a model, or acts on the whole store, is checked against the scope;
  // what is left (CommitRetryWindow, BeginAudit / FinishAudit, which the service calls on the
  // caller's behalf, and WaitForHistory, which says only that some event exists) forwards
  // unchanged.
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
  absl::StatusOr<std::unique_ptr<RegistryWatch>> Watch(const v1::WatchRequest& request) override;

 private:
  class Session;

  // OK when `model` is in scope; PERMISSION_DENIED naming who, what and the scope otherwise.
  absl::Status CheckModel(absl::string_view what, absl::string_view model) const;
  // PERMISSION_DENIED for a restricted scope: `what` acts on the whole store.
  absl::Status RefuseWholeStore(absl::string_view what, absl::string_view why) const;

  const ModelScope scope_;
  const std::string who_;
};

// The distinct chunks (sha256 -> length) that the versions of the models `scope` covers
// reference, model and state tensors alike, read from `store`'s manifests; versions other than
// `skip` (a model@version committed just now; empty: none). A version deleted while this runs is
// skipped.
absl::StatusOr<absl::flat_hash_map<std::string, int64_t>> ChunksReferencedInScope(
    CheckpointStore& store, const ModelScope& scope, const v1::VersionRef& skip = {});

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_SCOPED_STORE_H_
