#include "libs/store/testing/registry_workload.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/audited_store.h"
#include "libs/store/testing/seeded_checkpoints.h"
#include "libs/store/version_ref.h"

namespace ckpt::testing {

absl::Status MakeEveryKindOfChange(CheckpointStore& inner, int round) {
  AuditedStore store(inner, AuditedStore::Actor{"local:workload", "local"});
  const std::string model = absl::StrCat("resnet-", round);
  const std::string other = absl::StrCat("bert-", round);
  const ChangeAttribution who{"local:workload", "issue 53 workload"};
  v1::ModelDetails details;
  details.set_description("a model of every kind of change");
  details.set_owner("team-a");
  (*details.mutable_tags())["task"] = "vision";
  RETURN_IF_ERROR(store.CreateModel(model, details, who).status());
  for (int i = 1; i <= 4; ++i) {
    RETURN_IF_ERROR(CommitSeeded(store, model, round * 100 + i).status());
  }
  for (int i = 1; i <= 2; ++i) {
    RETURN_IF_ERROR(CommitSeeded(store, other, round * 100 + i).status());  // shares chunks.
  }
  RETURN_IF_ERROR(store.SetAlias(model, "best", 2, 0, who).status());
  RETURN_IF_ERROR(store.SetAlias(model, "production", 2, 0, who).status());
  RETURN_IF_ERROR(store.SetAlias(model, "production", 3, 2, who).status());  // a move.
  RETURN_IF_ERROR(store.SetAlias(other, "staging", 1, 0, who).status());
  RETURN_IF_ERROR(store.DeleteAlias(other, "staging", who));
  v1::AnnotationChange annotation;
  (*annotation.mutable_set_metrics())["val_acc"] = 0.93;
  (*annotation.mutable_set_tags())["evaluated"] = "yes";
  annotation.set_description("evaluated on the held-out split");
  RETURN_IF_ERROR(store.AnnotateVersion(model, 3, annotation, who).status());
  v1::ModelDetailsChange change;
  change.set_description("updated after evaluation");
  RETURN_IF_ERROR(store.UpdateModel(model, change, who).status());
  RETURN_IF_ERROR(store.DeleteVersion(model, 1, /*force=*/true, who).status());
  v1::RetentionPolicy policy;
  policy.set_keep_last(1);
  RETURN_IF_ERROR(store.ApplyRetention(other, policy, /*dry_run=*/false, who).status());
  return store.GarbageCollect(/*dry_run=*/false).status();
}

absl::StatusOr<std::string> DumpRegistry(CheckpointStore& store) {
  std::string dump;
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store.ListModels());
  for (const v1::ModelInfo& model : models) {
    absl::StrAppend(&dump, "model ", model.ShortDebugString(), "\n");
    ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> versions, store.ListVersions(model.name()));
    for (const v1::VersionInfo& version : versions) {
      absl::StrAppend(&dump, "  version ", version.ShortDebugString(), "\n");
      v1::VersionRef ref;
      ref.set_model(model.name());
      ref.set_version(version.version());
      ASSIGN_OR_RETURN(v1::Manifest manifest, store.GetManifest(ref));
      absl::StrAppend(&dump, "    manifest ", manifest.ShortDebugString(), "\n");
    }
  }
  ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> history, store.ListHistory(HistoryQuery{}));
  for (const v1::RegistryEvent& event : history) {
    absl::StrAppend(&dump, "history ", event.ShortDebugString(), "\n");
  }
  ASSIGN_OR_RETURN(std::vector<v1::AuditRecord> audit, store.ListAudit(AuditQuery{}));
  for (const v1::AuditRecord& record : audit) {
    absl::StrAppend(&dump, "audit ", record.ShortDebugString(), "\n");
  }
  ASSIGN_OR_RETURN(v1::VerifyResponse verified, store.Verify("", 0));
  absl::StrAppend(&dump, "verify ", verified.ShortDebugString(), "\n");
  return dump;
}

}  // namespace ckpt::testing
