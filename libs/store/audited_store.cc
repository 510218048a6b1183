#include "libs/store/audited_store.h"

#include <pwd.h>
#include <unistd.h>

#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

constexpr absl::string_view kClientProducerLabel = "client_producer";

// BeginAudit's failure, as the error of the call it kept from running.
absl::Status NotAudited(const v1::AuditRecord& record, const absl::Status& status) {
  return absl::Status(
      status.code(),
      absl::StrCat(record.action(), record.model().empty() ? "" : " of '", record.model(),
                   record.model().empty() ? "" : "'",
                   " was not done: its audit record could not be written: ", status.message()));
}

// Finishes record `sequence`. A failure leaves the record PENDING and goes to stderr only: the
// caller gets the call's own result (see the header).
void Finish(CheckpointStore& store, int64_t sequence, absl::string_view action,
            const absl::Status& outcome, const std::string& detail, int64_t version) {
  const absl::Status finished = store.FinishAudit(sequence, outcome, detail, version);
  if (!finished.ok()) {
    std::cerr << "audit record " << sequence << " (" << action
              << ") stays PENDING until the store's next open reconciles it with the registry "
                 "history: finishing it failed: "
              << finished << "\n";
  }
}

// Runs `call` between BeginAudit(record) and FinishAudit; `describe` says what a successful
// result changed. The call is not made when BeginAudit fails.
template <typename T, typename Call, typename Describe>
absl::StatusOr<T> RunAudited(CheckpointStore& store, const v1::AuditRecord& record, Call call,
                             Describe describe) {
  absl::StatusOr<int64_t> sequence = store.BeginAudit(record);
  if (!sequence.ok()) return NotAudited(record, sequence.status());
  absl::StatusOr<T> result = call();
  Finish(store, *sequence, record.action(), result.status(),
         result.ok() ? describe(*result) : std::string(), /*version=*/0);
  return result;
}

std::string VersionOrNew(int64_t version) {
  return version > 0 ? absl::StrCat(version) : std::string("(new)");
}

std::string RetentionDetail(const v1::RetentionPolicy& policy) {
  return absl::StrCat("keep_last ", policy.keep_last(), ", keep_every ", policy.keep_every(),
                      ", drop_optimizer_state_older_than ",
                      policy.drop_optimizer_state_older_than());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// One upload: forwards everything; Commit is audited.
class AuditedStore::Session final : public ForwardingUploadSession {
 public:
  Session(std::shared_ptr<CheckpointStore> store, v1::AuditRecord record,
          std::unique_ptr<UploadSession> base)
      : ForwardingUploadSession(std::move(base)),
        store_(std::move(store)),
        record_(std::move(record)) {}

  absl::StatusOr<CommitResult> Commit() override {
    RETURN_IF_ERROR(failure());
    absl::StatusOr<int64_t> sequence = store_->BeginAudit(record_);
    if (!sequence.ok()) {
      // Never committed: destroying the session abandons the upload.
      const absl::Status error = NotAudited(record_, sequence.status());
      Fail(absl::FailedPreconditionError(
          absl::StrCat("the upload failed earlier (", error.message(), ")")));
      return error;
    }
    absl::StatusOr<CommitResult> result = ForwardingUploadSession::Commit();
    std::string detail;
    int64_t version = 0;
    if (result.ok()) {
      version = result->version.version();
      detail = absl::StrCat("committed ", FormatVersionRef(result->version), ": ",
                            result->logical_bytes, " bytes, ", result->new_bytes, " new",
                            record_.alias().empty() ? "" : "; aliases ", record_.alias());
    }
    Finish(*store_, *sequence, record_.action(), result.status(), detail, version);
    return result;
  }

 private:
  // The wrapped store, which may outlive the AuditedStore (see the header).
  const std::shared_ptr<CheckpointStore> store_;
  const v1::AuditRecord record_;
};

// ---------------------------------------------------------------------------------------------

AuditedStore::AuditedStore(CheckpointStore& inner, Actor actor)
    : ForwardingStore(&inner), actor_(std::move(actor)) {}

AuditedStore::AuditedStore(std::unique_ptr<CheckpointStore> inner, Actor actor)
    : ForwardingStore(std::move(inner)), actor_(std::move(actor)) {}

AuditedStore::~AuditedStore() = default;

v1::AuditRecord AuditedStore::NewRecord(absl::string_view action, absl::string_view model) const {
  v1::AuditRecord record;
  record.set_identity(actor_.identity);
  record.set_peer(actor_.peer);
  record.set_action(std::string(action));
  record.set_model(std::string(model));
  return record;
}

absl::StatusOr<std::unique_ptr<UploadSession>> AuditedStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  v1::VersionMetadata& metadata = *header.mutable_metadata();
  if (!metadata.producer().empty()) {
    (*metadata.mutable_labels())[std::string(kClientProducerLabel)] = metadata.producer();
  }
  metadata.set_producer(actor_.identity);
  const int tensors = header.tensors_size() + header.state_tensors_size();
  CommitOptions attributed = options;
  attributed.attribution = Attributed(options.attribution);
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   inner().BeginUpload(model, std::move(header), attributed));
  v1::AuditRecord record = NewRecord(kAuditCommit, model);
  // What the commit was asked to do, kept if it fails or the server stops during it.
  record.set_detail(absl::StrCat(
      "commit of ", tensors, " tensors",
      options.aliases.empty() ? ""
                              : absl::StrCat("; aliases ", absl::StrJoin(options.aliases, ", ")),
      options.expected_latest_version > 0
          ? absl::StrCat("; expects latest version ", options.expected_latest_version)
          : ""));
  record.set_alias(absl::StrJoin(options.aliases, ","));
  return std::unique_ptr<UploadSession>(
      new Session(shared_inner(), std::move(record), std::move(session)));
}

absl::StatusOr<int64_t> AuditedStore::SetAlias(absl::string_view model, absl::string_view alias,
                                               int64_t version, int64_t expected_current_version,
                                               const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditSetAlias, model);
  record.set_alias(std::string(alias));
  record.set_version(version);
  record.set_detail(absl::StrCat(
      "alias ", alias, " -> ", version,
      expected_current_version > 0 ? absl::StrCat(" if it points at ", expected_current_version)
      : expected_current_version == kAliasMustNotExist ? std::string(" if it does not exist")
                                                       : std::string()));
  return RunAudited<int64_t>(
      inner(), record,
      [&] {
        return inner().SetAlias(model, alias, version, expected_current_version,
                                Attributed(attribution));
      },
      [&](int64_t previous) {
        return absl::StrCat("alias ", alias, ": ", VersionOrNew(previous), " -> ", version);
      });
}

absl::Status AuditedStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                       const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditDeleteAlias, model);
  record.set_alias(std::string(alias));
  record.set_detail(absl::StrCat("delete alias ", alias));
  return RunAudited<bool>(
             inner(), record,
             [&]() -> absl::StatusOr<bool> {
               RETURN_IF_ERROR(inner().DeleteAlias(model, alias, Attributed(attribution)));
               return true;
             },
             [&](bool) { return absl::StrCat("alias ", alias, " deleted"); })
      .status();
}

absl::StatusOr<int64_t> AuditedStore::DeleteVersion(absl::string_view model, int64_t version,
                                                    bool force,
                                                    const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditDeleteVersion, model);
  record.set_version(version);
  const std::string ref = FormatVersionRef(model, version);
  record.set_detail(absl::StrCat("delete ", ref, force ? " (force)" : ""));
  return RunAudited<int64_t>(
      inner(), record,
      [&] { return inner().DeleteVersion(model, version, force, Attributed(attribution)); },
      [&](int64_t released) {
        return absl::StrCat("deleted ", ref, force ? " (force)" : "", "; ", released,
                            " bytes no longer referenced");
      });
}

absl::StatusOr<v1::ApplyRetentionResponse> AuditedStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  if (dry_run) return inner().ApplyRetention(model, policy, dry_run);
  v1::AuditRecord record = NewRecord(kAuditApplyRetention, model);
  const std::string asked = RetentionDetail(policy);
  record.set_detail(asked);
  return RunAudited<v1::ApplyRetentionResponse>(
      inner(), record,
      [&] { return inner().ApplyRetention(model, policy, dry_run, Attributed(attribution)); },
      [&](const v1::ApplyRetentionResponse& response) {
        if (response.deleted_versions().empty() && response.optimizer_state_dropped().empty()) {
          return absl::StrCat(asked, ": nothing to do");
        }
        return absl::StrCat(asked, ": deleted versions ",
                            response.deleted_versions().empty()
                                ? std::string("none")
                                : absl::StrJoin(response.deleted_versions(), ", "),
                            "; dropped optimizer state of ",
                            response.optimizer_state_dropped().empty()
                                ? std::string("none")
                                : absl::StrJoin(response.optimizer_state_dropped(), ", "));
      });
}

absl::StatusOr<v1::GarbageCollectResponse> AuditedStore::GarbageCollect(bool dry_run) {
  if (dry_run) return inner().GarbageCollect(dry_run);
  v1::AuditRecord record = NewRecord(kAuditGarbageCollect, "");
  record.set_detail("garbage collection");
  return RunAudited<v1::GarbageCollectResponse>(
      inner(), record, [&] { return inner().GarbageCollect(dry_run); },
      [](const v1::GarbageCollectResponse& response) {
        return absl::StrCat(
            "reclaimed ", response.bytes_freed(), " bytes in ", response.chunks_freed(),
            " chunks, ", response.abandoned_uploads_reclaimed(), " abandoned uploads",
            response.pack_removals_failed() > 0
                ? absl::StrCat(", ", response.pack_removals_failed(), " pack removals failed")
                : "",
            response.packs_of_unknown_age_kept() > 0
                ? absl::StrCat(", ", response.packs_of_unknown_age_kept(),
                               " packs of unknown age kept")
                : "");
      });
}

ChangeAttribution AuditedStore::Attributed(const ChangeAttribution& attribution) const {
  return ChangeAttribution{actor_.identity, attribution.reason};
}

absl::StatusOr<v1::ModelInfo> AuditedStore::CreateModel(absl::string_view model,
                                                        const v1::ModelDetails& details,
                                                        const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditCreateModel, model);
  record.set_detail(absl::StrCat("create model ", model));
  return RunAudited<v1::ModelInfo>(
      inner(), record, [&] { return inner().CreateModel(model, details, Attributed(attribution)); },
      [&](const v1::ModelInfo&) { return absl::StrCat("created model ", model); });
}

absl::StatusOr<v1::ModelInfo> AuditedStore::UpdateModel(absl::string_view model,
                                                        const v1::ModelDetailsChange& change,
                                                        const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditUpdateModel, model);
  record.set_detail(absl::StrCat("update model ", model, ": ", change.ShortDebugString()));
  return RunAudited<v1::ModelInfo>(
      inner(), record, [&] { return inner().UpdateModel(model, change, Attributed(attribution)); },
      [&](const v1::ModelInfo&) { return absl::StrCat("updated model ", model); });
}

absl::Status AuditedStore::RenameModel(absl::string_view model, absl::string_view new_name,
                                       const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditRenameModel, model);
  record.set_detail(absl::StrCat("rename model ", model, " to ", new_name));
  return RunAudited<bool>(
             inner(), record,
             [&]() -> absl::StatusOr<bool> {
               RETURN_IF_ERROR(inner().RenameModel(model, new_name, Attributed(attribution)));
               return true;
             },
             [&](bool) { return absl::StrCat("renamed model ", model, " to ", new_name); })
      .status();
}

absl::StatusOr<v1::DeleteModelResponse> AuditedStore::DeleteModel(
    absl::string_view model, bool force, const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditDeleteModel, model);
  record.set_detail(absl::StrCat("delete model ", model, force ? " (force)" : ""));
  return RunAudited<v1::DeleteModelResponse>(
      inner(), record, [&] { return inner().DeleteModel(model, force, Attributed(attribution)); },
      [&](const v1::DeleteModelResponse& response) {
        return absl::StrCat("deleted model ", model, " with ", response.versions_deleted(),
                            " versions; ", response.bytes_released(),
                            " bytes no longer referenced");
      });
}

absl::StatusOr<v1::VersionAnnotations> AuditedStore::AnnotateVersion(
    absl::string_view model, int64_t version, const v1::AnnotationChange& change,
    const ChangeAttribution& attribution) {
  v1::AuditRecord record = NewRecord(kAuditAnnotate, model);
  record.set_version(version);
  const std::string ref = FormatVersionRef(model, version);
  record.set_detail(absl::StrCat("annotate ", ref, ": ", change.ShortDebugString()));
  return RunAudited<v1::VersionAnnotations>(
      inner(), record,
      [&] { return inner().AnnotateVersion(model, version, change, Attributed(attribution)); },
      [&](const v1::VersionAnnotations&) { return absl::StrCat("annotated ", ref); });
}

std::string ProcessUserName() {
  const uid_t uid = geteuid();
  // getpwuid_r: another thread may be calling getpwuid.
  struct passwd entry;
  struct passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(uid, &entry, buffer, sizeof(buffer), &found) == 0 && found != nullptr &&
      found->pw_name != nullptr && found->pw_name[0] != '\0') {
    return found->pw_name;
  }
  return absl::StrCat("uid:", uid);
}

}  // namespace ckpt
