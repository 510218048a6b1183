#ifndef CKPT_LIBS_FORMAT_DCP_READER_H_
#define CKPT_LIBS_FORMAT_DCP_READER_H_

// Reads a PyTorch Distributed Checkpoint directory, as torch.distributed.checkpoint's
// FileSystemWriter writes it (and torch 1.13's torch.distributed._shard.checkpoint, which 2.x
// keeps as an alias): a `.metadata` pickle of a Metadata object, and `.distcp` files holding each
// item torch.save'd at the offset the metadata gives.
//
//   Metadata.state_dict_metadata   {key: TensorStorageMetadata(properties (dtype, ...), size,
//                                         chunks [ChunkStorageMetadata(offsets, sizes)])
//                                       | BytesStorageMetadata()}, in the state dict's order
//   Metadata.storage_data          {MetadataIndex(fqn, offset, index): _StorageInfo(
//                                         relative_path, offset, length)}
//   Metadata.planner_data          (2.x) {flattened key: its path, a tuple of dict keys (str)
//                                       and list positions (int)} for nested state dicts
//
// The pickle is read by ckpt's restricted machine (pickle_reader.h): nothing in it runs. Each
// tensor is assembled from its chunks (a sharded tensor's shards, written by several ranks) after
// checking that they tile it exactly: chunks that overlap, leave part of the tensor to nobody,
// reach outside it, or have no storage are refused, naming every key at fault. Items that are not
// tensors (BytesStorageMetadata: an int, bytes, a nested object) are read as torch.load would.
// Keys a 2.x planner flattened ("model.fc.weight" from {"model": {"fc.weight": ...}},
// "optim.param_groups.0.lr" from a list) are nested again as planner_data says, lists as lists.
//
// Example:
//   if (IsDcpDirectory(path)) ASSIGN_OR_RETURN(DcpCheckpoint dcp, ReadDcpDirectory(path));

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/tensor/value.h"

namespace ckpt {

struct DcpCheckpoint {
  Value root;               // The state dict, as torch.distributed.checkpoint.load fills it.
  uint64_t file_bytes = 0;  // The .metadata and .distcp files together.
  std::vector<std::string> warnings;
};

// Whether `path` is a directory holding a `.metadata` file.
bool IsDcpDirectory(const std::string& path);

// INVALID_ARGUMENT naming the directory (and the key) for metadata that is not a DCP Metadata,
// chunks that do not tile their tensor, an item whose dtype or shape is not its metadata's, a
// storage path that leaves the directory; NOT_FOUND for a missing .distcp file; DATA_LOSS for an
// item that runs past its file's end; RESOURCE_EXHAUSTED when the tensors claim more bytes than
// the files hold; and errors of reading the items (torch_reader.h).
absl::StatusOr<DcpCheckpoint> ReadDcpDirectory(const std::string& dir);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_DCP_READER_H_
