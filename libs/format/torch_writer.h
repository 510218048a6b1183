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
// Streaming: a file need not be built from tensors in memory. A tree may hold placeholders from
// DeferredTensors -- tensors on PyTorch's meta device, dtype and shape only -- whose bytes are
// fetched when the writer reaches their record: TorchFileWriter::Plan pickles the tree and lays
// out every record (so the file's size is known first), then Write fetches, checksums and writes
// one tensor at a time and drops it before fetching the next. The bytes are those WriteTorchFile
// writes for the same tensors in memory.
//
// Example:
//   ASSIGN_OR_RETURN(TorchWriteReport report,
//                    WriteTorchFile("model.pt", StateDictToValue(weights)));
//
//   DeferredTensors deferred;   // one tensor in memory at a time
//   ASSIGN_OR_RETURN(at::Tensor placeholder,
//                    deferred.Add(DType::kFloat32, {4096, 4096}, [&] { return Read("w"); }));
//   ASSIGN_OR_RETURN(TorchFileWriter writer,
//                    TorchFileWriter::Plan(Value::Dict({{"w", Value::Tensor(placeholder)}}),
//                                          &deferred));
//   ASSIGN_OR_RETURN(TorchWriteReport written, writer.WriteFile("model.pt"));

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "libs/format/zip_writer.h"
#include "libs/tensor/dtype.h"
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
// leaves any previous file intact). Quantized tensors (per-tensor and per-channel affine, float
// qparams too) are written as torch.save writes them. INVALID_ARGUMENT for values this writer
// cannot hold (sparse and other non-strided layouts, sub-byte quint4x2 / quint2x4, tensors
// viewing one storage as different dtypes, strings that are not UTF-8, a meta tensor, whose
// bytes nothing supplies); errors from the filesystem as AtomicFileWriter reports them.
absl::StatusOr<TorchWriteReport> WriteTorchFile(const std::string& path, const Value& root,
                                                const TorchWriteOptions& options = {});

// Tensors whose bytes are produced only when the writer reaches their record.
class DeferredTensors {
 public:
  // Returns the tensor's bytes: a CPU tensor of the placeholder's dtype and shape (any strides).
  using Fetch = std::function<absl::StatusOr<at::Tensor>()>;

  // A placeholder to put in the tree for a tensor of `dtype` and `shape` that `fetch` supplies:
  // a contiguous tensor on the meta device, which allocates nothing. Each placeholder is one
  // storage record, which views of it (slices, transposes) share, as torch.save shares a storage;
  // it is fetched once. INVALID_ARGUMENT for a dtype LibTorch cannot hold or a negative dimension.
  absl::StatusOr<at::Tensor> Add(DType dtype, const std::vector<int64_t>& shape, Fetch fetch);

  struct Entry {
    at::Tensor placeholder;  // As Add returned it; kept so that storage addresses stay unique.
    Fetch fetch;
  };
  // The entry of a placeholder Add returned, or of a view of one; nullptr for any other tensor.
  const Entry* Find(const at::Tensor& tensor) const;

 private:
  absl::flat_hash_map<const c10::StorageImpl*, Entry> entries_;  // By storage: views work too.
};

// Called after each record is written, with the file bytes written so far and the whole size.
using TorchWriteProgress = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;

// A torch file planned from its tree, then written in one pass (see "Streaming" above).
class TorchFileWriter {
 public:
  // Pickles `root` and lays out the records; fetches nothing. `deferred` (may be null when the
  // tree holds no placeholder) is copied from. Errors as WriteTorchFile's INVALID_ARGUMENT.
  static absl::StatusOr<TorchFileWriter> Plan(const Value& root, const DeferredTensors* deferred,
                                              const TorchWriteOptions& options = {});

  // The whole file's size, known before a byte is written.
  uint64_t file_bytes() const { return file_bytes_; }
  // Found while pickling (opaque objects written as descriptions, ...).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Writes the file to `sink` in order. Each deferred tensor is fetched when its record comes,
  // checked against its placeholder (INTERNAL on a different dtype or shape: the caller planned
  // the wrong one), written and released before the next is fetched. Errors from a fetch or the
  // sink are returned as they are. Call Write or WriteFile once.
  absl::StatusOr<TorchWriteReport> Write(const ZipSink& sink,
                                         const TorchWriteProgress& progress = nullptr);
  // Write to `path` atomically (a failure leaves any previous file intact).
  absl::StatusOr<TorchWriteReport> WriteFile(const std::string& path,
                                             const TorchWriteProgress& progress = nullptr);

 private:
  // One zip entry; its bytes are exactly one of the three.
  struct Record {
    std::string name;  // "archive/data/0".
    uint64_t size = 0;
    std::string bytes;             // The pickle and the small records.
    at::Tensor storage;            // A byte view of a whole in-memory storage.
    DeferredTensors::Fetch fetch;  // A deferred tensor, which must match `placeholder`.
    at::Tensor placeholder;
  };

  TorchFileWriter() = default;

  TorchWriteOptions options_;
  std::vector<Record> records_;
  std::vector<std::string> warnings_;
  uint64_t file_bytes_ = 0;
  bool written_ = false;
};

// A state dict as a Value: an OrderedDict of tensors, as Python's model.state_dict() returns.
// (The writer pickles a dict as an OrderedDict exactly when Value::is_ordered_dict() says it was
// one, so optimizer state and bundles stay plain dicts, as Python saved them.)
Value StateDictToValue(const StateDict& state_dict);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_TORCH_WRITER_H_
