#ifndef CKPT_LIBS_REGISTRY_PROMOTION_H_
#define CKPT_LIBS_REGISTRY_PROMOTION_H_

// Moving a serving alias ("production") under rules, and back.
//
// Promote checks a version against promotion rules -- metric conditions over its effective
// metrics (annotation metrics over commit-time ones, libs/store/version_filter.h) and, when asked,
// a re-hash of every chunk (CheckpointStore::Verify) -- and only then points the alias at it,
// compare-and-set against where the alias pointed when the check began, so a concurrent move is
// never silently overwritten. The recorded reason says what was checked ("promoted resnet@7:
// val_acc 0.93 >= 0.9, verified"), so the registry's history explains every move.
//
// Rollback undoes the alias's last move: it finds the newest ALIAS_SET event in the history that
// put the alias where it is now and moves it back to that event's previous version, again
// compare-and-set. A rollback is itself a move, so a second rollback undoes the first (as
// `cd -` does); roll back further by promoting an older version.
//
// Both work on any CheckpointStore: embedded (RocksDB) or remote (RemoteCheckpointStore).
//
// Example:
//   PromotionRules rules;
//   rules.requirements.push_back(*ParseMetricCondition("val_acc>=0.9"));
//   rules.require_verified = true;
//   ASSIGN_OR_RETURN(PromotionResult promoted,
//                    Promote(store, "resnet", 7, "production", rules, "weekly release"));
//   ...
//   ASSIGN_OR_RETURN(AliasMove back, Rollback(store, "resnet", "production", "bad canary"));

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/registry.pb.h"

namespace ckpt {

// What a version must satisfy to be promoted.
struct PromotionRules {
  // Every condition must hold over the version's effective metrics; a missing metric fails.
  std::vector<v1::VersionFilter::MetricRange> requirements;
  // Re-hash every chunk of the version first; any problem refuses the promotion.
  bool require_verified = false;
};

struct PromotionResult {
  int64_t previous_version = 0;  // where the alias pointed before; 0 if it is new.
  std::string reason;            // as recorded in the history.
};

// Points `alias` of `model` at `version` if `rules` hold. FAILED_PRECONDITION listing every rule
// that failed ("cannot promote resnet@7 to production: val_acc is 0.87, below 0.9; it has no
// metric 'f1'"), or when the alias moved while the rules were checked (compare-and-set); NOT_FOUND
// for a missing model or version; INVALID_ARGUMENT for a bad or reserved alias ("latest"). The
// recorded reason is what was checked, then `reason` when not empty.
absl::StatusOr<PromotionResult> Promote(CheckpointStore& store, absl::string_view model,
                                        int64_t version, absl::string_view alias,
                                        const PromotionRules& rules, absl::string_view reason);

struct AliasMove {
  int64_t from_version = 0;
  int64_t to_version = 0;
  std::string reason;  // as recorded in the history.
};

// Moves `alias` of `model` back to where it pointed before its last move (see above), recorded
// with the reason "rollback of ALIAS from X to Y", then `reason` when not empty.
// FAILED_PRECONDITION when the alias was created where it points (nothing to go back to), when the
// history holds no move to its current version, when the version before was deleted, or when the
// alias moved meanwhile; NOT_FOUND for a missing model or alias.
absl::StatusOr<AliasMove> Rollback(CheckpointStore& store, absl::string_view model,
                                   absl::string_view alias, absl::string_view reason);

}  // namespace ckpt

#endif  // CKPT_LIBS_REGISTRY_PROMOTION_H_
