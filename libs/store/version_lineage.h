#ifndef CKPT_LIBS_STORE_VERSION_LINEAGE_H_
#define CKPT_LIBS_STORE_VERSION_LINEAGE_H_

// Where a version came from and what was made from it, across models: its ancestors by the
// parent each version's lineage names ("resnet@6", fine_tuned_from / resumed_from / ...) and the
// versions whose lineage names it as their parent (its children: fine-tunes, resumed runs). What
// the console's lineage graph draws; a store's scope applies (a caller sees the part of the graph
// it may read; an ancestor it may not read ends the walk as "hidden").
//
// Example:
//   ASSIGN_OR_RETURN(VersionLineage lineage, LineageOf(store, *ParseVersionRef("bert-ft@3")));
//   for (const LineageLink& link : lineage.ancestors) ...   // nearest first

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

struct LineageLink {
  std::string version;   // "MODEL@N"
  std::string relation;  // how the child was made from the parent, as its lineage says.
  std::string run_id;    // the run that made `version` (empty: unknown or not visible).
  // "ok"; "missing": the store has no such version (deleted); "hidden": the caller may not read
  // it; "cycle": it was met before (a store's data that is wrong).
  std::string state = "ok";
};

struct VersionLineage {
  std::string version;                 // "MODEL@N" (an alias resolved)
  v1::Lineage lineage;                 // its own lineage record
  std::vector<LineageLink> ancestors;  // parent, grandparent, ... (nearest first)
  std::vector<LineageLink> children;   // by model, then version
};

// `ref`'s lineage. Ancestors are followed up to `max_depth` links; children are found by reading
// every version of every model the caller can list (ListModels, ListVersions), which is O(versions
// in scope). Errors of GetManifest for `ref` itself (NOT_FOUND, PERMISSION_DENIED), and of the
// listings.
absl::StatusOr<VersionLineage> LineageOf(CheckpointStore& store, const v1::VersionRef& ref,
                                         int max_depth = 64);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_VERSION_LINEAGE_H_
