#ifndef CKPT_LIBS_STORE_CHECKPOINT_CONTENTS_H_
#define CKPT_LIBS_STORE_CHECKPOINT_CONTENTS_H_

// The torch-facing half of the store's interface: a checkpoint in memory (a state dict,
// optimizer, scheduler and extra value trees with their at::Tensors) and how it goes into and
// comes out of any CheckpointStore (checkpoint_store.h). Kept apart so that the store's interface,
// its decorators and the clients that only list, move aliases or stream bytes compile no ATen.
// Every function here is built on CheckpointStore's and VersionReader's virtual methods, so it
// works the same on every backend.
//
// Example:
//   CheckpointContents contents;
//   contents.model = std::move(state_dict);           // keys may carry "module." etc.
//   contents.metadata.set_epoch(3);
//   CommitOptions options;
//   options.aliases = {"best"};
//   ASSIGN_OR_RETURN(CommitResult committed,
//                    CommitCheckpoint(*store, "resnet18", contents, options));
//   // committed.version is resnet18@N
//   ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef("resnet18@best"));
//   ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(*store, ref));

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_store.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// A checkpoint in memory: what CommitCheckpoint takes and LoadCheckpoint gives back.
struct CheckpointContents {
  // The model's state dict. Any keys (wrapper prefixes are normalized on commit unless
  // CommitOptions::normalize_keys is false); any device (stored contiguous, on the CPU, with the
  // original device recorded); dtype kept. Loaded back under canonical keys, on the CPU.
  StateDict model;
  // PyTorch optimizer / scheduler state dicts, as value trees.
  std::optional<Value> optimizer;
  std::optional<Value> scheduler;
  // Everything else of a bundle (epoch, RNG state, ...); None when there is nothing.
  Value extra;
  // created_unix_micros is set by the store.
  v1::VersionMetadata metadata;
  // Optimizer parameter index -> state-dict key (original or canonical; stored canonical).
  std::map<int64_t, std::string> optimizer_param_names;
  // Where model, optimizer and scheduler sat in the object the producer saved (an imported
  // torch.save bundle), so that an export rebuilds it; no placements when unknown.
  v1::BundleLayout bundle_layout;
};

// A checkpoint made ready for an upload: the header CommitCheckpoint begins it with (model tensors
// under keys normalized as CommitOptions::normalize_keys says; optimizer, scheduler and extra
// tensors listed as state tensors) and the tensor whose bytes go to each tensor_index, in order
// (not copied: the contents' own tensors, which must outlive it). What CommitCheckpoint uploads
// alone, and what each writer of a parted upload cuts its ranges from: prepared from the same
// contents on every rank, it is the same header on every rank.
struct PreparedUpload {
  v1::Manifest header;
  std::vector<at::Tensor> tensors;
};

// Errors as CommitCheckpoint's before BeginUpload (a tensor the store cannot keep, two keys that
// normalize to one).
absl::StatusOr<PreparedUpload> PrepareUpload(const CheckpointContents& contents,
                                             const CommitOptions& options);

// Sends `part`'s ranges of `tensors` (a PreparedUpload's, by tensor_index) and finishes it.
// Errors as UploadPart::AddRangeData and Finish.
absl::Status UploadTensorRanges(UploadPart& part, const std::vector<at::Tensor>& tensors);

struct LoadedCheckpoint {
  v1::Manifest manifest;  // with version number and aliases.
  CheckpointContents contents;
};

// Uploads and commits `contents` to `store` through one UploadSession: keys normalized (see
// CommitOptions::normalize_keys), tensors made contiguous on the CPU one at a time, optimizer /
// scheduler / extra tensors stored as state tensors under "optimizer/<path>",
// "scheduler/<path>", "extra/<path>". Errors as BeginUpload and Commit.
//
// A store whose CommitRetryWindow() is positive (a remote one) may lose a commit's answer: the
// connection breaks, or the writer dies and another store takes over. There the whole upload
// is sent again, paced by a backoff, while it fails with UNAVAILABLE and the window since the
// first failure lasts, each attempt with one idempotency key (options.idempotency_key, or a
// random one), so it commits exactly once: a retry of a commit that had landed gets its
// version back (CommitResult::replayed). The chunks a lost attempt stored are deduplicated.
absl::StatusOr<CommitResult> CommitCheckpoint(CheckpointStore& store, absl::string_view model,
                                              const CheckpointContents& contents,
                                              const CommitOptions& options = {});

// The whole checkpoint `ref` names: the state dict under canonical keys (original devices
// recorded in the entries), value trees with their tensors, metadata. Errors as OpenVersion and
// ReadTensor.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(CheckpointStore& store, const v1::VersionRef& ref);

// One tensor of MODEL@VERSION as a CPU tensor. Errors as GetManifest and ReadTensor below.
absl::StatusOr<at::Tensor> ReadTensor(CheckpointStore& store, absl::string_view model,
                                      int64_t version, absl::string_view key);

// The tensor under `key` of the version `reader` reads (model tensors are searched first, then
// state tensors), or the one `meta` describes, as a contiguous CPU at::Tensor, its bytes
// streamed straight into the tensor's buffer (or mapped, where the reader maps them). NOT_FOUND
// for an unknown key; FAILED_PRECONDITION for a dtype LibTorch 1.13 cannot hold
// (ReadTensorChunks still works); DATA_LOSS as for ReadTensorChunks.
absl::StatusOr<at::Tensor> ReadTensor(const VersionReader& reader, absl::string_view key);
absl::StatusOr<at::Tensor> ReadTensor(const VersionReader& reader, const v1::TensorMeta& meta);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_CHECKPOINT_CONTENTS_H_
