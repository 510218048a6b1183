#include "tools/ckpt/registry_commands.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "libs/io/proto_json.h"
#include "libs/registry/promotion.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_filter.h"
#include "libs/store/version_filter_text.h"
#include "libs/store/version_ref.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt/store_access.h"

namespace ckpt {

cli::OptionSpec ReasonOption() {
  return {"reason", "TEXT", "why, recorded with the change in the history", ""};
}

namespace {

// "KEY=VALUE" values of a repeatable option, by key (the last wins).
absl::StatusOr<std::map<std::string, std::string>> KeyValues(const cli::ParsedCommandLine& line,
                                                             const std::string& option) {
  std::map<std::string, std::string> pairs;
  for (const std::string& text : line.GetAll(option)) {
    const size_t equals = text.find('=');
    if (equals == std::string::npos || equals == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", option, " '", text, "' is not KEY=VALUE"));
    }
    pairs[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return pairs;
}

// --metric NAME=NUMBER values: finite numbers only (the store refuses others).
absl::StatusOr<std::map<std::string, double>> Metrics(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(auto pairs, KeyValues(line, "metric"));
  std::map<std::string, double> metrics;
  for (const auto& [name, text] : pairs) {
    double value = 0;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metric ", name, "=", text, ": the value must be a finite number"));
    }
    metrics[name] = value;
  }
  return metrics;
}

std::string TagsText(const google::protobuf::Map<std::string, std::string>& tags) {
  std::vector<std::string> pairs;
  for (const auto& [key, value] : tags) pairs.push_back(absl::StrCat(key, "=", value));
  std::sort(pairs.begin(), pairs.end());
  return absl::StrJoin(pairs, " ");
}

std::string MetricsText(const google::protobuf::Map<std::string, double>& metrics) {
  std::vector<std::string> pairs;
  for (const auto& [name, value] : metrics) pairs.push_back(absl::StrCat(name, "=", value));
  std::sort(pairs.begin(), pairs.end());
  return absl::StrJoin(pairs, " ");
}

// ---- ckpt model.

absl::Status PrintModel(const v1::ModelInfo& model, bool json) {
  if (json) {
    ASSIGN_OR_RETURN(const std::string text, ProtoToJson(model));
    std::cout << text << "\n";
    return absl::OkStatus();
  }
  const v1::ModelDetails& details = model.details();
  std::cout << "model: " << model.name() << "\n";
  if (!details.description().empty()) std::cout << "description: " << details.description() << "\n";
  if (!details.owner().empty()) std::cout << "owner: " << details.owner() << "\n";
  if (!details.tags().empty()) std::cout << "tags: " << TagsText(details.tags()) << "\n";
  if (details.created_unix_micros() > 0) {
    std::cout << "created: " << UtcTimeText(details.created_unix_micros()) << "\n";
  }
  if (details.updated_unix_micros() > 0) {
    std::cout << "updated: " << UtcTimeText(details.updated_unix_micros()) << " by "
              << details.updated_by() << "\n";
  }
  std::cout << "versions: " << model.version_count() << " (latest " << model.latest_version()
            << ")\n";
  std::vector<std::string> aliases;
  for (const auto& [alias, version] : model.aliases()) {
    aliases.push_back(absl::StrCat(alias, "=", version));
  }
  std::sort(aliases.begin(), aliases.end());
  std::cout << "aliases: " << (aliases.empty() ? "none" : absl::StrJoin(aliases, " ")) << "\n";
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelInfo> FindModel(CheckpointStore& store, const std::string& name) {
  ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store.ListModels());
  for (v1::ModelInfo& model : models) {
    if (model.name() == name) return std::move(model);
  }
  return absl::NotFoundError(absl::StrCat("model '", name, "' not found"));
}

absl::Status RunModel(const cli::ParsedCommandLine& line) {
  const std::string& action = line.arguments()[0];
  const std::string& name = line.arguments()[1];
  const size_t wanted = action == "rename" ? 3 : 2;
  if (action != "create" && action != "show" && action != "update" && action != "rename" &&
      action != "delete") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model action '", action, "'; actions: create, show, update, rename, delete"));
  }
  if (line.arguments().size() != wanted) {
    return absl::InvalidArgumentError(action == "rename"
                                          ? "model rename takes NAME NEW_NAME"
                                          : absl::StrCat("model ", action, " takes NAME"));
  }
  const bool detail_options =
      line.Has("description") || line.Has("owner") || line.Has("tag") || line.Has("remove-tag");
  if (detail_options && action != "create" && action != "update") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--description, --owner, --tag and --remove-tag go with model create or update, not ",
        action));
  }
  if (line.Has("force") && action != "delete") {
    return absl::InvalidArgumentError("--force goes with model delete");
  }
  ASSIGN_OR_RETURN(auto tags, KeyValues(line, "tag"));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, action == "create"));
  const ChangeAttribution attribution = AttributionFromOptions(line);
  if (action == "create") {
    if (line.Has("remove-tag")) return absl::InvalidArgumentError("--remove-tag goes with update");
    v1::ModelDetails details;
    details.set_description(line.Get("description"));
    details.set_owner(line.Get("owner"));
    details.mutable_tags()->insert(tags.begin(), tags.end());
    ASSIGN_OR_RETURN(v1::ModelInfo created, store->CreateModel(name, details, attribution));
    std::cout << "created model " << created.name() << "\n";
    return absl::OkStatus();
  }
  if (action == "show") {
    ASSIGN_OR_RETURN(v1::ModelInfo model, FindModel(*store, name));
    return PrintModel(model, line.Has("json"));
  }
  if (action == "update") {
    if (!detail_options) {
      return absl::InvalidArgumentError(
          "model update needs --description, --owner, --tag or --remove-tag");
    }
    v1::ModelDetailsChange change;
    if (line.Has("description")) change.set_description(line.Get("description"));
    if (line.Has("owner")) change.set_owner(line.Get("owner"));
    change.mutable_set_tags()->insert(tags.begin(), tags.end());
    for (const std::string& key : line.GetAll("remove-tag")) change.add_remove_tags(key);
    ASSIGN_OR_RETURN(v1::ModelInfo updated, store->UpdateModel(name, change, attribution));
    std::cout << "updated model " << updated.name() << "\n";
    return PrintModel(updated, false);
  }
  if (action == "rename") {
    RETURN_IF_ERROR(store->RenameModel(name, line.arguments()[2], attribution));
    std::cout << "renamed model " << name << " to " << line.arguments()[2] << " (the name " << name
              << " stays reserved)\n";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(v1::DeleteModelResponse deleted,
                   store->DeleteModel(name, line.Has("force"), attribution));
  std::cout << "deleted model " << name << " with " << deleted.versions_deleted() << " version(s); "
            << deleted.bytes_released() << " bytes no longer referenced (freed by ckpt gc)\n";
  return absl::OkStatus();
}

// ---- ckpt annotate.

absl::Status RunAnnotate(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(v1::VersionRef ref, RefWithVersion(line.arguments()[0]));
  v1::AnnotationChange change;
  ASSIGN_OR_RETURN(auto metrics, Metrics(line));
  change.mutable_set_metrics()->insert(metrics.begin(), metrics.end());
  ASSIGN_OR_RETURN(auto tags, KeyValues(line, "tag"));
  change.mutable_set_tags()->insert(tags.begin(), tags.end());
  for (const std::string& name : line.GetAll("remove-metric")) change.add_remove_metrics(name);
  for (const std::string& key : line.GetAll("remove-tag")) change.add_remove_tags(key);
  if (line.Has("description")) change.set_description(line.Get("description"));
  if (change.set_metrics().empty() && change.set_tags().empty() &&
      change.remove_metrics().empty() && change.remove_tags().empty() &&
      !change.has_description()) {
    return absl::InvalidArgumentError(
        "annotate needs --metric, --tag, --remove-metric, --remove-tag or --description");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(
      v1::VersionAnnotations annotations,
      store->AnnotateVersion(ref.model(), ref.version(), change, AttributionFromOptions(line)));
  std::cout << "annotated " << FormatVersionRef(ref) << "\n";
  if (!annotations.metrics().empty()) {
    std::cout << "metrics: " << MetricsText(annotations.metrics()) << "\n";
  }
  if (!annotations.tags().empty()) std::cout << "tags: " << TagsText(annotations.tags()) << "\n";
  if (!annotations.description().empty()) {
    std::cout << "description: " << annotations.description() << "\n";
  }
  return absl::OkStatus();
}

// ---- ckpt history.

// What `event` changed, for people.
std::string EventText(const v1::RegistryEvent& event) {
  const std::string version = FormatVersionRef(event.model(), event.version());
  switch (event.kind()) {
    case v1::RegistryEvent::MODEL_CREATED: {
      std::string text = absl::StrCat("created model ", event.model());
      if (!event.details().owner().empty())
        absl::StrAppend(&text, ", owner ", event.details().owner());
      return text;
    }
    case v1::RegistryEvent::MODEL_UPDATED: {
      std::vector<std::string> parts;
      if (!event.details().description().empty()) {
        parts.push_back(absl::StrCat("description '", event.details().description(), "'"));
      }
      if (!event.details().owner().empty()) parts.push_back("owner " + event.details().owner());
      if (!event.details().tags().empty())
        parts.push_back("tags " + TagsText(event.details().tags()));
      return absl::StrCat("updated model ", event.model(), parts.empty() ? "" : ": now ",
                          absl::StrJoin(parts, ", "));
    }
    case v1::RegistryEvent::MODEL_RENAMED:
      return absl::StrCat("renamed model ", event.model(), " to ", event.new_name());
    case v1::RegistryEvent::MODEL_DELETED:
      return absl::StrCat("deleted model ", event.model());
    case v1::RegistryEvent::VERSION_COMMITTED:
      return absl::StrCat("committed ", version,
                          event.alias().empty() ? "" : absl::StrCat(" as ", event.alias()));
    case v1::RegistryEvent::VERSION_DELETED:
      return absl::StrCat(
          "deleted ", version,
          event.alias().empty() ? "" : absl::StrCat(" and its aliases ", event.alias()));
    case v1::RegistryEvent::VERSION_ANNOTATED: {
      std::vector<std::string> parts;
      if (!event.annotations().metrics().empty()) {
        parts.push_back("metrics " + MetricsText(event.annotations().metrics()));
      }
      if (!event.annotations().tags().empty()) {
        parts.push_back("tags " + TagsText(event.annotations().tags()));
      }
      if (!event.annotations().description().empty()) {
        parts.push_back(absl::StrCat("description '", event.annotations().description(), "'"));
      }
      return absl::StrCat("annotated ", version, parts.empty() ? ": now none" : ": now ",
                          absl::StrJoin(parts, ", "));
    }
    case v1::RegistryEvent::ALIAS_SET:
      return absl::StrCat(event.model(), "@", event.alias(), " ",
                          event.previous_version() > 0 ? absl::StrCat(event.previous_version())
                                                       : std::string("(new)"),
                          " -> ", event.version());
    case v1::RegistryEvent::ALIAS_DELETED:
      return absl::StrCat(event.model(), "@", event.alias(), " deleted (was ",
                          event.previous_version(), ")");
    case v1::RegistryEvent::OPTIMIZER_STATE_DROPPED:
      return absl::StrCat("dropped the optimizer state of ", version);
    default:
      return absl::StrCat("event of kind ", static_cast<int>(event.kind()));
  }
}

// One event as `ckpt audit --json` prints a record: flat, numbers as numbers.
absl::StatusOr<nlohmann::ordered_json> HistoryJson(const v1::RegistryEvent& event) {
  nlohmann::ordered_json json;
  json["sequence"] = event.sequence();
  json["time"] = UtcTimeText(event.unix_micros());
  json["unix_micros"] = event.unix_micros();
  json["identity"] = event.identity();
  json["kind"] = v1::RegistryEvent::Kind_Name(event.kind());
  json["model"] = event.model();
  json["version"] = event.version();
  json["alias"] = event.alias();
  json["previous_version"] = event.previous_version();
  if (!event.new_name().empty()) json["new_name"] = event.new_name();
  if (event.has_annotations()) {
    ASSIGN_OR_RETURN(const std::string annotations, ProtoToJson(event.annotations()));
    json["annotations"] = nlohmann::json::parse(annotations);
  }
  if (event.has_details()) {
    ASSIGN_OR_RETURN(const std::string details, ProtoToJson(event.details()));
    json["details"] = nlohmann::json::parse(details);
  }
  json["what"] = EventText(event);
  json["reason"] = event.reason();
  return json;
}

absl::Status RunHistory(const cli::ParsedCommandLine& line) {
  HistoryQuery query;
  if (!line.arguments().empty()) {
    const std::string& target = line.arguments()[0];
    ASSIGN_OR_RETURN(const v1::VersionRef ref, ParseVersionRef(target));
    if (ref.ref_case() == v1::VersionRef::kVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat("history shows a model's or an alias's changes (MODEL, MODEL@production), "
                       "not a version's: '",
                       target, "' names version ", ref.version()));
    }
    query.model = ref.model();
    // "latest" (also what a bare MODEL parses to) moves with every commit: its history is the
    // model's.
    if (ref.alias() != kLatestAlias) query.alias = ref.alias();
  }
  if (line.Has("since")) {
    ASSIGN_OR_RETURN(query.since, ParseTimeOption("since", line.Get("since")));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> events, store->ListHistory(query));
  for (const v1::RegistryEvent& event : events) {
    if (line.Has("json")) {
      ASSIGN_OR_RETURN(const nlohmann::ordered_json json, HistoryJson(event));
      std::cout << json.dump() << "\n";
      continue;
    }
    std::cout << UtcTimeText(event.unix_micros()) << "  "
              << (event.identity().empty() ? "unknown" : event.identity()) << "  "
              << v1::RegistryEvent::Kind_Name(event.kind()) << "  " << EventText(event);
    if (!event.reason().empty()) std::cout << "  reason: " << event.reason();
    std::cout << "\n";
  }
  return absl::OkStatus();
}

// ---- ckpt promote and rollback.

absl::Status RunPromote(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(v1::VersionRef ref, RefWithVersion(line.arguments()[0]));
  const std::string& alias = line.arguments()[1];
  PromotionRules rules;
  for (const std::string& condition : line.GetAll("require")) {
    ASSIGN_OR_RETURN(v1::VersionFilter::MetricRange range, ParseMetricCondition(condition));
    rules.requirements.push_back(std::move(range));
  }
  rules.require_verified = line.Has("require-verified");
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(PromotionResult promoted,
                   Promote(*store, ref.model(), ref.version(), alias, rules, line.Get("reason")));
  std::cout << ref.model() << "@" << alias << " -> " << ref.version()
            << (promoted.previous_version > 0
                    ? absl::StrCat(" (was ", promoted.previous_version, ")")
                    : std::string(" (new)"))
            << "\nrecorded: " << promoted.reason << "\n";
  return absl::OkStatus();
}

absl::Status RunRollback(const cli::ParsedCommandLine& line) {
  const std::string& model = line.arguments()[0];
  const std::string& alias = line.arguments()[1];
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(AliasMove move, Rollback(*store, model, alias, line.Get("reason")));
  std::cout << model << "@" << alias << " -> " << move.to_version << " (was " << move.from_version
            << ")\nrecorded: " << move.reason << "\n";
  return absl::OkStatus();
}

}  // namespace

ChangeAttribution AttributionFromOptions(const cli::ParsedCommandLine& line) {
  ChangeAttribution attribution;
  attribution.reason = line.Get("reason");
  return attribution;
}

const std::vector<cli::CommandSpec>& RegistryCommands() {
  static const auto* commands = new std::vector<cli::CommandSpec>{
      {"model",
       "create|show|update|rename|delete NAME [NEW_NAME]",
       "The registry's record of a model: create it with its details before its first version "
       "(a first import creates it without), show, update, rename (versions, aliases and "
       "annotations move with it; the old name stays reserved), delete.",
       2,
       3,
       {{"description", "TEXT", "create / update: what the model is", ""},
        {"owner", "TEAM", "create / update: the team or person who owns it", ""},
        {"tag", "KEY=VALUE", "create / update: set a tag", "", true},
        {"remove-tag", "KEY", "update: remove a tag", "", true},
        {"force", "", "delete: also when it has versions (they and their aliases go too)", ""},
        {"json", "", "show: print the model as JSON", ""},
        ReasonOption()}},
      {"annotate",
       "MODEL@VERSION",
       "Record what was learned about a version after its commit: metrics (e.g. from "
       "evaluation; they win over commit-time metrics of the same name), tags, a description.",
       1,
       1,
       {{"metric", "NAME=NUMBER", "set a metric", "", true},
        {"tag", "KEY=VALUE", "set a tag", "", true},
        {"remove-metric", "NAME", "remove a metric", "", true},
        {"remove-tag", "KEY", "remove a tag", "", true},
        {"description", "TEXT", "replace the description", ""},
        ReasonOption()}},
      {"history",
       "[MODEL[@ALIAS]]",
       "Every change to the registry (or MODEL, or one alias of it), oldest first: time, who, "
       "kind, what changed, why.",
       0,
       1,
       {{"since", "DURATION|TIME",
         "only events in the last DURATION (30m, 24h, 7d) or since an RFC 3339 TIME", "all"},
        {"json", "", "one JSON object per event and line", ""}}},
      {"promote",
       "MODEL@VERSION ALIAS",
       "Point ALIAS at a version only if it passes the rules; the reason recorded says what was "
       "checked. The alias is compare-and-set: a concurrent move makes this fail, not vanish.",
       2,
       2,
       {{"require", "METRIC>=X|METRIC<=X|METRIC=X|METRIC=LO..HI",
         "a metric condition the version must meet (annotation metrics over commit-time ones)", "",
         true},
        {"require-verified", "", "re-hash every chunk of the version first; refuse on problems",
         ""},
        ReasonOption()}},
      {"rollback",
       "MODEL ALIAS",
       "Move ALIAS back to where it pointed before its last move (from the history); a second "
       "rollback undoes the first.",
       2,
       2,
       {ReasonOption()}},
  };
  return *commands;
}

absl::Status RunRegistryCommand(const cli::ParsedCommandLine& line) {
  const std::string& command = line.command();
  if (command == "model") return RunModel(line);
  if (command == "annotate") return RunAnnotate(line);
  if (command == "history") return RunHistory(line);
  if (command == "promote") return RunPromote(line);
  if (command == "rollback") return RunRollback(line);
  return absl::InternalError(absl::StrCat("'", command, "' is not a registry command"));
}

std::vector<cli::OptionSpec> VersionFilterOptions() {
  return {
      {"tag", "KEY=VALUE|KEY", "only versions annotated with this tag (or key)", "", true},
      {"label", "KEY=VALUE|KEY", "only versions committed with this label (or key)", "", true},
      {"where", "METRIC>=X|METRIC<=X|METRIC=X|METRIC=LO..HI",
       "only versions whose metric meets the condition", "", true},
      {"since", "DURATION|TIME", "only versions created in the last DURATION or since TIME", ""},
      {"until", "DURATION|TIME", "only versions created before DURATION ago or before TIME", ""},
  };
}

bool HasVersionFilter(const cli::ParsedCommandLine& line) {
  return line.Has("tag") || line.Has("label") || line.Has("where") || line.Has("since") ||
         line.Has("until");
}

absl::StatusOr<v1::VersionFilter> VersionFilterFromOptions(const cli::ParsedCommandLine& line) {
  VersionFilterText text;
  text.tags = line.GetAll("tag");
  text.labels = line.GetAll("label");
  text.where = line.GetAll("where");
  if (line.Has("since")) text.since = line.Get("since");
  if (line.Has("until")) text.until = line.Get("until");
  return VersionFilterFromText(text);
}

std::vector<cli::OptionSpec> ImportRecordOptions() {
  return {
      {"label", "KEY=VALUE", "a label recorded with the version", "", true},
      {"metric", "NAME=NUMBER", "a commit-time metric (e.g. the training loss)", "", true},
      {"run-id", "ID", "lineage: the training run (or job) that produced it", ""},
      {"parent", "MODEL@VERSION", "lineage: the version it was made from (a number, not an alias)",
       ""},
      {"parent-relation", "RELATION",
       "lineage: how it was made from --parent (fine_tuned_from, resumed_from, distilled_from)",
       ""},
      {"code-revision", "REV", "lineage: the training code's revision (e.g. a git commit)", ""},
      {"dataset", "NAME", "lineage: name, URI or hash of the training data", ""},
  };
}

absl::Status ApplyImportRecordOptions(const cli::ParsedCommandLine& line, CheckpointStore& store,
                                      ImportOptions& options) {
  ASSIGN_OR_RETURN(auto labels, KeyValues(line, "label"));
  for (auto& [key, value] : labels) options.labels[key] = value;
  ASSIGN_OR_RETURN(options.metrics, Metrics(line));
  v1::Lineage& lineage = options.lineage;
  lineage.set_run_id(line.Get("run-id"));
  lineage.set_code_revision(line.Get("code-revision"));
  lineage.set_dataset(line.Get("dataset"));
  lineage.set_parent_relation(line.Get("parent-relation"));
  if (line.Has("parent-relation") && !line.Has("parent")) {
    return absl::InvalidArgumentError("--parent-relation needs --parent MODEL@VERSION");
  }
  if (line.Has("parent")) {
    absl::StatusOr<v1::VersionRef> parent = RefWithVersion(line.Get("parent"));
    if (!parent.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--parent: ", parent.status().message(),
                                                     " (an alias moves; lineage must stay true)"));
    }
    // A lineage naming a version that is not there would mislead whoever follows it.
    absl::StatusOr<v1::Manifest> found = store.GetManifest(*parent);
    if (!found.ok()) {
      return absl::Status(found.status().code(),
                          absl::StrCat("--parent: ", found.status().message()));
    }
    lineage.set_parent(FormatVersionRef(*parent));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
