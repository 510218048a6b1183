#ifndef CKPT_LIBS_FORMAT_TORCH_WRITER_H_
#define CKPT_LIBS_FORMAT_TORCH_WRITER_H_

// Writes torch.save zip files (the PyTorch >= 1.6 format) that Python's torch.load reads.
//
// The pickle uses only globals that PyTorch's weights_only=True unpickler allows --
// collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter and the typed
// storage classes -- never a class of the user's, so loading the file runs no user code.
// (Files holding Python floats, such as optimizer state, still need PyTorch >= 2.0's
// weights_only loader: 1.13's has no float opcode.)
//
// Layout as torch.save writes it: ARCHIVE/data.pkl, ARCHIVE/byteorder ("little"),
// ARCHIVE/data/<key> per storage (64-byte aligned), ARCHIVE/version. Tensors that share a
// storage (tied weights, views) share one record, so sharing survives the round trip. Every
// tensor is saved with location "cpu", whatever device it came from.
//
// Opaque values (objects ckpt never executes) are not written back as code: each becomes a
// plain dict {"__opaque_class__": NAME, "args": ..., "state": ...} and the report says so.
//
// Example:
//   ASSIGN_OR_RETURN(TorchWriteReport report,
//                    WriteTorchFile("model.pt", StateDictToValue(weights)));

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/format/zip_writer.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"

namespace ckpt {

struct TorchWriteOptions {
  // Top folder of the records; torch.load accepts any name.
  std::string archive_name = "archive";
  ZipWriterOptions zip;
};

struct TorchWriteReport {
  std::vector<std::string> warnings;  // e.g. opaque objects written as descriptions.
  int64_t storages = 0;               // distinct storage records written.
  int64_t storage_bytes = 0;
  uint64_t file_bytes = 0;
};

// The pickle and the storages of `root`, written atomically to `path` (a crash or full disk
// leaves any previous file intact). INVALID_ARGUMENT for values the format cannot hold
// (quantized tensors, tensors viewing one storage as different dtypes, strings that are not
// UTF-8); errors from the filesystem as AtomicFileWriter reports them.
absl::StatusOr<TorchWriteReport> WriteTorchFile(const std::string& path, const Value& root,
                                                const TorchWriteOptions& options = {});

// A state dict as a Value: an OrderedDict of tensors, as Python's model.state_dict() returns.
// (The writer pickles a dict as an OrderedDict exactly when Value::is_ordered_dict() says it was
// one, so optimizer state and bundles stay plain dicts, as Python saved them.)
Value StateDictToValue(const StateDict& state_dict);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_TORCH_WRITER_H_
