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
// Thread-safety: Submit and Wait are called from one thread (the training loop); stats() from any.
//
// Example:
//   AsyncCheckpointer checkpointer(store, "resnet");
//   RETURN_IF_ERROR(checkpointer.Submit(std::move(contents), options));  // returns after the copy
//   ...train...
//   ASSIGN_OR_RETURN(std::optional<CommitResult> last, checkpointer.Wait());

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/store/checkpoint_store.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"

namespace ckpt::train {

// A copy of `contents` whose every tensor (model, optimizer, scheduler, extra) is a fresh,
// contiguous CPU tensor that shares no memory with the original: later in-place updates of the
// live tensors (the next optimizer step) cannot change it.
absl::StatusOr<CheckpointContents> SnapshotToHost(const CheckpointContents& contents);
absl::StatusOr<Value> SnapshotValueToHost(const Value& value);

class AsyncCheckpointer {
 public:
  struct Stats {
    int64_t submitted = 0;
    int64_t committed = 0;
    int64_t failed = 0;
    absl::Duration last_stall;  // time Submit blocked the caller (wait + snapshot).
    absl::Duration total_stall;
    absl::Duration last_snapshot;  // the host copy alone.
    absl::Duration last_upload;    // background: store commit of the last finished upload.
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

  // Waits for the upload in flight. The result of the last upload: nullopt if nothing was ever
  // submitted; its error if it failed (reported once).
  absl::StatusOr<std::optional<CommitResult>> Wait();

  // True while an upload is running.
  bool busy() const;

  Stats stats() const;

 private:
  absl::Status JoinInFlight();

  CheckpointStore* const store_;
  const std::string model_name_;
  std::thread uploader_;
  mutable absl::Mutex mu_;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Host tensors of the last finished upload, reused by the next snapshot.
  std::vector<at::Tensor> spare_buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_ASYNC_CHECKPOINTER_H_
