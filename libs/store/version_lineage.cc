#include "libs/store/version_lineage.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"

namespace ckpt {

absl::StatusOr<VersionLineage> LineageOf(CheckpointStore& store, const v1::VersionRef& ref,
                                         int max_depth) {
  ASSIGN_OR_RETURN(const v1::Manifest manifest, store.GetManifest(ref));
  VersionLineage result;
  result.version = FormatVersionRef(manifest.model(), manifest.version());
  result.lineage = manifest.metadata().lineage();

  absl::flat_hash_set<std::string> seen = {result.version};
  std::string parent = result.lineage.parent();
  std::string relation = result.lineage.parent_relation();
  for (int depth = 0; !parent.empty() && depth < max_depth; ++depth) {
    LineageLink link;
    link.version = parent;
    link.relation = relation;
    parent.clear();
    if (!seen.insert(link.version).second) {
      link.state = "cycle";
      result.ancestors.push_back(std::move(link));
      break;
    }
    absl::StatusOr<v1::VersionRef> parsed = ParseVersionRef(link.version);
    absl::StatusOr<v1::Manifest> found =
        parsed.ok() ? store.GetManifest(*parsed) : absl::StatusOr<v1::Manifest>(parsed.status());
    if (found.ok()) {
      link.run_id = found->metadata().lineage().run_id();
      parent = found->metadata().lineage().parent();
      relation = found->metadata().lineage().parent_relation();
    } else if (absl::IsPermissionDenied(found.status())) {
      link.state = "hidden";
    } else if (absl::IsNotFound(found.status()) || absl::IsInvalidArgument(found.status())) {
      link.state = "missing";
    } else {
      return found.status();
    }
    result.ancestors.push_back(std::move(link));
  }

  ASSIGN_OR_RETURN(const std::vector<v1::ModelInfo> models, store.ListModels());
  for (const v1::ModelInfo& model : models) {
    absl::StatusOr<std::vector<v1::VersionInfo>> versions = store.ListVersions(model.name());
    if (absl::IsNotFound(versions.status())) continue;  // deleted since it was listed.
    RETURN_IF_ERROR(versions.status());
    for (const v1::VersionInfo& info : *versions) {
      const v1::Lineage& lineage = info.metadata().lineage();
      if (lineage.parent() != result.version) continue;
      result.children.push_back({FormatVersionRef(model.name(), info.version()),
                                 lineage.parent_relation(), lineage.run_id(), "ok"});
    }
  }
  return result;
}

}  // namespace ckpt
