#ifndef CKPT_LIBS_FORMAT_DCP_WRITER_H_
#define CKPT_LIBS_FORMAT_DCP_WRITER_H_

// Writes a PyTorch Distributed Checkpoint directory as torch 2.x's FileSystemWriter does for one
// rank, which torch.distributed.checkpoint.load reads into a state dict on any number of ranks:
//   DIR/__0_0.distcp   every item torch.save'd one after the other (tensor.pt files, each a zip,
//                      as _write_item writes them)
//   DIR/.metadata      a pickle of torch.distributed.checkpoint.metadata.Metadata:
//                      state_dict_metadata (each tensor a TensorStorageMetadata of one chunk, every
//                      other value a BytesStorageMetadata), storage_data (MetadataIndex ->
//                      filesystem._StorageInfo), planner_data (each flattened key's path, as the
//                      default planner's flatten_state_dict records it)
// Nested dicts are flattened as 2.x's planner flattens them ("model.fc.weight" for
// {"model": {"fc.weight": ...}}), so load() with a nested state dict of the same shape fills it;
// as in torch's own DCP, an int dict key comes back a string, and a list is one item.
// The pickle names only PyTorch's own classes and torch.Size / dtype / layout globals; the data
// file is written first and the metadata last, each atomically, so a crash leaves no directory
// that claims data it lacks.
//
// Example:
//   ASSIGN_OR_RETURN(DcpWriteReport report, WriteDcpDirectory("out.dcp", StateDictToValue(sd)));

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/format/torch_writer.h"
#include "libs/tensor/value.h"

namespace ckpt {

struct DcpWriteReport {
  uint64_t file_bytes = 0;  // the data file and the metadata.
  int64_t tensors = 0;
  std::vector<std::string> files;  // paths written, data first.
  std::vector<std::string> warnings;
};

// Writes `root` (a dict) into the directory `dir` (created if missing; a previous checkpoint's
// files of these names are replaced). Tensors may be `deferred` placeholders, fetched one at a
// time as they are written. `progress` (may be empty) gets the data bytes written so far and
// their total. INVALID_ARGUMENT for a root that is not a dict, a key that is neither str nor
// int, two keys that flatten to one name, or values the torch writer cannot hold; filesystem
// errors as AtomicFileWriter reports them.
absl::StatusOr<DcpWriteReport> WriteDcpDirectory(
    const std::string& dir, const Value& root, const DeferredTensors* deferred = nullptr,
    const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_DCP_WRITER_H_
