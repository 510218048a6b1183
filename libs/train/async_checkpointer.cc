#include "libs/train/async_checkpointer.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "libs/io/backoff.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/internal/failpoint.h"

namespace ckpt::train {
namespace {

// Which memory a tensor names: its storage, where in it, how many elements of which type. The
// model's handle of a parameter and a state dict's detached one match; a placeholder on the meta
// device matches only itself (each has a storage of its own).
using TensorIdentity = std::tuple<const void*, int64_t, int64_t, int>;
TensorIdentity IdentityOf(const at::Tensor& tensor) {
  return {MemoryOf(tensor), tensor.has_storage() ? tensor.storage_offset() : 0, tensor.numel(),
          static_cast<int>(tensor.scalar_type())};
}

// Bytes [begin, end) of `tensor` as a flat tensor to snapshot: a view of the live memory when the
// tensor is contiguous and the range whole elements (what the guards of deferred copies match),
// otherwise a private copy of those bytes of its contiguous CPU form, which is what
// UploadTensorRanges sends.
absl::StatusOr<at::Tensor> FlatByteRange(const at::Tensor& tensor, int64_t begin, int64_t end) {
  return CatchTorchErrors(
      [&]() -> at::Tensor {
        const at::Tensor source = tensor.detach();
        const int64_t element = static_cast<int64_t>(source.element_size());
        if (source.layout() == at::kStrided && !source.is_quantized() && begin % element == 0 &&
            end % element == 0) {
          return source.reshape({-1}).slice(0, begin / element, end / element);
        }
        const at::Tensor cpu = source.to(at::kCPU).contiguous();
        TORCH_CHECK(end <= static_cast<int64_t>(cpu.nbytes()), "range ", begin, "..", end,
                    " of a tensor of ", cpu.nbytes(), " bytes");
        at::Tensor bytes = at::empty({end - begin}, at::TensorOptions().dtype(at::kByte));
        std::memcpy(bytes.data_ptr(), static_cast<const char*>(cpu.data_ptr()) + begin,
                    static_cast<size_t>(end - begin));
        return bytes;
      },
      absl::StatusCode::kInvalidArgument);
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(CheckpointStore* store, std::string model_name)
    : store_(store), model_name_(std::move(model_name)) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  {
    // A shared upload whose verdict never came (the run ended on an error) is abandoned.
    absl::MutexLock lock(&mu_);
    if (decision_ == Decision::kUndecided) decision_ = Decision::kAbandon;
  }
  if (uploader_.joinable()) uploader_.join();
  absl::MutexLock lock(&mu_);
  if (!last_error_.ok()) {
    std::cerr << "checkpoint upload failed: " << last_error_ << "\n";
  }
}

bool AsyncCheckpointer::busy() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

AsyncCheckpointer::Stats AsyncCheckpointer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status AsyncCheckpointer::JoinInFlight() {
  if (uploader_.joinable()) uploader_.join();
  absl::MutexLock lock(&mu_);
  absl::Status error = std::move(last_error_);
  last_error_ = absl::OkStatus();
  return error;
}

absl::Status AsyncCheckpointer::Submit(const CheckpointContents& contents, CommitOptions options) {
  return SubmitOverlapped(contents, std::move(options), {});
}

absl::Status AsyncCheckpointer::SubmitOverlapped(const CheckpointContents& contents,
                                                 CommitOptions options,
                                                 absl::Span<const at::Tensor> deferred) {
  return Start(
      [&](BufferPool& pool, std::vector<DeferredSnapshotCopy>* deferred_copies) {
        return Snapshot(contents, pool, deferred, deferred_copies);
      },
      std::move(options), std::nullopt);
}

absl::Status AsyncCheckpointer::SubmitShared(const CheckpointContents& contents,
                                             CommitOptions options,
                                             absl::Span<const at::Tensor> deferred,
                                             SharedUpload share) {
  // Only this rank's ranges are copied: a rank holds a snapshot of its share, not of the state.
  absl::StatusOr<PlannedShare> planned = PlanShare(contents, options, share);
  absl::Status started =
      planned.ok() ? Start(
                         [&](BufferPool& pool, std::vector<DeferredSnapshotCopy>* deferred_copies) {
                           return SnapshotPieces(planned->sources, pool, deferred, deferred_copies);
                         },
                         std::move(options), std::move(planned->share))
                   : planned.status();
  if (!started.ok()) SetPartState(PartState::kFailed);
  return started;
}

absl::StatusOr<AsyncCheckpointer::PlannedShare> AsyncCheckpointer::PlanShare(
    const CheckpointContents& contents, const CommitOptions& options, const SharedUpload& share) {
  if (share.world_size < 1 || share.rank < 0 || share.rank >= share.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", share.rank, " of ", share.world_size, " ranks"));
  }
  ASSIGN_OR_RETURN(PreparedUpload prepared, PrepareUpload(contents, options));
  const int tensor_count = static_cast<int>(prepared.tensors.size());
  absl::flat_hash_map<TensorIdentity, std::vector<int>> indices_of;
  for (int index = 0; index < tensor_count; ++index) {
    indices_of[IdentityOf(prepared.tensors[index])].push_back(index);
  }
  // The tensors the ranks supply by owned ranges, by index (a tied parameter has two).
  absl::flat_hash_set<int> supplied;
  for (const at::Tensor& tensor : share.partitioned) {
    auto it = indices_of.find(IdentityOf(tensor));
    if (it == indices_of.end()) {
      return absl::InvalidArgumentError(
          "a partitioned tensor of a shared upload is not one of the checkpoint's tensors");
    }
    supplied.insert(it->second.begin(), it->second.end());
  }
  absl::flat_hash_set<const void*> replicated;
  for (const at::Tensor& tensor : share.replicated) replicated.insert(MemoryOf(tensor));
  std::vector<int> rank_zero_only;
  for (int index = 0; index < tensor_count; ++index) {
    const at::Tensor& tensor = prepared.tensors[index];
    if (supplied.contains(index)) continue;
    if (tensor.is_meta()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint tensor ", index,
                       " is a shape-only placeholder (meta device) but not partitioned: no rank "
                       "would supply its bytes"));
    }
    const void* memory = MemoryOf(tensor);
    if (memory == nullptr || !replicated.contains(memory)) rank_zero_only.push_back(index);
  }
  PlannedShare planned;
  Share& mine = planned.share;
  mine.upload_name = share.upload_name;
  mine.leader = share.rank == 0;
  mine.join_timeout = share.join_timeout;
  mine.ranges = SplitUpload(prepared.header, share.world_size, rank_zero_only,
                            std::vector<int>(supplied.begin(), supplied.end()))[share.rank];
  for (const UploadRange& range : mine.ranges) {
    ASSIGN_OR_RETURN(at::Tensor source,
                     FlatByteRange(prepared.tensors[range.tensor_index], range.begin, range.end));
    planned.sources.push_back(std::move(source));
  }
  for (const OwnedTensorBytes& owned : share.owned) {
    auto it = indices_of.find(IdentityOf(owned.tensor));
    if (it == indices_of.end() || !supplied.contains(it->second.front())) {
      return absl::InvalidArgumentError(
          "owned bytes of a tensor that is not a partitioned tensor of the checkpoint");
    }
    const int64_t length = owned.end - owned.begin;
    if (!owned.source.defined() || !owned.source.is_contiguous() ||
        owned.source.scalar_type() != owned.tensor.scalar_type() || owned.begin < 0 ||
        length <= 0 || owned.end > static_cast<int64_t>(owned.tensor.nbytes()) ||
        static_cast<int64_t>(owned.source.nbytes()) != length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "owned bytes ", owned.begin, "..", owned.end, " of a tensor of ", owned.tensor.nbytes(),
          " bytes need a contiguous source of its dtype holding exactly those bytes"));
    }
    for (int index : it->second) {
      mine.ranges.push_back(UploadRange{index, owned.begin, owned.end});
      planned.sources.push_back(owned.source.detach().reshape({-1}));
    }
  }
  mine.header = std::move(prepared.header);
  return planned;
}

AsyncCheckpointer::PartState AsyncCheckpointer::part_state() const {
  absl::MutexLock lock(&mu_);
  return part_state_;
}

void AsyncCheckpointer::SetPartState(PartState state) {
  absl::MutexLock lock(&mu_);
  part_state_ = state;
}

AsyncCheckpointer::PartState AsyncCheckpointer::WaitForPart() {
  absl::MutexLock lock(&mu_);
  const auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return part_state_ != PartState::kWriting;
  };
  mu_.Await(absl::Condition(&settled));
  return part_state_;
}

void AsyncCheckpointer::EndSharedUpload(bool commit) {
  absl::MutexLock lock(&mu_);
  if (decision_ == Decision::kUndecided) {
    decision_ = commit ? Decision::kCommit : Decision::kAbandon;
  }
}

absl::StatusOr<std::unique_ptr<UploadPart>> AsyncCheckpointer::JoinWhenBegun(const Share& share) {
  BackoffPolicy policy;
  policy.initial = absl::Milliseconds(5);
  policy.max = absl::Milliseconds(200);
  Backoff backoff(policy, absl::Now() + share.join_timeout);
  while (true) {
    absl::StatusOr<std::unique_ptr<UploadPart>> part =
        store_->JoinUpload(share.upload_name, share.ranges);
    if (!absl::IsNotFound(part.status())) return part;
    {
      absl::MutexLock lock(&mu_);
      if (decision_ == Decision::kAbandon) {
        return absl::AbortedError(absl::StrCat("upload ", share.upload_name,
                                               " was abandoned before this rank could join it"));
      }
    }
    if (!backoff.Wait()) {
      return absl::DeadlineExceededError(
          absl::StrCat("the leading rank did not begin upload ", share.upload_name, " within ",
                       absl::FormatDuration(share.join_timeout),
                       " (do all ranks use one store?): ", part.status().message()));
    }
  }
}

absl::StatusOr<std::optional<CommitResult>> AsyncCheckpointer::UploadShare(
    const StagedSnapshot& snapshot, CommitOptions options, const Share& share) {
  // Every rank prepared the same header from the same state, so its ranges are ranges of the
  // leader's upload too. The failpoints (test builds only, libs/store/internal/failpoint.h) kill
  // a rank at each phase of its part: parallel_save_kill_test.cc.
  CKPT_FAILPOINT("shared_upload.before_join");
  std::unique_ptr<UploadSession> session;
  if (share.leader) {
    options.joinable_as = share.upload_name;
    ASSIGN_OR_RETURN(session, store_->BeginUpload(model_name_, share.header, options));
  }
  if (!share.ranges.empty()) {
    std::unique_ptr<UploadPart> part;
    if (share.leader) {
      ASSIGN_OR_RETURN(part, store_->JoinUpload(share.upload_name, share.ranges));
    } else {
      ASSIGN_OR_RETURN(part, JoinWhenBegun(share));
    }
    for (size_t index = 0; index < share.ranges.size(); ++index) {
      const UploadRange& range = share.ranges[index];
      const at::Tensor& piece = snapshot.pieces[index];
      if (static_cast<int64_t>(piece.nbytes()) != range.end - range.begin) {
        return absl::InternalError(absl::StrCat("snapshot piece ", index, " holds ", piece.nbytes(),
                                                " bytes for range ", range.begin, "..", range.end));
      }
      RETURN_IF_ERROR(part->AddRangeData(
          static_cast<int>(index), 0,
          absl::string_view(static_cast<const char*>(piece.data_ptr()), piece.nbytes())));
      if (index == 0) CKPT_FAILPOINT("shared_upload.mid_part");
    }
    RETURN_IF_ERROR(part->Finish());
  }
  CKPT_FAILPOINT("shared_upload.part_written");
  int64_t part_bytes = 0;
  for (const UploadRange& range : share.ranges) part_bytes += range.end - range.begin;
  Decision decision;
  {
    absl::MutexLock lock(&mu_);
    part_state_ = PartState::kWritten;
    ++stats_.parts_written;
    stats_.part_bytes_written += part_bytes;
    if (!share.leader) return std::nullopt;
    const auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return decision_ != Decision::kUndecided;
    };
    mu_.Await(absl::Condition(&decided));
    decision = decision_;
  }
  if (decision == Decision::kAbandon) {
    // The session goes out of scope uncommitted: no version, and GC reclaims every part.
    return absl::AbortedError(absl::StrCat("checkpoint upload ", share.upload_name,
                                           " abandoned: another rank's part of it failed (its "
                                           "log says why)"));
  }
  CKPT_FAILPOINT("shared_upload.before_commit");
  ASSIGN_OR_RETURN(CommitResult committed, session->Commit());
  return committed;
}

absl::StatusOr<std::optional<CommitResult>> AsyncCheckpointer::Upload(
    const StagedSnapshot& snapshot, CommitOptions options, const std::optional<Share>& share) {
  if (share) return UploadShare(snapshot, std::move(options), *share);
  ASSIGN_OR_RETURN(CommitResult committed,
                   CommitCheckpoint(*store_, model_name_, snapshot.contents, options));
  return committed;
}

void AsyncCheckpointer::SetBeforeDeferredCopyForTesting(std::function<void(size_t)> hook) {
  before_deferred_copy_ = std::move(hook);
}

void AsyncCheckpointer::BeforeOptimizerStep() {
  WaitForDeferred([](const DeferredCopy&) { return true; });
}

void AsyncCheckpointer::WaitUntilSnapshotted(absl::Span<const at::Tensor> tensors) {
  std::vector<const void*> memory;
  for (const at::Tensor& tensor : tensors) memory.push_back(MemoryOf(tensor));
  WaitForDeferred([&](const DeferredCopy& copy) {
    return std::find(memory.begin(), memory.end(), copy.memory) != memory.end();
  });
}

void AsyncCheckpointer::WaitForDeferred(const std::function<bool(const DeferredCopy&)>& wanted) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  if (deferred_pending_ == 0) return;  // the common case once the copy has caught up: no clock.
  const auto copied = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const DeferredCopy& copy : deferred_) {
      if (!copy.done && wanted(copy)) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&copied));
  const absl::Duration waited = absl::Now() - start;
  stats_.last_guard_wait += waited;
  stats_.last_stall += waited;
  stats_.total_stall += waited;
}

// Consecutive copies are run (on several threads when large) and released together up to this
// size: fewer thread starts for many small tensors, and a guard for the first parameters does not
// wait for later ones. A larger tensor is a bucket of its own.
constexpr size_t kDeferredBucketBytes = size_t{16} << 20;

void AsyncCheckpointer::CopyDeferred() {
  const absl::Time start = absl::Now();
  size_t count;
  {
    absl::MutexLock lock(&mu_);
    count = deferred_.size();
  }
  for (size_t begin = 0; begin < count;) {
    // Only this thread changes deferred_ while the upload runs (done and source, under mu_), so
    // the ranges may be read here and copied without the lock.
    std::vector<CopyRange> bucket;
    size_t end = begin, bytes = 0;
    {
      absl::MutexLock lock(&mu_);
      while (end < count &&
             (end == begin || bytes + deferred_[end].range.bytes <= kDeferredBucketBytes)) {
        bytes += deferred_[end].range.bytes;
        bucket.push_back(deferred_[end].range);
        ++end;
      }
    }
    if (before_deferred_copy_) {
      for (size_t i = begin; i < end; ++i) before_deferred_copy_(i);
    }
    ParallelCopy(bucket, DefaultCopyThreads());
    absl::MutexLock lock(&mu_);
    for (size_t i = begin; i < end; ++i) {
      deferred_[i].done = true;
      deferred_[i].source = at::Tensor();  // the live tensor is free to go.
      --deferred_pending_;
    }
    begin = end;
  }
  absl::MutexLock lock(&mu_);
  stats_.last_deferred_copy = absl::Now() - start;
}

absl::Status AsyncCheckpointer::Start(const SnapshotTaker& take_snapshot, CommitOptions options,
                                      std::optional<Share> share) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(JoinInFlight());
  const absl::Time snapshot_start = absl::Now();
  // The previous snapshot's buffers (its upload is over) become this one's.
  BufferPool pool;
  {
    absl::MutexLock lock(&mu_);
    for (at::Tensor& tensor : spare_buffers_) pool.Add(std::move(tensor));
    spare_buffers_.clear();
  }
  std::vector<DeferredSnapshotCopy> deferred_copies;
  ASSIGN_OR_RETURN(StagedSnapshot snapshot, take_snapshot(pool, &deferred_copies));
  const absl::Time end = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = true;
    ++stats_.submitted;
    stats_.last_snapshot = end - snapshot_start;
    stats_.last_snapshot_bytes = 0;
    for (const at::Tensor& tensor : snapshot.Tensors()) {
      stats_.last_snapshot_bytes += static_cast<int64_t>(tensor.nbytes());
    }
    stats_.last_stall = end - start;
    stats_.total_stall += end - start;
    stats_.last_guard_wait = absl::ZeroDuration();
    stats_.last_deferred_copy = absl::ZeroDuration();
    deferred_.clear();
    for (DeferredSnapshotCopy& copy : deferred_copies) {
      deferred_.push_back({MemoryOf(copy.source), std::move(copy.source), copy.range, false});
    }
    deferred_pending_ = deferred_.size();
    part_state_ = share ? PartState::kWriting : PartState::kNone;
    leads_shared_upload_ = share && share->leader;
    decision_ = share ? Decision::kUndecided : Decision::kCommit;
  }
  // The progress callback of the caller (if any) would run on the background thread; keep it.
  uploader_ = std::thread([this, snapshot = std::move(snapshot), options = std::move(options),
                           share = std::move(share)]() mutable {
    const absl::Time upload_start = absl::Now();
    // What the next optimizer step writes first is copied first; the guards wait for it.
    CopyDeferred();
    // Accelerator tensors arrive in their pinned buffers while the training runs on.
    absl::Status copied = snapshot.WaitForDeviceCopies();
    absl::StatusOr<std::optional<CommitResult>> committed =
        copied.ok() ? Upload(snapshot, std::move(options), share)
                    : absl::StatusOr<std::optional<CommitResult>>(copied);
    std::vector<at::Tensor> spare = snapshot.Tensors();
    snapshot = StagedSnapshot();
    absl::MutexLock lock(&mu_);
    spare_buffers_ = std::move(spare);  // kept for the next snapshot.
    in_flight_ = false;
    stats_.last_upload = absl::Now() - upload_start;
    leads_shared_upload_ = false;
    if (committed.ok()) {
      if (committed->has_value()) {
        ++stats_.committed;
        stats_.last_commit = **std::move(committed);
      }
    } else {
      ++stats_.failed;
      if (part_state_ == PartState::kWriting) part_state_ = PartState::kFailed;
      if (share && !share->leader) {
        // The ranks learn of it from part_state() over their collective; the leader reports
        // the checkpoint as failed. Kept from the next Submit, which it must not fail.
        std::cerr << "trainer: this rank's part of checkpoint upload " << share->upload_name
                  << " failed: " << committed.status() << "\n";
      } else {
        last_error_ = committed.status();
      }
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CommitResult>> AsyncCheckpointer::Wait() {
  {
    absl::MutexLock lock(&mu_);
    if (leads_shared_upload_ && decision_ == Decision::kUndecided) {
      // Joining would wait for a verdict only this thread can give.
      return absl::FailedPreconditionError(
          "Wait() on the leader of a shared upload before EndSharedUpload()");
    }
  }
  RETURN_IF_ERROR(JoinInFlight());
  absl::MutexLock lock(&mu_);
  return stats_.last_commit;
}

}  // namespace ckpt::train
