#include "libs/store/checkpoint_import.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/format/bundle.h"
#include "libs/format/checkpoint_file.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/tensor/key_normalization.h"

namespace ckpt {

absl::StatusOr<ImportResult> ImportCheckpointFile(CheckpointStore& store, const std::string& path,
                                                  absl::string_view model,
                                                  const ImportOptions& options) {
  ReadCheckpointOptions read_options;
  read_options.model_key = options.model_key;
  read_options.max_expanded_bytes = options.max_expanded_bytes;
  ASSIGN_OR_RETURN(CheckpointFile file, ReadCheckpointFile(path, read_options));

  ImportResult result;
  result.source_format = std::string(CheckpointFormatName(file.format));
  result.warnings = file.warnings;

  CheckpointContents contents;
  CommitOptions commit_options;
  commit_options.aliases = options.aliases;
  commit_options.progress = options.progress;
  v1::VersionMetadata& metadata = contents.metadata;
  if (options.strip_prefix == "auto") {
    contents.model = std::move(file.bundle.model);
  } else if (options.strip_prefix == "none") {
    contents.model = std::move(file.bundle.model);
    commit_options.normalize_keys = false;
  } else {
    absl::StatusOr<StateDict> stripped = StripExactPrefix(file.bundle.model, options.strip_prefix);
    if (!stripped.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": --strip-prefix: ", stripped.status().message()));
    }
    contents.model = *std::move(stripped);
    commit_options.normalize_keys = false;
    metadata.mutable_key_normalization()->set_stripped_prefix(options.strip_prefix);
  }
  contents.optimizer = std::move(file.bundle.optimizer);
  contents.scheduler = std::move(file.bundle.scheduler);
  // A bundle keeps its other fields even when there are none: the (empty) dict is where its
  // parts go back on export, and it keeps the producer's dict class.
  if (file.bundle.extra.is_dict() &&
      (!file.bundle.extra.entries().empty() || IsBundleLayout(file.bundle.layout))) {
    contents.extra = std::move(file.bundle.extra);
  }
  contents.bundle_layout = std::move(file.bundle.layout);
  if (file.bundle.epoch >= 0) metadata.set_epoch(file.bundle.epoch);
  if (file.bundle.step >= 0) metadata.set_global_step(file.bundle.step);
  metadata.set_source_format(result.source_format);
  metadata.set_producer("ckpt import");
  metadata.set_description(options.description);
  (*metadata.mutable_labels())["source_file"] = path;
  if (!file.bundle.model_key_path.empty()) {
    (*metadata.mutable_labels())["source_model_key"] = file.bundle.model_key_path;
  }
  for (const auto& [key, value] : file.metadata) {
    (*metadata.mutable_labels())[absl::StrCat("safetensors.", key)] = value;
  }
  for (const auto& [key, value] : options.labels) (*metadata.mutable_labels())[key] = value;
  for (const auto& [name, value] : options.metrics) (*metadata.mutable_metrics())[name] = value;
  *metadata.mutable_lineage() = options.lineage;

  ASSIGN_OR_RETURN(result.commit, CommitCheckpoint(store, model, contents, commit_options));
  result.warnings.insert(result.warnings.end(), result.commit.warnings.begin(),
                         result.commit.warnings.end());
  ASSIGN_OR_RETURN(v1::Manifest manifest, store.GetManifest(result.commit.version));
  result.stripped_prefix = manifest.metadata().key_normalization().stripped_prefix();
  return result;
}

}  // namespace ckpt
