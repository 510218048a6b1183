#ifndef CKPT_LIBS_FORMAT_CHECKPOINT_FILE_H_
#define CKPT_LIBS_FORMAT_CHECKPOINT_FILE_H_

// Reads a checkpoint file of any format ckpt understands -- torch.save zip, legacy torch.save,
// safetensors, a TorchScript archive's weights, a PyTorch Distributed Checkpoint directory -- into
// one shape: the file's root value plus the
// checkpoint bundle found in it (model state dict, optimizer, scheduler, epoch / step, everything
// else). The format is sniffed from the bytes, never taken from the file name.
//
// Example:
//   ASSIGN_OR_RETURN(CheckpointFile file, ReadCheckpointFile("ddp_cuda1.pt"));
//   for (const StateDict::Entry& entry : file.bundle.model) { ... }

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/format/byte_source.h"
#include "libs/format/module_state.h"
#include "libs/tensor/value.h"

namespace ckpt {

// kTorchScript: a torch.jit.save archive, read as its module's state_dict() (torch_reader.h).
// kDcp: a torch.distributed.checkpoint directory (dcp_reader.h).
enum class CheckpointFormat { kTorchZip, kTorchLegacy, kSafetensors, kTorchScript, kDcp };

// "torch_zip", "torch_legacy", "safetensors", "torchscript", "dcp" (the names
// VersionMetadata.source_format uses).
absl::string_view CheckpointFormatName(CheckpointFormat format);

// Sniffs the format from the first bytes (a TorchScript archive sniffs as kTorchZip: the two differ
// only inside the zip). INVALID_ARGUMENT naming the file when it is none of them.
absl::StatusOr<CheckpointFormat> DetectCheckpointFormat(const ByteSource& source);

// ReadCheckpointOptions::max_expanded_bytes's default is this share of the available memory: a
// workstation survives it, and the expanded bytes also go to the destination's disk.
inline constexpr uint64_t kDefaultExpansionShare = 8;

struct ReadCheckpointOptions {
  // Where the model state dict is, as dict keys joined by '/' ("model", "ckpt/state_dict").
  // Empty: found automatically (ExtractCheckpointBundle).
  std::string model_key;
  // The most bytes the file's tensors may take, together, once materialized (made contiguous, as
  // convert and import do) beyond the bytes the file stores for them: a broadcast (stride-0) or
  // other overlapping view claims memory and output the file does not hold, and a few hundred
  // bytes can claim terabytes. Each tensor wider than its storage counts the difference; a file
  // over the budget is refused with RESOURCE_EXHAUSTED before anything allocates or writes. 0:
  // 1/kDefaultExpansionShare of this host's available memory; negative: no limit (for callers
  // that never materialize, like inspect). Tensors no larger than their storage count nothing.
  int64_t max_expanded_bytes = 0;
  // A root that holds no model state dict (a bare tensor, a list of tensors, a dict of plain
  // values) is read anyway, with CheckpointFile::has_model false and an empty bundle, instead of
  // NOT_FOUND: for inspect and convert, which describe and write any root. Import leaves it off.
  bool allow_no_model = false;
};

// What the tensors of a file would take once materialized beyond the bytes it stores for them:
// each tensor wider than its storage (a broadcast or overlapping view) counts the difference.
struct Expansion {
  int views = 0;       // tensors wider than their storage.
  uint64_t bytes = 0;  // the differences, summed (saturating at UINT64_MAX).
  // The widest: "'KEY' of shape [...] and stride [...] views S stored bytes but would take C".
  std::string widest;
};
Expansion MeasureExpansion(const Value& root);

struct CheckpointFile {
  std::string path;
  CheckpointFormat format = CheckpointFormat::kTorchZip;
  uint64_t file_bytes = 0;
  Value root;                                   // What torch.load / safetensors load_file gives.
  CheckpointBundle bundle;                      // The parts of `root`.
  bool has_model = true;  // false: `root` holds no model state dict (allow_no_model).
  std::map<std::string, std::string> metadata;  // safetensors __metadata__.
  std::vector<std::string> warnings;            // Reader and bundle warnings, in order.
};

// `path` may also be a PyTorch Distributed Checkpoint directory (one holding `.metadata`; its
// shards assembled, dcp_reader.h), or Hugging Face's layout: a directory holding model.safetensors.index.json
// and its shards (or model.safetensors alone), or the index itself (a ".json" path); every shard
// is read into one state dict (ReadShardedSafetensors, which names a missing shard, a tensor in
// two shards, a weight_map naming a tensor its shard lacks).
// Errors as the format's reader returns them, plus NOT_FOUND when `options.model_key` names
// nothing (listing the keys that exist), INVALID_ARGUMENT when it names no state dict, and
// RESOURCE_EXHAUSTED when the tensors expand past `options.max_expanded_bytes`, naming the widest.
absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path,
                                                  const ReadCheckpointOptions& options = {});

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_CHECKPOINT_FILE_H_
