#ifndef CKPT_LIBS_STORE_READ_CHECKPOINT_H_
#define CKPT_LIBS_STORE_READ_CHECKPOINT_H_

// Reading a version's contents through an open VersionReader: what LoadCheckpoint
// (checkpoint_contents.h) does after OpenVersion, with the choice of leaving the optimizer state
// unread, for a reader that takes only its slices of it (a ZeRO rank resuming:
// libs/train/zero_optimizer.h, ZeroOptimizer::LoadStateFrom, reads them by range from the same
// reader).
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store.OpenVersion(ref));
//   ReadCheckpointOptions options;
//   options.optimizer_state = false;
//   ASSIGN_OR_RETURN(LoadedCheckpoint loaded, ReadCheckpoint(*reader, options));

#include "absl/status/statusor.h"
#include "libs/store/checkpoint_contents.h"

namespace ckpt {

struct ReadCheckpointOptions {
  // False: contents.optimizer stays unset and none of its tensors is read (the manifest still
  // describes them).
  bool optimizer_state = true;
};

// The version `reader` reads: manifest, model tensors (on the CPU, under their stored keys),
// optimizer, scheduler and extra value trees with their tensors, metadata, bundle layout and
// optimizer parameter names. DATA_LOSS for a value tree that references a tensor the manifest
// lacks, and the reader's errors.
absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const VersionReader& reader,
                                                const ReadCheckpointOptions& options = {});

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_READ_CHECKPOINT_H_
