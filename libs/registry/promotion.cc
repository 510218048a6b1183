#include "libs/registry/promotion.h"

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_filter.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

// Where `alias` of `model` points now; nullopt when the alias does not exist. The caller has
// already seen the model exist, so NOT_FOUND here can only be the alias.
absl::StatusOr<std::optional<int64_t>> CurrentAliasVersion(CheckpointStore& store,
                                                           absl::string_view model,
                                                           absl::string_view alias) {
  v1::VersionRef ref;
  ref.set_model(std::string(model));
  ref.set_alias(std::string(alias));
  absl::StatusOr<v1::Manifest> manifest = store.GetManifest(ref);
  if (absl::IsNotFound(manifest.status())) return std::nullopt;
  if (!manifest.ok()) return manifest.status();
  return manifest->version();
}

// "val_acc 0.93 >= 0.9": the condition with the value that met it.
std::string MetCondition(const std::map<std::string, double>& metrics,
                         const v1::VersionFilter::MetricRange& range) {
  const double value = metrics.at(range.name());
  if (range.has_min() && range.has_max()) {
    if (range.min() == range.max())
      return absl::StrCat(range.name(), " ", value, " = ", range.min());
    return absl::StrCat(range.name(), " ", value, " in ", range.min(), "..", range.max());
  }
  if (range.has_min()) return absl::StrCat(range.name(), " ", value, " >= ", range.min());
  return absl::StrCat(range.name(), " ", value, " <= ", range.max());
}

std::string WithCallerReason(std::string recorded, absl::string_view reason) {
  if (!reason.empty()) absl::StrAppend(&recorded, "; ", reason);
  return recorded;
}

}  // namespace

absl::StatusOr<PromotionResult> Promote(CheckpointStore& store, absl::string_view model,
                                        int64_t version, absl::string_view alias,
                                        const PromotionRules& rules, absl::string_view reason) {
  RETURN_IF_ERROR(ValidateAliasName(alias));
  if (version <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("promote needs a version number >= 1; got ", version));
  }
  const std::string named = FormatVersionRef(model, version);
  // Read the alias before checking, so a move made while the rules run is caught by the
  // compare-and-set rather than overwritten by a decision taken on older facts.
  ASSIGN_OR_RETURN(v1::Manifest manifest, store.GetManifest(MakeVersionRef(model, version)));
  ASSIGN_OR_RETURN(std::optional<int64_t> current, CurrentAliasVersion(store, model, alias));

  v1::VersionInfo info;
  info.set_version(manifest.version());
  *info.mutable_metadata() = manifest.metadata();
  *info.mutable_annotations() = manifest.annotations();
  const std::map<std::string, double> metrics = EffectiveMetrics(info);
  std::vector<std::string> failures;
  std::vector<std::string> met;
  for (const v1::VersionFilter::MetricRange& range : rules.requirements) {
    v1::VersionFilter filter;
    *filter.add_metrics() = range;
    RETURN_IF_ERROR(ValidateVersionFilter(filter));
    std::string failure = MetricConditionFailure(metrics, range);
    if (failure.empty()) {
      met.push_back(MetCondition(metrics, range));
    } else {
      failures.push_back(absl::StrCat(failure, " (rule ", FormatMetricCondition(range), ")"));
    }
  }
  if (rules.require_verified && !failures.empty()) {
    // Re-hashing can take minutes on a large version; not worth it for a refused promotion.
    failures.push_back("not verified (refused on its metrics first)");
  } else if (rules.require_verified) {
    ASSIGN_OR_RETURN(v1::VerifyResponse verified, store.Verify(model, version));
    if (verified.problems_size() > 0) {
      std::vector<std::string> problems;
      for (const v1::VerifyProblem& problem : verified.problems()) {
        problems.push_back(absl::StrCat(problem.tensor_key(), ": ", problem.message()));
      }
      failures.push_back(absl::StrCat("verification found ", verified.problems_size(),
                                      " problem(s): ", absl::StrJoin(problems, "; ")));
    } else {
      met.push_back("verified");
    }
  }
  if (!failures.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot promote ", named, " to ", alias, ": ", absl::StrJoin(failures, "; ")));
  }

  PromotionResult result;
  result.reason =
      WithCallerReason(absl::StrCat("promoted ", named, met.empty() ? " (no rules)" : ": ",
                                    absl::StrJoin(met, ", ")),
                       reason);
  // A new alias is compare-and-set against its absence: two promotions creating it cannot both
  // win.
  absl::StatusOr<int64_t> previous = store.SetAlias(
      model, alias, version, current.value_or(kAliasMustNotExist), {"", result.reason});
  if (absl::IsFailedPrecondition(previous.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot promote ", named, ": ", model, "@", alias, " moved while the rules were checked (",
        previous.status().message(), "); check the new state and try again"));
  }
  if (!previous.ok()) return previous.status();
  result.previous_version = *previous;
  return result;
}

absl::StatusOr<AliasMove> Rollback(CheckpointStore& store, absl::string_view model,
                                   absl::string_view alias, absl::string_view reason) {
  RETURN_IF_ERROR(ValidateModelName(model));
  RETURN_IF_ERROR(ValidateAliasName(alias));
  v1::VersionRef ref;
  ref.set_model(std::string(model));
  ref.set_alias(std::string(alias));
  ASSIGN_OR_RETURN(v1::Manifest manifest, store.GetManifest(ref));
  const int64_t current = manifest.version();

  HistoryQuery query;
  query.model = std::string(model);
  query.alias = std::string(alias);
  ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> history, store.ListHistory(query));
  const v1::RegistryEvent* last_move = nullptr;
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (it->kind() == v1::RegistryEvent::ALIAS_SET && it->version() == current) {
      last_move = &*it;
      break;
    }
  }
  const std::string at = absl::StrCat(model, "@", alias);
  if (last_move == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll back ", at, ": the history holds no move of it to version ", current,
        " (it was set before the store kept a history, or under another model name)"));
  }
  const int64_t previous = last_move->previous_version();
  if (previous == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll back ", at, ": it was created at ", FormatVersionRef(model, current),
        "; there is no earlier version to go back to"));
  }
  absl::StatusOr<v1::Manifest> target = store.GetManifest(MakeVersionRef(model, previous));
  if (absl::IsNotFound(target.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot roll back ", at, " from ", current, " to ", previous, ": ",
                     FormatVersionRef(model, previous), " no longer exists (deleted)"));
  }
  if (!target.ok()) return target.status();

  AliasMove move;
  move.from_version = current;
  move.to_version = previous;
  move.reason = WithCallerReason(
      absl::StrCat("rollback of ", alias, " from ", current, " to ", previous), reason);
  absl::StatusOr<int64_t> moved =
      store.SetAlias(model, alias, previous, current, {"", move.reason});
  if (absl::IsFailedPrecondition(moved.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll back ", at, ": it moved meanwhile (", moved.status().message(), ")"));
  }
  if (!moved.ok()) return moved.status();
  return move;
}

}  // namespace ckpt
