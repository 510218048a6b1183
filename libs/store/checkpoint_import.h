#ifndef CKPT_LIBS_STORE_CHECKPOINT_IMPORT_H_
#define CKPT_LIBS_STORE_CHECKPOINT_IMPORT_H_

// `ckpt import FILE --model NAME`: any checkpoint file libs/format reads (torch.save zip or
// legacy, whole pickled models, bundles, safetensors) becomes a new version of NAME -- the model
// state dict normalized, optimizer / scheduler / other bundle entries kept as value trees,
// epoch and step in the version's metadata.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt {

struct ImportOptions {
  // "auto": strip detected wrapper prefixes (recorded, re-appliable); "none": keep keys;
  // anything else: a prefix every key has, stripped exactly and recorded.
  std::string strip_prefix = "auto";
  // Where the model state dict is in the file ("model"); empty: found automatically.
  std::string model_key;
  // See ReadCheckpointOptions::max_expanded_bytes (0: 1/8 of this host's available memory).
  int64_t max_expanded_bytes = 0;
  // Aliases moved to the new version in the same commit.
  std::vector<std::string> aliases;
  std::string description;
  std::map<std::string, std::string> labels;
  // Commit-time metrics (VersionMetadata.metrics) and where the version came from (lineage).
  std::map<std::string, double> metrics;
  v1::Lineage lineage;
  // Bytes stored so far / in all, after each tensor.
  std::function<void(int64_t, int64_t)> progress;
};

struct ImportResult {
  CommitResult commit;
  std::string source_format;          // "torch_zip", "torch_legacy", "safetensors".
  std::string stripped_prefix;        // What normalization removed from the front of the keys.
  std::vector<std::string> warnings;  // The reader's and the store's.
};

// Errors from reading the file (ReadCheckpointFile), INVALID_ARGUMENT for a bad strip_prefix,
// and the store's commit errors. Nothing is visible unless the whole version committed.
absl::StatusOr<ImportResult> ImportCheckpointFile(CheckpointStore& store, const std::string& path,
                                                  absl::string_view model,
                                                  const ImportOptions& options = {});

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHECKPOINT_IMPORT_H_
