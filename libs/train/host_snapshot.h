#ifndef CKPT_LIBS_TRAIN_HOST_SNAPSHOT_H_
#define CKPT_LIBS_TRAIN_HOST_SNAPSHOT_H_

// Host snapshots of training state: private CPU copies that later in-place updates of the live
// tensors (the next optimizer step) cannot change. The machinery under AsyncCheckpointer, kept
// apart from its threading and store work.
//
// A snapshot is taken into a BufferPool's buffers (the previous snapshot's, reused by shape and
// dtype: writing memory already mapped avoids a page fault per 4 KiB, which made the first copy
// of fresh memory cost most of the stall, tools/bench R7). Contiguous CPU tensors are copied on
// up to eight threads (libs/io/parallel_copy.h); strided, conjugate or negative views by
// LibTorch's copy_; accelerator tensors (cuda:N) into pinned buffers on a side stream
// (libs/tensor/side_stream_copies.h), whose bytes may be read once WaitForDeviceCopies() has
// returned. Copies of tensors the caller names as `deferred` are not run but handed back, in the
// caller's order, for a background thread to run (AsyncCheckpointer::SubmitOverlapped).
//
// Example:
//   BufferPool pool;
//   ASSIGN_OR_RETURN(StagedSnapshot staged, Snapshot(contents, pool));
//   RETURN_IF_ERROR(staged.WaitForDeviceCopies());   // staged.contents is now the state

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libs/io/parallel_copy.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/tensor/side_stream_copies.h"
#include "libs/tensor/value.h"

namespace ckpt::train {

// A copy of `contents` whose every tensor (model, optimizer, scheduler, extra) is a fresh,
// contiguous CPU tensor that shares no memory with the original.
absl::StatusOr<CheckpointContents> SnapshotToHost(const CheckpointContents& contents);
absl::StatusOr<Value> SnapshotValueToHost(const Value& value);

// Host tensors of an earlier snapshot, reused by shape and dtype.
class BufferPool {
 public:
  void Add(at::Tensor tensor);
  struct Buffer {
    at::Tensor tensor;
    bool fresh;  // newly allocated: its pages are not mapped yet.
  };
  // A contiguous CPU tensor shaped and typed like `like`: a spare one when there is one. Pinned
  // (page-locked) for copies from an accelerator, which can then run asynchronously.
  Buffer Take(const at::Tensor& like, bool pinned);

 private:
  static std::string Key(const at::Tensor& tensor, bool pinned);
  std::multimap<std::string, at::Tensor> buffers_;
};

// A plain copy left to the caller's background thread: `source` keeps the live memory alive
// until it is copied; `order` is the position in `deferred` of the tensor it shares memory with.
struct DeferredSnapshotCopy {
  size_t order = 0;
  at::Tensor source;
  CopyRange range;
};

// A snapshot whose accelerator copies may still be running: its host tensors may be read once
// WaitForDeviceCopies() has returned.
struct StagedSnapshot {
  CheckpointContents contents;     // Snapshot's.
  std::vector<at::Tensor> pieces;  // SnapshotPieces': one host tensor per source, in order.
  std::vector<std::shared_ptr<SideStreamCopies>> device_copies;

  absl::Status WaitForDeviceCopies();
  // Every host tensor it holds, for reuse by the next snapshot (BufferPool::Add).
  std::vector<at::Tensor> Tensors() const;
};

// The memory an in-place update of `tensor` writes (its storage), which deferred copies and the
// guards match tensors by; nullptr for a tensor without storage.
const void* MemoryOf(const at::Tensor& tensor);

// Snapshots `contents`. With `deferred`, the plain copies of tensors sharing memory with one of
// them are not run but appended to `*deferred_copies`, ordered as `deferred`.
absl::StatusOr<StagedSnapshot> Snapshot(
    const CheckpointContents& contents, BufferPool& pool,
    absl::Span<const at::Tensor> deferred = {},
    std::vector<DeferredSnapshotCopy>* deferred_copies = nullptr);

// Snapshots each of `sources` (e.g. byte ranges of tensors, as flat views of them) into
// StagedSnapshot::pieces, with `deferred` as above: a rank's share of a parallel checkpoint,
// without a copy of the rest.
absl::StatusOr<StagedSnapshot> SnapshotPieces(
    absl::Span<const at::Tensor> sources, BufferPool& pool,
    absl::Span<const at::Tensor> deferred = {},
    std::vector<DeferredSnapshotCopy>* deferred_copies = nullptr);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_HOST_SNAPSHOT_H_
