#include "libs/train/async_checkpointer.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/container/flat_hash_set.h"
#include "libs/io/parallel_copy.h"
#include "libs/io/prefault.h"
#include "libs/rpc/backoff.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/upload_split.h"
#include "libs/tensor/side_stream_copies.h"

namespace ckpt::train {
namespace {

// Host tensors of an earlier snapshot, reused by shape and dtype. Writing into memory that is
// already mapped avoids a page fault per 4 KiB, which made the first copy of fresh memory cost
// most of the stall (tools/bench R7).
class BufferPool {
 public:
  void Add(at::Tensor tensor) {
    std::string key = Key(tensor, tensor.is_pinned());
    buffers_.emplace(std::move(key), std::move(tensor));
  }
  struct Buffer {
    at::Tensor tensor;
    bool fresh;  // newly allocated: its pages are not mapped yet.
  };
  // A contiguous CPU tensor shaped and typed like `like`: a spare one when there is one. Pinned
  // (page-locked) for copies from an accelerator, which can then run asynchronously.
  Buffer Take(const at::Tensor& like, bool pinned) {
    auto it = buffers_.find(Key(like, pinned));
    if (it == buffers_.end()) {
      return {pinned ? EmptyPinned(like.sizes(), like.scalar_type())
                     : at::empty(like.sizes(), like.options().device(at::kCPU)),
              /*fresh=*/!pinned};  // pinned memory is mapped when it is allocated.
    }
    at::Tensor buffer = std::move(it->second);
    buffers_.erase(it);
    return {std::move(buffer), /*fresh=*/false};
  }

 private:
  static std::string Key(const at::Tensor& tensor, bool pinned) {
    return c10::str(tensor.scalar_type(), tensor.sizes(), pinned ? " pinned" : "");
  }
  std::multimap<std::string, at::Tensor> buffers_;
};

// Mapping fresh pages in one call pays off for buffers of this size and up (libs/io/prefault.h).
constexpr size_t kPrefaultMinBytes = size_t{1} << 20;

// How a snapshot is taken: into the pool's buffers (fresh ones when it has none to spare), with
// the plain copies collected and run together by ParallelCopy once every buffer is chosen, and
// accelerator tensors copied into pinned buffers on a side stream per device.
struct SnapshotContext {
  BufferPool& pool;
  std::vector<CopyRange> plain_copies;
  std::map<std::string, std::shared_ptr<SideStreamCopies>> device_copies;  // by device name
  // SubmitOverlapped: the position in the copy order of a storage whose plain copies are left to
  // the background thread, and those copies (position, source, range).
  std::map<const void*, size_t> deferred_memory;
  struct Deferred {
    size_t order;
    at::Tensor source;
    CopyRange range;
  };
  std::vector<Deferred> deferred_copies;

  SideStreamCopies& CopiesFor(const c10::Device& device) {
    std::shared_ptr<SideStreamCopies>& copies = device_copies[device.str()];
    if (copies == nullptr) copies = std::make_shared<SideStreamCopies>(device);
    return *copies;
  }
};

// A snapshot whose accelerator copies may still be running: its host tensors may be read once
// WaitForDeviceCopies() has returned.
struct StagedSnapshot {
  CheckpointContents contents;
  std::vector<std::shared_ptr<SideStreamCopies>> device_copies;

  absl::Status WaitForDeviceCopies() {
    return CatchTorchErrors([&] {
      for (const auto& copies : device_copies) copies->WaitOnHost();
      device_copies.clear();
    });
  }
};

// The training stream stalls only to launch the copies: later kernels wait for them on the
// device (they may overwrite what is being copied), the host does not.
std::vector<std::shared_ptr<SideStreamCopies>> LaunchedDeviceCopies(SnapshotContext& context) {
  std::vector<std::shared_ptr<SideStreamCopies>> launched;
  for (auto& [device, copies] : context.device_copies) {
    copies->OrderBeforeCurrentStream();
    launched.push_back(copies);
  }
  return launched;
}

// Whether `source`'s bytes are exactly its values in memory order, so that a memcpy into a
// contiguous tensor of the same shape and dtype copies it.
bool IsPlainCpuTensor(const at::Tensor& source) {
  return source.device().is_cpu() && source.layout() == at::kStrided && source.is_contiguous() &&
         !source.is_quantized() && !source.is_conj() && !source.is_neg() &&
         !source._is_zerotensor();  // a zero tensor has no storage to copy from.
}

// What the guards match tensors by: the memory an in-place update of `tensor` writes.
const void* MemoryOf(const at::Tensor& tensor) {
  return tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr;
}

// A private contiguous CPU copy. A plain CPU tensor's copy is only scheduled in
// `context.plain_copies`: its bytes are there once the caller has run them.
at::Tensor HostCopy(const at::Tensor& tensor, SnapshotContext& context) {
  const at::Tensor source = tensor.detach();
  if (source.layout() != at::kStrided || source.is_quantized()) {
    // Sparse and other layouts, and quantized tensors (their quantizer comes along): as they are.
    at::Tensor copy = source.to(at::kCPU, source.scalar_type(), /*non_blocking=*/false,
                                /*copy=*/true);
    return copy.is_contiguous() ? copy : copy.contiguous();
  }
  if (!source.device().is_cpu() && source.device().has_index()) {
    // An accelerator tensor (the trainer's cuda:<local rank>): asynchronously, into pinned memory.
    BufferPool::Buffer buffer = context.pool.Take(source, /*pinned=*/true);
    context.CopiesFor(source.device()).CopyToHost(source, buffer.tensor);
    return buffer.tensor;
  }
  BufferPool::Buffer buffer = context.pool.Take(source, /*pinned=*/false);
  const bool prefault = buffer.fresh && buffer.tensor.nbytes() >= kPrefaultMinBytes;
  if (IsPlainCpuTensor(source) && buffer.tensor.is_contiguous() &&
      buffer.tensor.scalar_type() == source.scalar_type()) {
    if (source.nbytes() > 0) {
      const CopyRange range{buffer.tensor.data_ptr(), source.data_ptr(), source.nbytes(), prefault};
      auto deferred = context.deferred_memory.find(MemoryOf(source));
      if (deferred != context.deferred_memory.end()) {
        context.deferred_copies.push_back({deferred->second, source, range});
      } else {
        context.plain_copies.push_back(range);
      }
    }
    return buffer.tensor;
  }
  if (prefault) PrefaultForWrite(buffer.tensor.data_ptr(), buffer.tensor.nbytes());
  buffer.tensor.copy_(source);  // another device, strides, a conjugate, negative or zero view.
  return buffer.tensor;
}

Value SnapshotValue(const Value& value, SnapshotContext& context) {
  switch (value.kind()) {
    case Value::Kind::kTensor:
      return Value::Tensor(HostCopy(value.tensor(), context), value.tensor_original_device());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(value.items().size());
      for (const Value& item : value.items()) items.push_back(SnapshotValue(item, context));
      return value.is_list() ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    case Value::Kind::kDict: {
      std::vector<Value::Entry> entries;
      entries.reserve(value.entries().size());
      for (const Value::Entry& entry : value.entries()) {
        entries.emplace_back(entry.first, SnapshotValue(entry.second, context));
      }
      return Value::Dict(std::move(entries));
    }
    case Value::Kind::kOpaque:
      return Value::Opaque(value.opaque_class_name(), SnapshotValue(value.opaque_args(), context),
                           SnapshotValue(value.opaque_state(), context));
    default:
      return value;  // scalars and strings are values already.
  }
}

void CollectTensors(const Value& value, std::vector<at::Tensor>& out) {
  if (value.is_tensor()) {
    out.push_back(value.tensor());
  } else if (value.is_sequence()) {
    for (const Value& item : value.items()) CollectTensors(item, out);
  } else if (value.is_dict()) {
    for (const Value::Entry& entry : value.entries()) CollectTensors(entry.second, out);
  } else if (value.is_opaque()) {
    CollectTensors(value.opaque_args(), out);
    CollectTensors(value.opaque_state(), out);
  }
}

// With `deferred`, the plain copies of tensors sharing memory with one of them are not run but
// appended to `deferred_copies`, in the order of `deferred`.
absl::StatusOr<StagedSnapshot> Snapshot(
    const CheckpointContents& contents, BufferPool& pool,
    absl::Span<const at::Tensor> deferred = {},
    std::vector<SnapshotContext::Deferred>* deferred_copies = nullptr) {
  return CatchTorchErrors([&]() -> StagedSnapshot {
    SnapshotContext context{pool, {}, {}, {}, {}};
    for (size_t i = 0; i < deferred.size(); ++i) {
      const void* memory = MemoryOf(deferred[i]);
      if (memory != nullptr) context.deferred_memory.emplace(memory, i);  // the first one's place.
    }
    CheckpointContents copy;
    for (const StateDict::Entry& entry : contents.model) {
      copy.model.InsertOrAssign(
          entry.key, HostCopy(entry.tensor, context),
          entry.original_device.empty() ? entry.tensor.device().str() : entry.original_device);
    }
    if (contents.optimizer) copy.optimizer = SnapshotValue(*contents.optimizer, context);
    if (contents.scheduler) copy.scheduler = SnapshotValue(*contents.scheduler, context);
    copy.extra = SnapshotValue(contents.extra, context);
    copy.metadata = contents.metadata;
    copy.optimizer_param_names = contents.optimizer_param_names;
    // The sources are `contents`' tensors, alive until this returns. The trainer waits for the
    // snapshot, so the copy may take every core.
    ParallelCopy(context.plain_copies, DefaultCopyThreads());
    if (deferred_copies != nullptr) {
      std::stable_sort(context.deferred_copies.begin(), context.deferred_copies.end(),
                       [](const auto& a, const auto& b) { return a.order < b.order; });
      *deferred_copies = std::move(context.deferred_copies);
    }
    return StagedSnapshot{std::move(copy), LaunchedDeviceCopies(context)};
  });
}

// Every tensor a snapshot holds, for reuse by the next one.
std::vector<at::Tensor> TensorsOf(const CheckpointContents& contents) {
  std::vector<at::Tensor> tensors;
  for (const StateDict::Entry& entry : contents.model) tensors.push_back(entry.tensor);
  if (contents.optimizer) CollectTensors(*contents.optimizer, tensors);
  if (contents.scheduler) CollectTensors(*contents.scheduler, tensors);
  CollectTensors(contents.extra, tensors);
  return tensors;
}

}  // namespace

absl::StatusOr<Value> SnapshotValueToHost(const Value& value) {
  return CatchTorchErrors([&] {
    BufferPool fresh_buffers;
    SnapshotContext context{fresh_buffers, {}, {}, {}, {}};
    Value copy = SnapshotValue(value, context);
    ParallelCopy(context.plain_copies, DefaultCopyThreads());
    for (const auto& copies : LaunchedDeviceCopies(context)) copies->WaitOnHost();
    return copy;
  });
}

absl::StatusOr<CheckpointContents> SnapshotToHost(const CheckpointContents& contents) {
  BufferPool fresh_buffers;
  ASSIGN_OR_RETURN(StagedSnapshot staged, Snapshot(contents, fresh_buffers));
  RETURN_IF_ERROR(staged.WaitForDeviceCopies());
  return std::move(staged.contents);
}

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
  return Start(contents, std::move(options), {});
}

absl::Status AsyncCheckpointer::SubmitOverlapped(const CheckpointContents& contents,
                                                 CommitOptions options,
                                                 absl::Span<const at::Tensor> deferred) {
  return Start(contents, std::move(options), deferred);
}

absl::Status AsyncCheckpointer::SubmitShared(const CheckpointContents& contents,
                                             CommitOptions options,
                                             absl::Span<const at::Tensor> deferred,
                                             SharedUpload share) {
  absl::StatusOr<Share> mine = ShareOf(contents, options, share);
  absl::Status started =
      mine.ok() ? Start(contents, std::move(options), deferred, *std::move(mine)) : mine.status();
  if (!started.ok()) SetPartState(PartState::kFailed);
  return started;
}

absl::StatusOr<AsyncCheckpointer::Share> AsyncCheckpointer::ShareOf(
    const CheckpointContents& contents, const CommitOptions& options, const SharedUpload& share) {
  if (share.world_size < 1 || share.rank < 0 || share.rank >= share.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", share.rank, " of ", share.world_size, " ranks"));
  }
  ASSIGN_OR_RETURN(const PreparedUpload prepared, PrepareUpload(contents, options));
  absl::flat_hash_set<const void*> replicated;
  for (const at::Tensor& tensor : share.replicated) replicated.insert(MemoryOf(tensor));
  std::vector<int> rank_zero_only;
  for (size_t index = 0; index < prepared.tensors.size(); ++index) {
    const void* memory = MemoryOf(prepared.tensors[index]);
    if (memory == nullptr || !replicated.contains(memory)) {
      rank_zero_only.push_back(static_cast<int>(index));
    }
  }
  Share mine;
  mine.upload_name = share.upload_name;
  mine.leader = share.rank == 0;
  mine.ranges = SplitUpload(prepared.header, share.world_size, rank_zero_only)[share.rank];
  mine.join_timeout = share.join_timeout;
  return mine;
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
    const CheckpointContents& snapshot, CommitOptions options, const Share& share) {
  // Every rank prepares the same header from the same state, so the ranges it was given (cut
  // from the live state's header) are ranges of the leader's upload too.
  ASSIGN_OR_RETURN(PreparedUpload prepared, PrepareUpload(snapshot, options));
  std::unique_ptr<UploadSession> session;
  if (share.leader) {
    options.joinable_as = share.upload_name;
    ASSIGN_OR_RETURN(session, store_->BeginUpload(model_name_, prepared.header, options));
  }
  if (!share.ranges.empty()) {
    std::unique_ptr<UploadPart> part;
    if (share.leader) {
      ASSIGN_OR_RETURN(part, store_->JoinUpload(share.upload_name, share.ranges));
    } else {
      ASSIGN_OR_RETURN(part, JoinWhenBegun(share));
    }
    RETURN_IF_ERROR(UploadTensorRanges(*part, prepared.tensors));
  }
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
  ASSIGN_OR_RETURN(CommitResult committed, session->Commit());
  return committed;
}

absl::StatusOr<std::optional<CommitResult>> AsyncCheckpointer::Upload(
    const CheckpointContents& snapshot, CommitOptions options, const std::optional<Share>& share) {
  if (share) return UploadShare(snapshot, std::move(options), *share);
  ASSIGN_OR_RETURN(CommitResult committed,
                   store_->CommitCheckpoint(model_name_, snapshot, options));
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

absl::Status AsyncCheckpointer::Start(const CheckpointContents& contents, CommitOptions options,
                                      absl::Span<const at::Tensor> deferred,
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
  std::vector<SnapshotContext::Deferred> deferred_copies;
  ASSIGN_OR_RETURN(StagedSnapshot snapshot, Snapshot(contents, pool, deferred, &deferred_copies));
  const absl::Time end = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = true;
    ++stats_.submitted;
    stats_.last_snapshot = end - snapshot_start;
    stats_.last_stall = end - start;
    stats_.total_stall += end - start;
    stats_.last_guard_wait = absl::ZeroDuration();
    stats_.last_deferred_copy = absl::ZeroDuration();
    deferred_.clear();
    for (SnapshotContext::Deferred& copy : deferred_copies) {
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
        copied.ok() ? Upload(snapshot.contents, std::move(options), share)
                    : absl::StatusOr<std::optional<CommitResult>>(copied);
    std::vector<at::Tensor> spare = TensorsOf(snapshot.contents);
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
