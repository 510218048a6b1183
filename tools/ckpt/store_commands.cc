#include "tools/ckpt/store_commands.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "libs/client/who_am_i.h"
#include "libs/format/inspect.h"
#include "libs/io/proto_json.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_import.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/version_diff.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "tools/ckpt/file_commands.h"
#include "tools/ckpt/output.h"
#include "tools/ckpt/registry_commands.h"
#include "tools/ckpt/store_access.h"

namespace ckpt {
namespace {

// `options` followed by `more`.
std::vector<cli::OptionSpec> With(std::vector<cli::OptionSpec> options,
                                  const std::vector<cli::OptionSpec>& more) {
  options.insert(options.end(), more.begin(), more.end());
  return options;
}

// Local time, to the second, for people; "-" for no time.
std::string TimeText(int64_t unix_micros) {
  if (unix_micros <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

}  // namespace

cli::CommandSpec ImportCommand() {
  return {
      "import",
      "FILE",
      "Store FILE (torch .pt zip or legacy, whole pickled model, bundle, safetensors, or Hugging "
      "Face's sharded safetensors: a directory or its model.safetensors.index.json) as a new "
      "version of --model.",
      1,
      1,
      With({{"model", "NAME", "model to add the version to ([A-Za-z0-9._-], required)", ""},
            {"alias", "A[,B]", "aliases to point at the new version", ""},
            {"strip-prefix", "auto|none|PREFIX", "wrapper prefixes to strip (recorded)", "auto"},
            {"key", "PATH", "where the model state dict is in FILE (0: a list's first item)",
             "auto"},
            {"max-expanded-bytes", "BYTES",
             "refuse a file whose tensors would together take this many bytes more once "
             "materialized than the file stores (broadcast or overlapping views); 0: 1/8 of this "
             "host's available memory",
             "0"},
            {"description", "TEXT", "free text stored with the version", ""}},
           ImportRecordOptions())};
}

cli::CommandSpec ListCommand() {
  return {"ls",
          "[MODEL]",
          "List models, or the versions of MODEL (those the filters select, when given).",
          0,
          1,
          VersionFilterOptions()};
}

cli::CommandSpec ShowCommand() {
  return {"show",
          "MODEL[@REF]",
          "Show a version's manifest: metadata, tensors, optimizer and scheduler state.",
          1,
          1,
          {{"json", "", "print the manifest as JSON", ""}}};
}

cli::CommandSpec TagCommand() {
  return {"tag",
          "MODEL@VERSION ALIAS",
          "Point ALIAS at MODEL@VERSION (moves it if it exists; see also promote).",
          2,
          2,
          {ReasonOption()}};
}

cli::CommandSpec UntagCommand() {
  return {"untag", "MODEL ALIAS", "Delete an alias.", 2, 2, {ReasonOption()}};
}

cli::CommandSpec RemoveCommand() {
  return {"rm",
          "MODEL@VERSION",
          "Delete a version (its bytes are freed by the next gc).",
          1,
          1,
          {{"force", "", "also when aliases point at it (they are removed)", ""}, ReasonOption()}};
}

cli::CommandSpec DiffCommand() {
  return {"diff",
          "MODEL@A MODEL@B",
          "Model tensors added, removed and changed between two versions.",
          2,
          2,
          {}};
}

cli::CommandSpec WhoAmICommand() {
  return {"whoami",
          "",
          "Who the --store (or --loader) service takes you to be -- identity, role, model scope, "
          "address -- and, with --model, which of its changes you may make on that model, as its "
          "access policy answers them.",
          0,
          0,
          {{"model", "MODEL", "the model to ask about", "none: the role alone"}}};
}

cli::CommandSpec StatsCommand() {
  return {"stats", "", "Models, versions, logical vs physical bytes, dedup ratio.", 0, 0, {}};
}

absl::Status RunImport(const cli::ParsedCommandLine& line) {
  if (line.Get("model").empty()) {
    return absl::InvalidArgumentError("import needs --model NAME");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, /*create=*/true));
  ImportOptions options;
  options.strip_prefix = line.Get("strip-prefix");
  options.model_key = line.Has("key") ? line.Get("key") : "";
  ASSIGN_OR_RETURN(options.max_expanded_bytes, MaxExpandedBytes(line));
  options.description = line.Get("description");
  if (line.Has("alias")) {
    options.aliases = absl::StrSplit(line.Get("alias"), ',', absl::SkipEmpty());
  }
  RETURN_IF_ERROR(ApplyImportRecordOptions(line, *store, options));
  ProgressBar bar("importing");
  options.progress = [&](int64_t done, int64_t total) {
    bar.Update(done, total, absl::StrCat(HumanBytes(done), " / ", HumanBytes(total)));
  };
  ASSIGN_OR_RETURN(ImportResult result,
                   ImportCheckpointFile(*store, line.arguments()[0], line.Get("model"), options));
  std::cout << "imported " << line.arguments()[0] << " (" << result.source_format << ") as "
            << FormatVersionRef(result.commit.version) << ": "
            << HumanBytes(result.commit.logical_bytes) << ", "
            << HumanBytes(result.commit.new_bytes) << " new after dedup\n";
  if (!result.stripped_prefix.empty()) {
    std::cout << "stripped wrapper prefix '" << result.stripped_prefix << "' (recorded)\n";
  }
  for (const std::string& warning : result.warnings) std::cerr << "warning: " << warning << "\n";
  return absl::OkStatus();
}

absl::Status RunList(const cli::ParsedCommandLine& line) {
  if (line.arguments().empty() && HasVersionFilter(line)) {
    return absl::InvalidArgumentError("--tag, --label, --where, --since and --until need a MODEL");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  if (line.arguments().empty()) {
    ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store->ListModels());
    std::cout << absl::StrFormat("%-32s %8s %7s %12s  %s\n", "MODEL", "VERSIONS", "LATEST", "BYTES",
                                 "ALIASES");
    for (const v1::ModelInfo& model : models) {
      std::vector<std::string> aliases;
      for (const auto& [alias, version] : model.aliases()) {
        aliases.push_back(absl::StrCat(alias, "=", version));
      }
      std::sort(aliases.begin(), aliases.end());
      std::cout << absl::StrFormat("%-32s %8d %7d %12s  %s\n", model.name(), model.version_count(),
                                   model.latest_version(), HumanBytes(model.logical_bytes()),
                                   absl::StrJoin(aliases, " "));
    }
    return absl::OkStatus();
  }
  std::vector<v1::VersionInfo> versions;
  if (HasVersionFilter(line)) {
    ASSIGN_OR_RETURN(v1::VersionFilter filter, VersionFilterFromOptions(line));
    ASSIGN_OR_RETURN(versions, store->FindVersions(line.arguments()[0], filter));
  } else {
    ASSIGN_OR_RETURN(versions, store->ListVersions(line.arguments()[0]));
  }
  std::cout << absl::StrFormat("%-8s %-19s %6s %8s %8s %10s %7s %-5s %s\n", "VERSION", "CREATED",
                               "EPOCH", "STEP", "TENSORS", "BYTES", "OPTIM", "SCHED", "ALIASES");
  for (const v1::VersionInfo& version : versions) {
    std::cout << absl::StrFormat(
        "%-8d %-19s %6d %8d %8d %10s %7s %-5s %s\n", version.version(),
        TimeText(version.metadata().created_unix_micros()), version.metadata().epoch(),
        version.metadata().global_step(), version.tensor_count(),
        HumanBytes(version.logical_bytes()), version.has_optimizer_state() ? "yes" : "-",
        version.has_scheduler_state() ? "yes" : "-", absl::StrJoin(version.aliases(), " "));
  }
  return absl::OkStatus();
}

absl::Status RunShow(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
  ASSIGN_OR_RETURN(v1::Manifest manifest, store->GetManifest(ref));
  if (line.Has("json")) {
    ASSIGN_OR_RETURN(std::string json, ProtoToJson(manifest, /*indented=*/true));
    std::cout << json << "\n";
    return absl::OkStatus();
  }
  const v1::VersionMetadata& metadata = manifest.metadata();
  int64_t model_bytes = 0, state_bytes = 0;
  for (const v1::TensorMeta& meta : manifest.tensors()) model_bytes += meta.byte_length();
  for (const v1::TensorMeta& meta : manifest.state_tensors()) state_bytes += meta.byte_length();
  std::cout << FormatVersionRef(manifest.model(), manifest.version())
            << (manifest.aliases().empty()
                    ? ""
                    : absl::StrCat(" (", absl::StrJoin(manifest.aliases(), ", "), ")"))
            << "\ncreated: " << TimeText(metadata.created_unix_micros())
            << "\nsource: " << metadata.source_format() << " by " << metadata.producer();
  if (metadata.labels().count("source_file")) {
    std::cout << " from " << metadata.labels().at("source_file");
  }
  std::cout << "\nepoch: " << metadata.epoch() << ", step: " << metadata.global_step() << "\n";
  for (const auto& [name, value] : metadata.metrics()) std::cout << name << ": " << value << "\n";
  if (!metadata.description().empty())
    std::cout << "description: " << metadata.description() << "\n";
  const v1::Lineage& lineage = metadata.lineage();
  if (!lineage.run_id().empty()) std::cout << "run: " << lineage.run_id() << "\n";
  if (!lineage.parent().empty()) {
    std::cout << "parent: " << lineage.parent()
              << (lineage.parent_relation().empty() ? "" : " (" + lineage.parent_relation() + ")")
              << "\n";
  }
  if (!lineage.code_revision().empty()) std::cout << "code: " << lineage.code_revision() << "\n";
  if (!lineage.dataset().empty()) std::cout << "dataset: " << lineage.dataset() << "\n";
  const v1::VersionAnnotations& annotations = manifest.annotations();
  for (const auto& [name, value] : annotations.metrics()) {
    std::cout << name << ": " << value << " (annotated)\n";
  }
  for (const auto& [key, value] : annotations.tags()) {
    std::cout << "tag " << key << "=" << value << "\n";
  }
  if (!annotations.description().empty()) {
    std::cout << "notes: " << annotations.description() << "\n";
  }
  if (annotations.updated_unix_micros() > 0) {
    std::cout << "annotated: " << TimeText(annotations.updated_unix_micros()) << " by "
              << annotations.updated_by() << "\n";
  }
  if (!metadata.key_normalization().stripped_prefix().empty() ||
      !metadata.key_normalization().wrappers().empty()) {
    std::cout << "normalized: stripped '" << metadata.key_normalization().stripped_prefix() << "' ("
              << absl::StrJoin(metadata.key_normalization().wrappers(), ", ") << ")\n";
  }
  std::cout << "model: " << manifest.tensors_size() << " tensors, " << HumanBytes(model_bytes)
            << "\n";
  size_t width = 3;
  for (const v1::TensorMeta& meta : manifest.tensors()) width = std::max(width, meta.key().size());
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    std::cout << absl::StrFormat("  %-*s  %-9s  %-18s  %10s  %s\n", width, meta.key(),
                                 DTypeName(static_cast<DType>(meta.dtype())),
                                 absl::StrCat("[", absl::StrJoin(meta.shape(), ", "), "]",
                                              meta.has_sparse() ? " " + SparseLayoutName(meta)
                                                                : ""),
                                 HumanBytes(meta.byte_length()),
                                 meta.original_device().empty() ? "" : meta.original_device());
  }
  std::cout << "optimizer state: " << (manifest.has_optimizer_state() ? "yes" : "none")
            << ", scheduler state: " << (manifest.has_scheduler_state() ? "yes" : "none") << ", "
            << manifest.state_tensors_size() << " state tensors (" << HumanBytes(state_bytes)
            << ")\n";
  for (const std::string& warning : manifest.warnings())
    std::cout << "warning: " << warning << "\n";
  return absl::OkStatus();
}

absl::Status RunTag(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(v1::VersionRef ref, RefWithVersion(line.arguments()[0]));
  const std::string& alias = line.arguments()[1];
  ASSIGN_OR_RETURN(int64_t previous, store->SetAlias(ref.model(), alias, ref.version(), 0,
                                                     AttributionFromOptions(line)));
  std::cout << ref.model() << "@" << alias << " -> " << ref.version()
            << (previous > 0 ? absl::StrCat(" (was ", previous, ")") : std::string()) << "\n";
  return absl::OkStatus();
}

absl::Status RunUntag(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  RETURN_IF_ERROR(
      store->DeleteAlias(line.arguments()[0], line.arguments()[1], AttributionFromOptions(line)));
  std::cout << "removed alias " << line.arguments()[0] << "@" << line.arguments()[1] << "\n";
  return absl::OkStatus();
}

absl::Status RunRemove(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(v1::VersionRef ref, RefWithVersion(line.arguments()[0]));
  ASSIGN_OR_RETURN(int64_t released,
                   store->DeleteVersion(ref.model(), ref.version(), line.Has("force"),
                                        AttributionFromOptions(line)));
  std::cout << "deleted " << FormatVersionRef(ref) << "; " << HumanBytes(released)
            << " no longer referenced (freed by ckpt gc)\n";
  return absl::OkStatus();
}

absl::Status RunDiff(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(v1::VersionRef a, ParseVersionRef(line.arguments()[0]));
  ASSIGN_OR_RETURN(v1::VersionRef b, ParseVersionRef(line.arguments()[1]));
  ASSIGN_OR_RETURN(VersionDiff diff, DiffVersions(*store, a, b));
  std::cout << diff.a << " -> " << diff.b << ": " << diff.added.size() << " added, "
            << diff.removed.size() << " removed, " << diff.changed.size() << " changed, "
            << diff.unchanged << " unchanged\n";
  for (const std::string& key : diff.added) std::cout << "+ " << key << "\n";
  for (const std::string& key : diff.removed) std::cout << "- " << key << "\n";
  for (const TensorChange& change : diff.changed) {
    std::cout << "~ " << change.key;
    if (change.shape_a != change.shape_b) {
      std::cout << "  shape [" << absl::StrJoin(change.shape_a, ", ") << "] -> ["
                << absl::StrJoin(change.shape_b, ", ") << "]";
    }
    if (change.dtype_a != change.dtype_b) {
      std::cout << "  dtype " << change.dtype_a << " -> " << change.dtype_b;
    }
    if (change.max_abs_difference.has_value()) {
      std::cout << "  max |diff| " << *change.max_abs_difference;
    }
    std::cout << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunWhoAmI(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(const ServiceClient service, ServiceClientFor(line));
  v1::WhoAmIRequest request;
  if (line.Has("model")) request.set_model(line.Get("model"));
  // What a user of each service does, reads first.
  const std::vector<std::string> methods =
      service.noun == "loader"
          ? std::vector<std::string>{"Load", "Export"}
          : std::vector<std::string>{"GetManifest",     "Upload",        "SetAlias",
                                     "AnnotateVersion", "DeleteVersion", "ApplyRetention",
                                     "GarbageCollect"};
  for (const std::string& method : methods) request.add_methods(method);
  ASSIGN_OR_RETURN(const v1::WhoAmIResponse who, WhoAmI(service.options, request, service.noun));
  std::cout << "identity: " << who.identity() << "\nrole: " << who.role() << "\nmodels: "
            << (who.models().empty() ? std::string("all") : absl::StrJoin(who.models(), ", "))
            << "\nseen from: " << who.peer() << "\n";
  std::cout << (request.model().empty() ? std::string("may call")
                                        : absl::StrCat("on ", request.model(), ", may call"))
            << ": "
            << (who.allowed_methods().empty() ? std::string("none of these")
                                              : absl::StrJoin(who.allowed_methods(), ", "))
            << "\n";
  for (const std::string& method : methods) {
    auto refused = who.refused_methods().find(method);
    if (refused != who.refused_methods().end()) {
      std::cout << "  not " << method << ": " << refused->second << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status RunStats(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(v1::StoreStats stats, store->GetStats());
  std::cout << "models: " << stats.models() << "\nversions: " << stats.versions()
            << "\nchunks: " << stats.chunks()
            << "\nlogical bytes: " << HumanBytes(stats.logical_bytes()) << " ("
            << stats.logical_bytes() << ")\nphysical bytes: " << HumanBytes(stats.physical_bytes())
            << " (" << stats.physical_bytes() << ")\ndedup ratio: "
            << (stats.physical_bytes() > 0
                    ? absl::StrFormat("%.2f", static_cast<double>(stats.logical_bytes()) /
                                                  stats.physical_bytes())
                    : std::string("-"))
            << "\nuploads in progress: " << stats.uploads_in_progress() << "\n";
  return absl::OkStatus();
}

}  // namespace ckpt
