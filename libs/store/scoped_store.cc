#include "libs/store/scoped_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

// Records fetched per ListAudit page while filtering: the store's page, not the caller's.
constexpr int64_t kAuditScanPage = 512;

void AddChunks(const v1::Manifest& manifest, absl::flat_hash_map<std::string, int64_t>& chunks) {
  for (const auto* tensors : {&manifest.tensors(), &manifest.state_tensors()}) {
    for (const v1::TensorMeta& meta : *tensors) {
      for (const v1::ChunkRef& chunk : meta.chunks())
        chunks.emplace(chunk.sha256(), chunk.length());
    }
  }
}

}  // namespace

absl::StatusOr<absl::flat_hash_map<std::string, int64_t>> ChunksReferencedInScope(
    CheckpointStore& store, const ModelScope& scope, const v1::VersionRef& skip) {
  absl::flat_hash_map<std::string, int64_t> chunks;
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store.ListModels());
  for (const v1::ModelInfo& model : models) {
    if (!scope.Covers(model.name())) continue;
    absl::StatusOr<std::vector<v1::VersionInfo>> versions = store.ListVersions(model.name());
    if (absl::IsNotFound(versions.status())) continue;  // deleted meanwhile
    RETURN_IF_ERROR(versions.status());
    for (const v1::VersionInfo& info : *versions) {
      if (model.name() == skip.model() && info.version() == skip.version()) continue;
      absl::StatusOr<v1::Manifest> manifest =
          store.GetManifest(MakeVersionRef(model.name(), info.version()));
      if (absl::IsNotFound(manifest.status())) continue;
      RETURN_IF_ERROR(manifest.status());
      AddChunks(*manifest, chunks);
    }
  }
  return chunks;
}

// ---------------------------------------------------------------------------------------------
// One upload in a restricted scope: forwards everything, except that a stored chunk may be
// referenced only when a version in scope references it (else holding a chunk's SHA-256 would be
// enough to copy another team's bytes into one's own version, or to learn that they exist);
// Commit's new_bytes counts the bytes new to the scope rather than to the store.
class ScopedStore::Session final : public ForwardingUploadSession {
 public:
  Session(CheckpointStore& store, ModelScope scope, std::unique_ptr<UploadSession> base)
      : ForwardingUploadSession(std::move(base)), store_(store), scope_(std::move(scope)) {}

  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override {
    RETURN_IF_ERROR(failure());
    if (!in_scope_.has_value()) {
      // Once per upload, on the first reference: the cost ChunksReferencedInScope documents.
      absl::StatusOr<absl::flat_hash_map<std::string, int64_t>> chunks =
          ChunksReferencedInScope(store_, scope_, v1::VersionRef());
      if (!chunks.ok()) return Fail(chunks.status());
      in_scope_ = std::move(*chunks);
    }
    // One answer whether the store holds the chunk for another team or not at all.
    if (!in_scope_->contains(sha256)) {
      // A refused reference fails the session, as the store's own errors do.
      return Fail(absl::NotFoundError(absl::StrCat("no version of ", scope_.Describe(),
                                                   " references chunk ", HexEncode(sha256),
                                                   ": send its bytes")));
    }
    return ForwardingUploadSession::AddStoredChunk(tensor_index, offset, sha256, length);
  }

  absl::StatusOr<CommitResult> Commit() override {
    ASSIGN_OR_RETURN(CommitResult result, ForwardingUploadSession::Commit());
    // What the new version references, each chunk once.
    absl::StatusOr<v1::Manifest> manifest = store_.GetManifest(result.version);
    if (!manifest.ok()) {
      // Committed: an error now would invite a retry that commits twice. Report nothing as
      // deduplicated rather than the store-wide figure.
      result.new_bytes = result.logical_bytes;
      return result;
    }
    absl::flat_hash_map<std::string, int64_t> mine;
    AddChunks(*manifest, mine);
    int64_t distinct_bytes = 0;
    for (const auto& [sha256, length] : mine) distinct_bytes += length;
    // Every distinct chunk was new to the store: it was new to the scope too, no scan needed.
    if (result.new_bytes == distinct_bytes) return result;
    absl::StatusOr<absl::flat_hash_map<std::string, int64_t>> others =
        ChunksReferencedInScope(store_, scope_, result.version);
    int64_t new_to_scope = distinct_bytes;
    if (others.ok()) {
      for (const auto& [sha256, length] : mine) {
        if (others->contains(sha256)) new_to_scope -= length;
      }
    }
    result.new_bytes = new_to_scope;
    return result;
  }

 private:
  CheckpointStore& store_;
  const ModelScope scope_;
  // Chunks the scope's versions reference, read on the first AddStoredChunk.
  std::optional<absl::flat_hash_map<std::string, int64_t>> in_scope_;
};

// ---------------------------------------------------------------------------------------------

ScopedStore::ScopedStore(CheckpointStore& inner, ModelScope scope, std::string who)
    : ForwardingStore(&inner), scope_(std::move(scope)), who_(std::move(who)) {}

ScopedStore::~ScopedStore() = default;

absl::Status ScopedStore::CheckModel(absl::string_view what, absl::string_view model) const {
  if (scope_.Covers(model)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(who_, " may not ", what, " model '", model,
                                                  "': it may see only ", scope_.Describe()));
}

absl::Status ScopedStore::RefuseWholeStore(absl::string_view what, absl::string_view why) const {
  if (scope_.unrestricted()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(who_, " may not ", what, ": ", why,
                                                  ", and it may see only ", scope_.Describe()));
}

absl::StatusOr<std::unique_ptr<UploadSession>> ScopedStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  RETURN_IF_ERROR(CheckModel("upload to", model));
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   inner().BeginUpload(model, std::move(header), options));
  if (scope_.unrestricted()) return session;
  return std::unique_ptr<UploadSession>(new Session(inner(), scope_, std::move(session)));
}

// A part sends its bytes (it cannot reference chunks), so only the upload's model is checked;
// a part refused here was never written to and is reclaimed as an abandoned upload.
absl::StatusOr<std::unique_ptr<UploadPart>> ScopedStore::JoinUpload(
    absl::string_view upload_id, std::vector<UploadRange> ranges) {
  ASSIGN_OR_RETURN(std::unique_ptr<UploadPart> part,
                   inner().JoinUpload(upload_id, std::move(ranges)));
  RETURN_IF_ERROR(CheckModel("upload to", part->header().model()));
  return part;
}

absl::StatusOr<std::vector<std::string>> ScopedStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  if (scope_.unrestricted()) return inner().FindMissingChunks(sha256s);
  ASSIGN_OR_RETURN(const auto referenced, ChunksReferencedInScope(inner(), scope_));
  // The store's answer still counts: a chunk a version references but the store lost is missing.
  ASSIGN_OR_RETURN(std::vector<std::string> missing_from_store, inner().FindMissingChunks(sha256s));
  const absl::flat_hash_set<std::string> lost(missing_from_store.begin(), missing_from_store.end());
  std::vector<std::string> missing;
  for (const std::string& sha256 : sha256s) {
    if (!referenced.contains(sha256) || lost.contains(sha256)) missing.push_back(sha256);
  }
  return missing;
}

absl::StatusOr<v1::Manifest> ScopedStore::GetManifest(const v1::VersionRef& ref) {
  RETURN_IF_ERROR(CheckModel("read", ref.model()));
  return inner().GetManifest(ref);
}

absl::StatusOr<std::unique_ptr<VersionReader>> ScopedStore::OpenVersion(const v1::VersionRef& ref) {
  RETURN_IF_ERROR(CheckModel("read", ref.model()));
  return inner().OpenVersion(ref);
}

absl::Status ScopedStore::ReadTensorChunks(const v1::TensorMeta& meta,
                                           const ChunkCallback& callback) {
  if (!scope_.unrestricted()) {
    // The meta comes from the caller: its chunks must be ones its own versions reference.
    ASSIGN_OR_RETURN(const auto referenced, ChunksReferencedInScope(inner(), scope_));
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      if (!referenced.contains(chunk.sha256())) {
        return absl::PermissionDeniedError(absl::StrCat(
            who_, " may not read a chunk that no version of ", scope_.Describe(), " references"));
      }
    }
  }
  return inner().ReadTensorChunks(meta, callback);
}

absl::StatusOr<std::vector<v1::ModelInfo>> ScopedStore::ListModels() {
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, inner().ListModels());
  models.erase(
      std::remove_if(models.begin(), models.end(),
                     [&](const v1::ModelInfo& model) { return !scope_.Covers(model.name()); }),
      models.end());
  return models;
}

absl::StatusOr<std::vector<v1::VersionInfo>> ScopedStore::ListVersions(absl::string_view model) {
  RETURN_IF_ERROR(CheckModel("list the versions of", model));
  return inner().ListVersions(model);
}

absl::StatusOr<int64_t> ScopedStore::SetAlias(absl::string_view model, absl::string_view alias,
                                              int64_t version, int64_t expected_current_version,
                                              const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("set an alias of", model));
  return inner().SetAlias(model, alias, version, expected_current_version, attribution);
}

absl::Status ScopedStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                      const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("delete an alias of", model));
  return inner().DeleteAlias(model, alias, attribution);
}

absl::StatusOr<int64_t> ScopedStore::DeleteVersion(absl::string_view model, int64_t version,
                                                   bool force,
                                                   const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("delete a version of", model));
  return inner().DeleteVersion(model, version, force, attribution);
}

absl::StatusOr<v1::ApplyRetentionResponse> ScopedStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("apply retention to", model));
  return inner().ApplyRetention(model, policy, dry_run, attribution);
}

absl::StatusOr<v1::GarbageCollectResponse> ScopedStore::GarbageCollect(bool dry_run) {
  RETURN_IF_ERROR(RefuseWholeStore(
      "collect garbage", "garbage collection acts on every model's chunks and reports them"));
  return inner().GarbageCollect(dry_run);
}

absl::StatusOr<v1::VerifyResponse> ScopedStore::Verify(absl::string_view model, int64_t version) {
  if (!model.empty() || scope_.unrestricted()) {
    RETURN_IF_ERROR(CheckModel("verify", model));
    return inner().Verify(model, version);
  }
  if (version != 0) {
    return absl::InvalidArgumentError("Verify: a version needs a model");
  }
  v1::VerifyResponse all;
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, ListModels());
  for (const v1::ModelInfo& info : models) {
    if (info.version_count() == 0) continue;
    absl::StatusOr<v1::VerifyResponse> one = inner().Verify(info.name(), 0);
    if (absl::IsNotFound(one.status())) continue;  // deleted meanwhile
    RETURN_IF_ERROR(one.status());
    all.set_chunks_checked(all.chunks_checked() + one->chunks_checked());
    all.set_bytes_checked(all.bytes_checked() + one->bytes_checked());
    all.set_versions_checked(all.versions_checked() + one->versions_checked());
    all.add_models(info.name());
    for (v1::VerifyProblem& problem : *one->mutable_problems()) {
      *all.add_problems() = std::move(problem);
    }
  }
  all.set_whole_store(false);  // the caller's models only; refcounts span every model.
  return all;
}

absl::StatusOr<v1::StoreStats> ScopedStore::GetStats() {
  if (scope_.unrestricted()) return inner().GetStats();
  v1::StoreStats stats;
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, ListModels());
  for (const v1::ModelInfo& info : models) {
    stats.set_models(stats.models() + 1);
    stats.set_versions(stats.versions() + info.version_count());
    stats.set_logical_bytes(stats.logical_bytes() + info.logical_bytes());
  }
  ASSIGN_OR_RETURN(const auto referenced, ChunksReferencedInScope(inner(), scope_));
  stats.set_chunks(static_cast<int64_t>(referenced.size()));
  int64_t bytes = 0;
  for (const auto& [sha256, length] : referenced) bytes += length;
  stats.set_physical_bytes(bytes);
  return stats;
}

absl::StatusOr<std::vector<v1::AuditRecord>> ScopedStore::ListAudit(const AuditQuery& query) {
  if (!query.model.empty() || scope_.unrestricted()) {
    RETURN_IF_ERROR(CheckModel("read the audit records of", query.model));
    return inner().ListAudit(query);
  }
  // Filtered page by page of the store's log, until the caller's limit is met.
  std::vector<v1::AuditRecord> kept;
  AuditQuery page = query;
  page.limit = kAuditScanPage;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<v1::AuditRecord> records, inner().ListAudit(page));
    for (v1::AuditRecord& record : records) {
      if (record.model().empty() || !scope_.Covers(record.model())) continue;
      kept.push_back(std::move(record));
      if (query.limit > 0 && static_cast<int64_t>(kept.size()) == query.limit) return kept;
    }
    if (static_cast<int64_t>(records.size()) < page.limit) return kept;
    page.after_sequence = records.back().sequence();
  }
}

absl::StatusOr<v1::ModelInfo> ScopedStore::CreateModel(absl::string_view model,
                                                       const v1::ModelDetails& details,
                                                       const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("create", model));
  return inner().CreateModel(model, details, attribution);
}

absl::StatusOr<v1::ModelInfo> ScopedStore::UpdateModel(absl::string_view model,
                                                       const v1::ModelDetailsChange& change,
                                                       const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("update", model));
  return inner().UpdateModel(model, change, attribution);
}

absl::Status ScopedStore::RenameModel(absl::string_view model, absl::string_view new_name,
                                      const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("rename", model));
  RETURN_IF_ERROR(CheckModel("rename a model to", new_name));
  return inner().RenameModel(model, new_name, attribution);
}

absl::StatusOr<v1::DeleteModelResponse> ScopedStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("delete", model));
  return inner().DeleteModel(model, force, attribution);
}

absl::StatusOr<v1::VersionAnnotations> ScopedStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  RETURN_IF_ERROR(CheckModel("annotate", model));
  return inner().AnnotateVersion(model, version, change, attribution);
}

absl::StatusOr<std::vector<v1::RegistryEvent>> ScopedStore::ListHistory(const HistoryQuery& query) {
  if (query.model.empty()) {
    RETURN_IF_ERROR(RefuseWholeStore("read the history of every model",
                                     "name the model (ListHistoryRequest.model)"));
  }
  RETURN_IF_ERROR(CheckModel("read the history of", query.model));
  return inner().ListHistory(query);
}

absl::StatusOr<RegistryState> ScopedStore::GetRegistryState(
    const std::vector<std::string>& models) {
  if (models.empty()) {
    RETURN_IF_ERROR(RefuseWholeStore("read the state of every model", "name the models"));
  }
  for (const std::string& model : models) RETURN_IF_ERROR(CheckModel("read the state of", model));
  return inner().GetRegistryState(models);
}

absl::StatusOr<std::unique_ptr<RegistryWatch>> ScopedStore::Watch(const v1::WatchRequest& request) {
  if (request.models().empty()) {
    RETURN_IF_ERROR(RefuseWholeStore("watch every model", "name the models (WatchRequest.models)"));
  }
  for (const std::string& model : request.models()) RETURN_IF_ERROR(CheckModel("watch", model));
  // The wrapped store's watch reports only the named models, all in scope, and outlives this.
  return inner().Watch(request);
}

}  // namespace ckpt
