#ifndef CKPT_LIBS_TRAIN_ASYNC_CHECKPOINTER_H_
#define CKPT_LIBS_TRAIN_ASYNC_CHECKPOINTER_H_

// AsyncCheckpointer: the training step pays only for a host snapshot of the checkpoint; the
// upload to the store (hashing, chunking, the synced commit) runs on a background thread.
//
// At most one upload is in flight: Submit() first waits for the previous one, so memory holds one
// host copy of the checkpoint, and commits land in submission order. That copy's buffers are kept
// and reused by the next snapshot of the same shapes: copying into memory already mapped avoids a
// page fault per 4 KiB, which dominated the stall (tools/bench, R7). Contiguous CPU tensors are
// copied on up to eight threads of the snapshot's own (libs/io/parallel_copy.h), whatever
// LibTorch's intra-op thread count: the trainer waits for the copy anyway. Strided, conjugate or
// negative views are copied by LibTorch's copy_. Tensors on an accelerator (cuda:N) are copied
// into pinned host buffers on a side stream (libs/tensor/side_stream_copies.h): Submit returns
// once the copies are launched and the device's stream is ordered after them, and the upload
// thread waits for them before reading the bytes, so the training loop does not wait for the
// device-to-host transfer.
// A failed upload is not lost silently: its error is returned by the next Submit() or Wait().
//
// SubmitOverlapped() goes further, the way CheckFreq does: the host copy of the tensors the caller
// names as `deferred` (parameters and optimizer state: what only the optimizer step writes) runs
// on the background thread, in the order given, while the training thread goes on with the next
// forward and backward passes. A per-tensor "copied" latch guards them: the trainer calls
// BeforeOptimizerStep() (or WaitUntilSnapshotted() for a parameter group) right before the step
// that writes them, and blocks only if their copy is not finished. Everything else (BatchNorm
// statistics, which the forward pass writes; RNG, scheduler and loop state; views, other layouts,
// accelerator tensors) is copied before SubmitOverlapped returns, as Submit does.
//
// SubmitShared() writes one rank's share of a checkpoint that every rank of a job writes in
// parallel (CheckpointStore::JoinUpload): each rank snapshots only the byte ranges it owns
// (SplitUpload, or ranges it names itself: a ZeRO-1 rank's slices), so that a rank holds a copy of
// its share and not of the whole state; the leader begins the upload under a name every rank
// knows, each rank (the leader too) joins it for its ranges and finishes its part, and the leader
// commits only when told that every part is in (EndSharedUpload(true), after the ranks agreed on it
// over a collective, which this class never issues: the background thread runs no collectives). A
// part that fails, or a rank that dies, leaves no version: the leader abandons the upload and the
// store's GC reclaims the parts. The leader's commit waits for EndSharedUpload, so the leader must
// call it before Wait().
//
// Thread-safety: Submit*, the guards, WaitForPart, EndSharedUpload and Wait are called from one
// thread (the training loop); stats(), busy() and part_state() from any.
//
// Example:
//   AsyncCheckpointer checkpointer(store, "resnet");
//   RETURN_IF_ERROR(checkpointer.SubmitOverlapped(contents, options, parameters_and_state));
//   ...forward, backward...
//   checkpointer.BeforeOptimizerStep();  // returns at once unless the copy is still running
//   optimizer.step();
//   ASSIGN_OR_RETURN(std::optional<CommitResult> last, checkpointer.Wait());

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "libs/io/parallel_copy.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/upload_split.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "libs/train/host_snapshot.h"

namespace ckpt::train {

class AsyncCheckpointer {
 public:
  struct Stats {
    int64_t submitted = 0;
    int64_t committed = 0;
    int64_t failed = 0;
    // Time the last checkpoint blocked the caller: Submit's wait and copy, plus for
    // SubmitOverlapped the guards' waits for its deferred copies.
    absl::Duration last_stall;
    absl::Duration total_stall;
    absl::Duration last_snapshot;       // the host copy on the caller's thread.
    absl::Duration last_guard_wait;     // the guards' part of last_stall.
    absl::Duration last_deferred_copy;  // background: the deferred copies of the last snapshot.
    absl::Duration last_upload;         // background: store commit of the last finished upload.
    // Host bytes the last snapshot copied (its buffers: a shared upload's are this rank's share).
    int64_t last_snapshot_bytes = 0;
    // Shared uploads: the parts this rank wrote and their bytes.
    int64_t parts_written = 0;
    int64_t part_bytes_written = 0;
    std::optional<CommitResult> last_commit;
  };

  // `store` must outlive this object; it is used from the background thread.
  AsyncCheckpointer(CheckpointStore* store, std::string model_name);
  // Waits for the upload in flight (its error, if any, is only logged to stderr).
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Waits for the previous upload (returning its error if it failed, without submitting), takes
  // the host snapshot, then starts uploading it and returns.
  absl::Status Submit(const CheckpointContents& contents, CommitOptions options);

  // Like Submit, but the tensors of `contents` that share memory with a tensor of `deferred` (and
  // are contiguous CPU tensors) are copied on the background thread, in the order of `deferred`,
  // before the upload. The caller must not write such memory in place before a guard below has
  // returned for it; the snapshot is still `contents` as it is when this is called.
  absl::Status SubmitOverlapped(const CheckpointContents& contents, CommitOptions options,
                                absl::Span<const at::Tensor> deferred);

  // The pre-step guards: block until the deferred copies of the last SubmitOverlapped are done,
  // all of them or those sharing memory with `tensors`. Return at once when none is pending.
  void BeforeOptimizerStep();
  void WaitUntilSnapshotted(absl::Span<const at::Tensor> tensors);

  // One rank's share of a shared upload (SubmitShared).
  struct SharedUpload {
    // The upload's name (CommitOptions::joinable_as): the same on every rank, new for each
    // checkpoint.
    std::string upload_name;
    // This rank and how many write; rank 0 leads (begins the upload and commits it).
    int rank = 0;
    int world_size = 1;
    // The tensors that hold the same values on every rank (parameters and their optimizer
    // state): their bytes are split between the ranks (SplitUpload). Every other tensor of the
    // checkpoint (buffers, RNG states) goes whole to rank 0, whose copy a one-writer save stores.
    std::vector<at::Tensor> replicated;
    // Tensors whose bytes the ranks supply from memory of their own rather than by the split:
    // the same tensors on every rank, listed in `partitioned`; this rank's ranges of them in
    // `owned` (a ZeRO-1 rank's slices of the parameters and of their optimizer state, whose
    // state tensors are then shape-only placeholders on the meta device). All ranks' ranges of
    // a tensor must cover it exactly, or the commit fails.
    std::vector<at::Tensor> partitioned;
    std::vector<OwnedTensorBytes> owned;
    // How long the other ranks retry joining an upload the leader has not begun yet.
    absl::Duration join_timeout = absl::Minutes(2);
  };
  // Where this rank's part of the last shared upload is: not begun (kNone, also after a plain
  // Submit), being written, written and handed to the upload, or failed (the error is logged
  // and, on the leader, returned by Wait).
  enum class PartState { kNone, kWriting, kWritten, kFailed };

  // Like SubmitOverlapped, for one rank's share of a checkpoint all ranks write (see above).
  // `contents` must be the same state on every rank (replicated tensors; the split gives tensors
  // that differ between ranks to the leader; placeholders of partitioned tensors stand for
  // state no rank holds whole). Only this rank's ranges are snapshotted. Errors as
  // SubmitOverlapped, and INVALID_ARGUMENT for owned bytes that do not fit their tensor, a
  // partitioned tensor not in `contents` or a placeholder that is not partitioned; after one the
  // part is kFailed.
  absl::Status SubmitShared(const CheckpointContents& contents, CommitOptions options,
                            absl::Span<const at::Tensor> deferred, SharedUpload share);
  PartState part_state() const;
  // Blocks until this rank's part is written or failed, and returns which.
  PartState WaitForPart();
  // Every rank, once the ranks agree on their parts: `commit` when every part is written, else
  // false (a part failed). The leader commits the upload or abandons it; another rank stops
  // trying to join. No-op when no shared upload awaits it.
  void EndSharedUpload(bool commit);

  // Tests only: runs on the background thread before each deferred copy, with its position in
  // the copy order (e.g. to hold the copy back and show that the guard waits for it).
  void SetBeforeDeferredCopyForTesting(std::function<void(size_t)> hook);

  // Waits for the upload in flight. The result of the last upload: nullopt if nothing was ever
  // submitted; its error if it failed (reported once).
  absl::StatusOr<std::optional<CommitResult>> Wait();

  // True while an upload is running.
  bool busy() const;

  Stats stats() const;

 private:
  // A copy SubmitOverlapped left to the background thread. `source` keeps the live memory alive
  // until it is copied; `memory` (its storage) is what the guards match tensors by.
  struct DeferredCopy {
    const void* memory = nullptr;
    at::Tensor source;
    CopyRange range;
    bool done = false;
  };

  enum class Decision { kUndecided, kCommit, kAbandon };
  // This rank's share of a shared upload, as the background thread writes it: the upload's header
  // (every rank prepares the same one; the leader begins the upload with it) and this rank's
  // ranges, whose bytes are the snapshot's pieces, in order.
  struct Share {
    std::string upload_name;
    bool leader = false;
    v1::Manifest header;
    std::vector<UploadRange> ranges;  // empty: no bytes for this rank this time.
    absl::Duration join_timeout;
  };
  // A Share and, per range, the live bytes to snapshot (a flat view of them where it can be).
  struct PlannedShare {
    Share share;
    std::vector<at::Tensor> sources;
  };
  using SnapshotTaker = std::function<absl::StatusOr<StagedSnapshot>(
      BufferPool& pool, std::vector<DeferredSnapshotCopy>* deferred_copies)>;

  absl::Status JoinInFlight();
  // Waits for the upload in flight, takes the snapshot, starts its upload.
  absl::Status Start(const SnapshotTaker& take_snapshot, CommitOptions options,
                     std::optional<Share> share);
  // Cuts `contents` (the live state) into the ranks' shares and returns this rank's.
  static absl::StatusOr<PlannedShare> PlanShare(const CheckpointContents& contents,
                                                const CommitOptions& options,
                                                const SharedUpload& share);
  // The background thread's store work: one commit, or one rank's part of a shared upload.
  absl::StatusOr<std::optional<CommitResult>> Upload(const StagedSnapshot& snapshot,
                                                     CommitOptions options,
                                                     const std::optional<Share>& share);
  absl::StatusOr<std::optional<CommitResult>> UploadShare(const StagedSnapshot& snapshot,
                                                          CommitOptions options,
                                                          const Share& share);
  // A follower's JoinUpload, retried while the leader has not begun the upload.
  absl::StatusOr<std::unique_ptr<UploadPart>> JoinWhenBegun(const Share& share);
  void SetPartState(PartState state);
  // Blocks until every deferred copy that `wanted` accepts is done; the wait counts as stall.
  void WaitForDeferred(const std::function<bool(const DeferredCopy&)>& wanted);
  void CopyDeferred();

  CheckpointStore* const store_;
  const std::string model_name_;
  std::thread uploader_;
  mutable absl::Mutex mu_;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Host tensors of the last finished upload, reused by the next snapshot.
  std::vector<at::Tensor> spare_buffers_ ABSL_GUARDED_BY(mu_);
  // The deferred copies of the snapshot in flight, in copy order; `done` flips once each.
  std::vector<DeferredCopy> deferred_ ABSL_GUARDED_BY(mu_);
  size_t deferred_pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(size_t)> before_deferred_copy_;  // set before Submit* only.
  // The shared upload in flight: this rank's part, whether this rank leads it (its commit then
  // waits for the verdict), and the ranks' verdict (kAbandon also stops a follower's retries; the
  // destructor gives it so that nothing waits for a verdict that will not come).
  PartState part_state_ ABSL_GUARDED_BY(mu_) = PartState::kNone;
  bool leads_shared_upload_ ABSL_GUARDED_BY(mu_) = false;
  Decision decision_ ABSL_GUARDED_BY(mu_) = Decision::kUndecided;
};

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_ASYNC_CHECKPOINTER_H_
