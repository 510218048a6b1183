// ckpt: the command-line tool for checkpoints. Options are parsed here and passed to libs/ as
// plain structs; each command is a thin call into a library.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/convert.h"
#include "libs/format/inspect.h"
#include "libs/loader/export.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_import.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/repair.h"
#include "libs/store/version_diff.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt/command_line.h"
#include "tools/ckpt/registry_commands.h"
#include "tools/ckpt/store_access.h"
#include "tools/ckpt/sync_command.h"

namespace ckpt {
namespace {

constexpr char kDescription[] =
    "Read, convert and version PyTorch checkpoints: torch.save files (zip and legacy, read\n"
    "without running any pickled code), whole pickled models, bundles, safetensors; a versioned,\n"
    "deduplicated, checksummed store of them (embedded in --store_dir, or a checkpoint_store\n"
    "service with --store=HOST:PORT).";

const std::vector<cli::OptionSpec>& GlobalOptions() {
  static const auto* options = new std::vector<cli::OptionSpec>{
      {"store_dir", "DIR", "open the checkpoint store in DIR in-process (embedded)", "./ckpt-data"},
      {"store", "HOST:PORT", "talk to a checkpoint_store service instead of opening --store_dir",
       ""},
      {"auth_token_file", "FILE",
       "bearer token for --store / --loader (whitespace around it "
       "ignored)",
       ""},
      {"tls_ca_file", "PEM", "TLS to --store / --loader: the CA that signed its certificate", ""},
      {"tls_cert_file", "PEM", "with --tls_ca_file: this client's certificate (mutual TLS)", ""},
      {"tls_key_file", "PEM", "the private key of --tls_cert_file", ""},
      {"tls_server_name", "NAME", "the name the server's certificate carries, if not its host", ""},
      {"chunks_s3_endpoint", "URL",
       "with --store_dir: chunk bytes in this S3-compatible object store (http://HOST:PORT or "
       "https://HOST[:PORT], path-style) instead of pack files in DIR, which keeps the index; "
       "credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or --chunks_s3_credentials_file",
       ""},
      {"chunks_s3_bucket", "BUCKET", "with --chunks_s3_endpoint: the (existing) bucket", ""},
      {"chunks_s3_prefix", "PREFIX",
       "with --chunks_s3_endpoint: key prefix ending in '/', one per store (gc deletes pack "
       "objects under it that the store does not name)",
       ""},
      {"chunks_s3_region", "REGION", "with --chunks_s3_endpoint: the SigV4 region", "us-east-1"},
      {"chunks_s3_credentials_file", "FILE",
       "with --chunks_s3_endpoint: AWS shared-credentials file (aws_access_key_id = ..., "
       "aws_secret_access_key = ...) instead of the environment",
       ""},
      {"chunks_s3_ca_file", "PEM", "with an https --chunks_s3_endpoint: CA certificates to trust",
       ""},
  };
  return *options;
}

// `options` followed by `more`.
std::vector<cli::OptionSpec> With(std::vector<cli::OptionSpec> options,
                                  const std::vector<cli::OptionSpec>& more) {
  options.insert(options.end(), more.begin(), more.end());
  return options;
}

const std::vector<cli::CommandSpec>& Commands() {
  // Filled once, below, with the registry's and the sync's commands too; never changed after.
  static auto* commands = new std::vector<cli::CommandSpec>{
      {"inspect",
       "FILE",
       "Describe a checkpoint: format, tensors (dtype, shape, original device), wrapper prefix, "
       "optimizer / scheduler structure.",
       1,
       1,
       {{"json", "", "print the report as JSON", ""},
        {"key", "PATH", "where the model state dict is, e.g. model or ckpt/state_dict", "auto"}}},
      {"convert",
       "IN OUT",
       "Write IN as a clean CPU file: a training bundle stays a whole bundle (model, optimizer, "
       "scheduler, epoch and every other plain field, as saved) in torch .pt; safetensors and "
       "--model-only write the model's state dict alone.",
       2,
       2,
       {{"format", "torch|safetensors", "output format", "from OUT's extension"},
        {"model-only", "", "write only the model's state dict, even from a bundle", ""},
        {"strip-prefix", "auto|none|PREFIX",
         "auto strips wrapper prefixes (module., _orig_mod., FSDP, checkpointing)", "auto"},
        {"add-prefix", "PREFIX", "prefix added to every key after stripping, e.g. module.", ""},
        {"key", "PATH", "where the model state dict is, e.g. model", "auto"},
        {"max-expanded-bytes", "BYTES",
         "refuse a file whose tensors would together take this many bytes more once materialized "
         "than the file stores (broadcast or overlapping views claiming memory and output it does "
         "not hold); 0: 1/8 of this host's available memory",
         "0"}}},
      {"import", "FILE",
       "Store FILE (torch .pt zip or legacy, whole pickled model, bundle, safetensors, or Hugging "
       "Face's sharded safetensors: a directory or its model.safetensors.index.json) as a new "
       "version of --model.",
       1, 1,
       With({{"model", "NAME", "model to add the version to ([A-Za-z0-9._-], required)", ""},
             {"alias", "A[,B]", "aliases to point at the new version", ""},
             {"strip-prefix", "auto|none|PREFIX", "wrapper prefixes to strip (recorded)", "auto"},
             {"key", "PATH", "where the model state dict is in FILE", "auto"},
             {"max-expanded-bytes", "BYTES",
              "refuse a file whose tensors would together take this many bytes more once "
              "materialized than the file stores (broadcast or overlapping views); 0: 1/8 of this "
              "host's available memory",
              "0"},
             {"description", "TEXT", "free text stored with the version", ""}},
            ImportRecordOptions())},
      {"ls", "[MODEL]",
       "List models, or the versions of MODEL (those the filters select, when given).", 0, 1,
       VersionFilterOptions()},
      {"show",
       "MODEL[@REF]",
       "Show a version's manifest: metadata, tensors, optimizer and scheduler state.",
       1,
       1,
       {{"json", "", "print the manifest as JSON", ""}}},
      {"tag",
       "MODEL@VERSION ALIAS",
       "Point ALIAS at MODEL@VERSION (moves it if it exists; see also promote).",
       2,
       2,
       {ReasonOption()}},
      {"untag", "MODEL ALIAS", "Delete an alias.", 2, 2, {ReasonOption()}},
      {"rm",
       "MODEL@VERSION",
       "Delete a version (its bytes are freed by the next gc).",
       1,
       1,
       {{"force", "", "also when aliases point at it (they are removed)", ""}, ReasonOption()}},
      {"retain",
       "MODEL",
       "Apply a retention policy: delete versions outside it, never aliased or latest ones.",
       1,
       1,
       {{"keep-last", "N", "keep the newest N versions (0 keeps all)", "0"},
        {"keep-every", "K", "also keep every version divisible by K", "0"},
        {"drop-optimizer-after", "N",
         "drop optimizer state (keep weights) from versions older than the newest N", "0"},
        {"dry-run", "", "report what would happen, change nothing", ""}}},
      {"gc",
       "",
       "Free chunks no version references, and abandoned uploads.",
       0,
       0,
       {{"dry-run", "", "report what would be freed, change nothing", ""}},
       "An upload that ended without a commit (a failed or killed import, a client that\n"
       "went away) leaves its chunks and its partial pack file in the store. gc leaves them\n"
       "until the abandoned-upload grace has passed since the upload began, so a client that\n"
       "reconnects can reuse them; the first gc after that reclaims them, pack file and all.\n"
       "The grace is the store's: 1 hour for a --store_dir store; with --store=HOST:PORT, the\n"
       "service's --abandoned_upload_grace (default 1h). Uploads in progress are never\n"
       "collected.\n"},
      {"verify",
       "[MODEL[@REF]]",
       "Re-hash every chunk of a version, a model or the whole store; exit 1 on problems.",
       0,
       1,
       {}},
      {"repair",
       "",
       "Bring back a --store_dir store that no longer opens (damaged CURRENT, MANIFEST, SST or "
       "WAL files): back up its files, rebuild it with RocksDB's repair, drop versions that do "
       "not verify, and list the versions kept and dropped; exit 1 if problems remain.",
       0,
       0,
       {{"backup-dir", "DIR", "where the damaged files are copied first (must not exist)",
         "STORE_DIR.before-repair-TIME"}},
       "Stop every process that has the store open first (a checkpoint_store service: repair\n"
       "its --store_dir). The pack files are not changed. A version is kept only when every\n"
       "chunk re-hashes to its manifest; a version whose manifest or chunks are damaged is\n"
       "deleted (it stays in the backup). Records that named lost versions (aliases, counts,\n"
       "refcounts) are made to agree; version numbers are never reused.\n"},
      {"diff",
       "MODEL@A MODEL@B",
       "Model tensors added, removed and changed between two versions.",
       2,
       2,
       {}},
      {"stats", "", "Models, versions, logical vs physical bytes, dedup ratio.", 0, 0, {}},
      {"audit",
       "[MODEL]",
       "Who changed the store (or MODEL), when, from where and how it ended: commits, alias "
       "moves and deletes, version deletes, retention, gc; oldest first.",
       0,
       1,
       {{"since", "DURATION|TIME",
         "only calls begun in the last DURATION (30m, 24h, 7d) or since an RFC 3339 TIME "
         "(2024-05-01T12:00:00Z)",
         "all"},
        {"json", "", "one JSON object per record and line", ""}}},
      {"export",
       "MODEL@REF OUT",
       "Write a stored version's model tensors -- or with --bundle the whole training bundle "
       "that Python resumes from -- as a torch .pt (torch.load(weights_only=True) globals only) "
       "or safetensors file, written atomically.",
       2,
       2,
       {{"format", "torch|safetensors", "output format", "from OUT's extension"},
        {"bundle", "",
         "the whole bundle: model, optimizer, scheduler, epoch and every other plain field, in "
         "the producer's layout (torch only)",
         ""},
        {"no-optimizer", "", "with --bundle: leave the optimizer state out", ""},
        {"no-scheduler", "", "with --bundle: leave the scheduler state out", ""},
        {"dtype", "DTYPE", "cast floating tensors, e.g. bf16, fp16, fp32", "keep"},
        {"key-prefix", "PREFIX", "prefix every key, e.g. module. for a DDP consumer", ""},
        {"include", "PREFIX[,PREFIX]", "only tensors whose canonical key starts with one", "all"},
        {"max-shard-size", "SIZE",
         "safetensors in Hugging Face's sharded layout: OUT is a directory of "
         "model-00001-of-0000N.safetensors... and model.safetensors.index.json, shards of at most "
         "SIZE tensor bytes (5GB, 500MB, 2GiB, bytes; a larger tensor gets a shard of its own)",
         "one file"},
        {"loader", "HOST:PORT[,HOST:PORT...]|dns:///NAME:PORT",
         "export through a loader service (several: round-robin over the healthy ones) instead of "
         "the store",
         ""}}},
      {"check",
       "MODEL@REF",
       "Preflight: compare a stored version's keys and shapes with another checkpoint file's "
       "(a consumer's); exit 1 when they do not fit.",
       1,
       1,
       {{"against", "FILE", "checkpoint whose model state dict is the consumer (required)", ""},
        {"key-prefix", "PREFIX", "the consumer's keys carry this prefix, e.g. module.", ""},
        {"include", "PREFIX[,PREFIX]", "compare only tensors whose canonical key starts with one",
         "all"},
        {"loader", "HOST:PORT[,HOST:PORT...]|dns:///NAME:PORT",
         "ask a loader service (several: round-robin over the healthy ones) instead of the store",
         ""}}},
  };
  static const bool registered = [] {
    const std::vector<cli::CommandSpec>& registry = RegistryCommands();
    commands->insert(commands->end(), registry.begin(), registry.end());
    commands->push_back(SyncCommand());
    return true;
  }();
  (void)registered;
  return *commands;
}

// ---- Output helpers.

bool StdoutIsTerminal() { return isatty(STDOUT_FILENO) == 1; }

// A one-line progress bar, redrawn in place; only on a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label)
      : label_(std::move(label)), enabled_(StdoutIsTerminal()) {}
  ~ProgressBar() {
    if (enabled_ && drawn_) std::cout << "\n" << std::flush;
  }
  void Update(int64_t done, int64_t total, const std::string& unit_text) {
    if (!enabled_ || total <= 0) return;
    const int width = 30;
    const int filled = static_cast<int>(width * done / total);
    std::cout << "\r" << label_ << " [" << std::string(filled, '=')
              << std::string(width - filled, ' ') << "] " << (100 * done / total) << "% "
              << unit_text << std::flush;
    drawn_ = true;
  }

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
};

std::string TimeText(int64_t unix_micros) {
  if (unix_micros <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

// --max-expanded-bytes of convert / import: 0 (the default) leaves the reader's default.
absl::StatusOr<int64_t> MaxExpandedBytes(const cli::ParsedCommandLine& line) {
  if (!line.Has("max-expanded-bytes")) return 0;
  ASSIGN_OR_RETURN(const int64_t bytes, line.GetInt("max-expanded-bytes"));
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-expanded-bytes must be >= 0 (0: 1/8 of this host's available memory), got ", bytes));
  }
  return bytes;
}

// ---- Store commands.

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
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    const auto status = google::protobuf::util::MessageToJsonString(manifest, &json, options);
    if (!status.ok()) return absl::InternalError(status.ToString());
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
                                 absl::StrCat("[", absl::StrJoin(meta.shape(), ", "), "]"),
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

absl::Status RunRetain(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  v1::RetentionPolicy policy;
  ASSIGN_OR_RETURN(int64_t keep_last, line.GetInt("keep-last"));
  ASSIGN_OR_RETURN(int64_t keep_every, line.GetInt("keep-every"));
  ASSIGN_OR_RETURN(int64_t drop_after, line.GetInt("drop-optimizer-after"));
  if (keep_last < 0 || keep_every < 0 || drop_after < 0) {
    return absl::InvalidArgumentError("retention numbers must not be negative");
  }
  if (keep_last == 0 && drop_after == 0) {
    return absl::InvalidArgumentError(
        "give --keep-last N and/or --drop-optimizer-after N (nothing to do otherwise)");
  }
  policy.set_keep_last(static_cast<int32_t>(keep_last));
  policy.set_keep_every(static_cast<int32_t>(keep_every));
  policy.set_drop_optimizer_state_older_than(static_cast<int32_t>(drop_after));
  const bool dry_run = line.Has("dry-run");
  ASSIGN_OR_RETURN(v1::ApplyRetentionResponse response,
                   store->ApplyRetention(line.arguments()[0], policy, dry_run));
  const char* verb = dry_run ? "would delete" : "deleted";
  std::cout << verb << " versions: "
            << (response.deleted_versions().empty()
                    ? "none"
                    : absl::StrJoin(response.deleted_versions(), " "))
            << "\n"
            << (dry_run ? "would drop" : "dropped") << " optimizer state of versions: "
            << (response.optimizer_state_dropped().empty()
                    ? "none"
                    : absl::StrJoin(response.optimizer_state_dropped(), " "))
            << "\n";
  if (!dry_run) std::cout << "run ckpt gc to free their bytes\n";
  return absl::OkStatus();
}

absl::Status RunGc(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  const bool dry_run = line.Has("dry-run");
  ASSIGN_OR_RETURN(v1::GarbageCollectResponse response, store->GarbageCollect(dry_run));
  std::cout << (dry_run ? "would free " : "freed ") << response.chunks_freed() << " chunks, "
            << HumanBytes(response.bytes_freed())
            << "; abandoned uploads reclaimed: " << response.abandoned_uploads_reclaimed() << "\n";
  // Only when they happen, so the usual summary stays one line.
  if (response.pack_removals_failed() > 0) {
    std::cout << response.pack_removals_failed()
              << " pack removals or upload aborts failed (logged on the store's stderr: this "
                 "process's, or the checkpoint_store service's with --store=ADDR; the next gc "
                 "retries them)\n";
  }
  if (response.packs_of_unknown_age_kept() > 0) {
    std::cout << response.packs_of_unknown_age_kept()
              << " packs or pending uploads kept: the storage gave no time for them, so they "
                 "count as young\n";
  }
  return absl::OkStatus();
}

absl::Status RunVerify(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  v1::VerifyResponse total;
  auto add = [&](const v1::VerifyResponse& part) {
    total.set_chunks_checked(total.chunks_checked() + part.chunks_checked());
    total.set_bytes_checked(total.bytes_checked() + part.bytes_checked());
    for (const v1::VerifyProblem& problem : part.problems()) *total.add_problems() = problem;
  };
  std::string scope = "the whole store";
  if (line.arguments().empty()) {
    // One call checks chunks and refcounts store-wide.
    if (StdoutIsTerminal()) std::cout << "verifying the whole store...\n";
    ASSIGN_OR_RETURN(v1::VerifyResponse response, store->Verify("", 0));
    add(response);
  } else {
    ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
    std::vector<int64_t> versions;
    if (absl::StrContains(line.arguments()[0], '@')) {
      ASSIGN_OR_RETURN(v1::Manifest manifest, store->GetManifest(ref));
      versions.push_back(manifest.version());
      scope = FormatVersionRef(ref.model(), manifest.version());
    } else {
      ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> infos, store->ListVersions(ref.model()));
      for (const v1::VersionInfo& info : infos) versions.push_back(info.version());
      scope = absl::StrCat(ref.model(), " (", versions.size(), " versions)");
    }
    ProgressBar bar("verifying");
    for (size_t i = 0; i < versions.size(); ++i) {
      ASSIGN_OR_RETURN(v1::VerifyResponse response, store->Verify(ref.model(), versions[i]));
      add(response);
      bar.Update(i + 1, versions.size(), absl::StrCat(i + 1, "/", versions.size(), " versions"));
    }
  }
  std::cout << "verified " << scope << ": " << total.chunks_checked() << " chunks, "
            << HumanBytes(total.bytes_checked()) << ", " << total.problems_size() << " problems\n";
  for (const v1::VerifyProblem& problem : total.problems()) {
    std::cout << "  " << FormatVersionRef(problem.model(), problem.version()) << " "
              << problem.tensor_key() << ": " << problem.message() << "\n";
  }
  if (total.problems_size() > 0) {
    return absl::DataLossError(absl::StrCat(total.problems_size(), " problems found"));
  }
  return absl::OkStatus();
}

absl::Status RunRepair(const cli::ParsedCommandLine& line) {
  if (line.Has("store")) {
    return absl::InvalidArgumentError(
        "repair works on the store's directory: stop the service and run `ckpt repair "
        "--store_dir=DIR` with its --store_dir");
  }
  RepairOptions options;
  options.db_path = line.Get("store_dir");
  if (line.Has("backup-dir")) options.backup_dir = line.Get("backup-dir");
  ASSIGN_OR_RETURN(RepairReport report, RepairStore(options));
  std::cout << "backed up " << report.backed_up.size() << " database files to " << report.backup_dir
            << "\n";
  for (const std::string& note : report.notes) std::cout << "note: " << note << "\n";
  for (const RepairedVersion& version : report.intact) std::cout << "kept " << version.ref << "\n";
  for (const RepairedVersion& version : report.dropped) {
    std::cout << "dropped " << version.ref << ": " << version.reason << "\n";
  }
  std::cout << "repaired " << options.db_path << ": " << report.intact.size() << " versions kept, "
            << report.dropped.size() << " dropped, " << report.versions_unrecovered
            << " not recoverable, " << report.acknowledged_writes_lost
            << " acknowledged writes lost with the write-ahead log; verified "
            << report.verify.chunks_checked() << " chunks, " << report.verify.problems_size()
            << " problems\n";
  for (const v1::VerifyProblem& problem : report.verify.problems()) {
    std::cout << "  " << problem.message() << "\n";
  }
  if (report.verify.problems_size() > 0) {
    return absl::DataLossError(
        absl::StrCat(report.verify.problems_size(), " problems remain after the repair"));
  }
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

// "model@version", plus the alias; "-" for a call on no model (gc).
std::string AuditTarget(const v1::AuditRecord& record) {
  std::string target = record.model().empty() ? "-" : record.model();
  if (record.version() > 0) absl::StrAppend(&target, "@", record.version());
  if (!record.alias().empty()) absl::StrAppend(&target, " alias ", record.alias());
  return target;
}

std::string AuditOutcome(const v1::AuditRecord& record) {
  switch (record.outcome()) {
    case v1::AuditRecord::OK:
      return "OK";
    case v1::AuditRecord::FAILED:
      return absl::StrCat(
          "FAILED ", absl::StatusCodeToString(static_cast<absl::StatusCode>(record.error_code())),
          ": ", record.error_message());
    case v1::AuditRecord::PENDING:
      return "outcome unknown (in progress when read; the store's next open settles it if the "
             "call never finished)";
    default:
      return "outcome unrecorded";
  }
}

nlohmann::ordered_json AuditJson(const v1::AuditRecord& record) {
  nlohmann::ordered_json json;
  json["sequence"] = record.sequence();
  json["time"] = UtcTimeText(record.unix_micros());
  json["unix_micros"] = record.unix_micros();
  json["identity"] = record.identity();
  json["peer"] = record.peer();
  json["action"] = record.action();
  json["model"] = record.model();
  json["version"] = record.version();
  json["alias"] = record.alias();
  json["outcome"] = v1::AuditRecord::Outcome_Name(record.outcome());
  if (record.outcome() == v1::AuditRecord::FAILED) {
    json["error_code"] =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(record.error_code()));
    json["error_message"] = record.error_message();
  }
  json["detail"] = record.detail();
  return json;
}

absl::Status RunAudit(const cli::ParsedCommandLine& line) {
  AuditQuery query;
  if (!line.arguments().empty()) query.model = line.arguments()[0];
  if (line.Has("since")) {
    ASSIGN_OR_RETURN(query.since, ParseTimeOption("since", line.Get("since")));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(std::vector<v1::AuditRecord> records, store->ListAudit(query));
  for (const v1::AuditRecord& record : records) {
    if (line.Has("json")) {
      std::cout << AuditJson(record).dump() << "\n";
      continue;
    }
    std::cout << UtcTimeText(record.unix_micros()) << "  " << record.identity() << "  "
              << record.peer() << "  " << record.action() << "  " << AuditTarget(record) << "  "
              << AuditOutcome(record) << "  " << record.detail() << "\n";
  }
  return absl::OkStatus();
}

std::string ModelKey(const cli::ParsedCommandLine& line) {
  return line.Has("key") ? line.Get("key") : "";
}

// What a written file does not hold, one item a line.
void PrintLeftOut(const std::vector<std::string>& left_out) {
  if (left_out.empty()) return;
  std::cout << "left out:\n";
  for (const std::string& item : left_out) std::cout << "  " << item << "\n";
}

absl::Status RunInspect(const cli::ParsedCommandLine& line) {
  ReadCheckpointOptions options;
  options.model_key = ModelKey(line);
  options.max_expanded_bytes = -1;  // inspect reports shapes; it never materializes a tensor.
  absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(line.arguments()[0], options);
  if (!file.ok()) return file.status();
  const nlohmann::ordered_json report = InspectCheckpoint(*file);
  std::cout << (line.Has("json") ? report.dump(2) + "\n" : RenderInspectText(report));
  return absl::OkStatus();
}

absl::Status RunConvert(const cli::ParsedCommandLine& line) {
  ConvertOptions options;
  options.format = line.Has("format") ? line.Get("format") : "";
  options.strip_prefix = line.Get("strip-prefix");
  options.add_prefix = line.Get("add-prefix");
  options.model_key = ModelKey(line);
  options.model_only = line.Has("model-only");
  ASSIGN_OR_RETURN(options.max_expanded_bytes, MaxExpandedBytes(line));
  const std::string& in = line.arguments()[0];
  const std::string& out = line.arguments()[1];
  absl::StatusOr<ConvertReport> report = ConvertCheckpoint(in, out, options);
  if (!report.ok()) return report.status();
  std::cout << "wrote " << out << " (" << report->format << (report->bundle ? ", whole bundle" : "")
            << "): " << report->tensors << " model tensors, " << HumanBytes(report->tensor_bytes)
            << " of model tensor data, " << HumanBytes(report->file_bytes) << " on disk\n";
  if (!report->stripped_prefix.empty()) {
    std::cout << "stripped prefix '" << report->stripped_prefix << "' from every key\n";
  }
  PrintLeftOut(report->left_out);
  for (const std::string& warning : report->warnings) std::cerr << "warning: " << warning << "\n";
  return absl::OkStatus();
}

// ---- Loader commands.

// The LoadTarget --dtype, --key-prefix and --include describe.
absl::StatusOr<LoadTarget> TargetFromOptions(const cli::ParsedCommandLine& line) {
  LoadTarget target;
  if (line.Has("dtype")) {
    ASSIGN_OR_RETURN(DType dtype, ParseDType(line.Get("dtype")));
    ASSIGN_OR_RETURN(target.dtype, DTypePolicy::CastFloatingTo(dtype));
  }
  if (line.Has("key-prefix") && !line.Get("key-prefix").empty()) {
    target.keys = KeyPolicy::AddPrefix(line.Get("key-prefix"));
  }
  if (line.Has("include")) {
    target.include_prefixes = absl::StrSplit(line.Get("include"), ',', absl::SkipEmpty());
  }
  return target;
}

absl::Status RunExport(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
  const std::string& out = line.arguments()[1];
  ExportOptions options;
  if (line.Has("format")) {
    ASSIGN_OR_RETURN(options.format, ParseExportFormat(line.Get("format")));
  } else if (absl::EndsWith(out, ".safetensors")) {
    options.format = ExportFormat::kSafetensors;
  } else if (absl::EndsWith(out, ".pt") || absl::EndsWith(out, ".pth")) {
    options.format = ExportFormat::kTorch;
  } else if (line.Has("max-shard-size")) {
    options.format = ExportFormat::kSafetensors;  // A directory: only safetensors shards.
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot tell the format from '", out, "'; pass --format torch|safetensors"));
  }
  ASSIGN_OR_RETURN(options.target, TargetFromOptions(line));
  if (line.Has("bundle")) {
    if (options.format != ExportFormat::kTorch) {
      return absl::InvalidArgumentError(
          "--bundle needs the torch format: safetensors holds tensors only");
    }
    options.target.include_optimizer = !line.Has("no-optimizer");
    options.target.include_scheduler = !line.Has("no-scheduler");
    if (!options.target.include_optimizer && !options.target.include_scheduler) {
      return absl::InvalidArgumentError(
          "--bundle with --no-optimizer and --no-scheduler is the model alone: drop --bundle");
    }
  } else if (line.Has("no-optimizer") || line.Has("no-scheduler")) {
    return absl::InvalidArgumentError("--no-optimizer and --no-scheduler go with --bundle");
  }
  if (line.Has("max-shard-size")) {
    if (options.format != ExportFormat::kSafetensors) {
      return absl::InvalidArgumentError("--max-shard-size shards safetensors exports only");
    }
    // The loader service streams one file; shards are files the store side writes.
    if (line.Has("loader")) {
      return absl::InvalidArgumentError(
          "--max-shard-size writes a directory, which a loader service cannot stream (it sends "
          "one file): export from the store, or drop --max-shard-size");
    }
    ASSIGN_OR_RETURN(options.max_shard_bytes, ParseShardSize(line.Get("max-shard-size")));
  }
  ProgressBar bar("exporting");
  options.progress = [&](uint64_t done, uint64_t total) {
    bar.Update(static_cast<int64_t>(done), static_cast<int64_t>(total),
               absl::StrCat(HumanBytes(done), " / ", HumanBytes(total)));
  };
  ASSIGN_OR_RETURN(LoaderHandle loader, OpenLoader(line));
  ASSIGN_OR_RETURN(ExportResult result, loader.loader->Export(ref, options, out));
  std::cout << "exported " << result.version << " to " << out << " ("
            << (options.format == ExportFormat::kTorch ? "torch" : "safetensors")
            << (result.bundle ? ", whole bundle" : "")
            << (result.files.size() > 1 ? absl::StrCat(", ", result.files.size() - 1, " shards")
                                        : "")
            << "): " << result.tensors << " model tensors, " << HumanBytes(result.file_bytes)
            << "\n";
  for (const std::string& file : result.files) std::cout << "  " << out << "/" << file << "\n";
  PrintLeftOut(result.left_out);
  for (const std::string& warning : result.warnings) std::cerr << "warning: " << warning << "\n";
  return absl::OkStatus();
}

absl::Status RunCheck(const cli::ParsedCommandLine& line) {
  if (!line.Has("against") || line.Get("against").empty()) {
    return absl::InvalidArgumentError("check needs --against FILE");
  }
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
  ASSIGN_OR_RETURN(LoadTarget target, TargetFromOptions(line));
  absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(line.Get("against"));
  if (!file.ok()) return file.status();
  std::vector<ExpectedTensor> expected;
  for (const StateDict::Entry& entry : file->bundle.model) {
    expected.push_back({entry.key, entry.tensor.sizes().vec()});
  }
  ASSIGN_OR_RETURN(LoaderHandle loader, OpenLoader(line));
  ASSIGN_OR_RETURN(PreflightReport report, loader.loader->Preflight(ref, expected, target));
  const bool compatible = report.report.compatible();
  const std::string& summary = report.summary;
  std::cout << summary << "\n";
  if (!compatible) {
    return absl::FailedPreconditionError(
        absl::StrCat(line.Get("against"), " does not fit ", line.arguments()[0]));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  // Under `bazel run`, relative paths (FILEs, --store_dir) mean the caller's directory.
  if (const char* caller = std::getenv("BUILD_WORKING_DIRECTORY"); caller != nullptr) {
    if (chdir(caller) != 0) std::perror("ckpt: chdir to BUILD_WORKING_DIRECTORY");
  }
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<cli::ParsedCommandLine> line =
      cli::ParseCommandLine(Commands(), GlobalOptions(), args);
  if (!line.ok()) {
    std::cerr << "ckpt: " << line.status().message() << "\n";
    return 2;
  }
  if (line->command().empty()) {
    std::cout << cli::ProgramHelp("ckpt", kDescription, Commands(), GlobalOptions());
    return line->help_requested() ? 0 : 2;
  }
  for (const cli::CommandSpec& command : Commands()) {
    if (command.name == line->command() && line->help_requested()) {
      std::cout << cli::CommandHelp("ckpt", command, GlobalOptions());
      return 0;
    }
  }
  using Runner = absl::Status (*)(const cli::ParsedCommandLine&);
  static const std::map<std::string, Runner>* runners = new std::map<std::string, Runner>{
      {"inspect", RunInspect},
      {"convert", RunConvert},
      {"import", RunImport},
      {"ls", RunList},
      {"show", RunShow},
      {"tag", RunTag},
      {"untag", RunUntag},
      {"rm", RunRemove},
      {"retain", RunRetain},
      {"gc", RunGc},
      {"verify", RunVerify},
      {"repair", RunRepair},
      {"diff", RunDiff},
      {"stats", RunStats},
      {"export", RunExport},
      {"check", RunCheck},
      {"audit", RunAudit},
      {"model", RunRegistryCommand},
      {"annotate", RunRegistryCommand},
      {"history", RunRegistryCommand},
      {"promote", RunRegistryCommand},
      {"rollback", RunRegistryCommand},
      {"sync", RunSync},
  };
  const absl::Status status = runners->at(line->command())(*line);
  if (!status.ok()) {
    std::cerr << "ckpt " << line->command() << ": " << absl::StatusCodeToString(status.code())
              << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
