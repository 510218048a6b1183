#include "libs/train/host_snapshot.h"

#include <algorithm>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "libs/io/prefault.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"

namespace ckpt::train {
namespace {

// Mapping fresh pages in one call pays off for buffers of this size and up (libs/io/prefault.h).
constexpr size_t kPrefaultMinBytes = size_t{1} << 20;

// How a snapshot is taken: into the pool's buffers (fresh ones when it has none to spare), with
// the plain copies collected and run together by ParallelCopy once every buffer is chosen, and
// accelerator tensors copied into pinned buffers on a side stream per device.
struct SnapshotContext {
  BufferPool& pool;
  std::vector<CopyRange> plain_copies;
  std::map<std::string, std::shared_ptr<SideStreamCopies>> device_copies;  // by device name
  // The position in the copy order of a storage whose plain copies are left to the caller's
  // background thread, and those copies.
  std::map<const void*, size_t> deferred_memory;
  std::vector<DeferredSnapshotCopy> deferred_copies;

  SideStreamCopies& CopiesFor(const c10::Device& device) {
    std::shared_ptr<SideStreamCopies>& copies = device_copies[device.str()];
    if (copies == nullptr) copies = std::make_shared<SideStreamCopies>(device);
    return *copies;
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
  value.ForEachTensor([&](const std::string&, const at::Tensor& tensor) { out.push_back(tensor); });
}

// Runs `copy_all` (which schedules copies into `context` and builds the snapshot's host side)
// with `deferred`'s memory marked, then the scheduled plain copies, and hands back the deferred
// ones in the caller's order.
absl::StatusOr<StagedSnapshot> TakeSnapshot(
    BufferPool& pool, absl::Span<const at::Tensor> deferred,
    std::vector<DeferredSnapshotCopy>* deferred_copies,
    const std::function<void(SnapshotContext&, StagedSnapshot&)>& copy_all) {
  return CatchTorchErrors([&]() -> StagedSnapshot {
    SnapshotContext context{pool, {}, {}, {}, {}};
    for (size_t i = 0; i < deferred.size(); ++i) {
      const void* memory = MemoryOf(deferred[i]);
      if (memory != nullptr) context.deferred_memory.emplace(memory, i);  // the first one's place.
    }
    StagedSnapshot staged;
    copy_all(context, staged);
    // The sources are alive until this returns. The trainer waits for the snapshot, so the copy
    // may take every core.
    ParallelCopy(context.plain_copies, DefaultCopyThreads());
    if (deferred_copies != nullptr) {
      std::stable_sort(context.deferred_copies.begin(), context.deferred_copies.end(),
                       [](const auto& a, const auto& b) { return a.order < b.order; });
      *deferred_copies = std::move(context.deferred_copies);
    }
    staged.device_copies = LaunchedDeviceCopies(context);
    return staged;
  });
}

}  // namespace

void BufferPool::Add(at::Tensor tensor) {
  std::string key = Key(tensor, tensor.is_pinned());
  buffers_.emplace(std::move(key), std::move(tensor));
}

BufferPool::Buffer BufferPool::Take(const at::Tensor& like, bool pinned) {
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

std::string BufferPool::Key(const at::Tensor& tensor, bool pinned) {
  return c10::str(tensor.scalar_type(), tensor.sizes(), pinned ? " pinned" : "");
}

absl::Status StagedSnapshot::WaitForDeviceCopies() {
  return CatchTorchErrors([&] {
    for (const auto& copies : device_copies) copies->WaitOnHost();
    device_copies.clear();
  });
}

std::vector<at::Tensor> StagedSnapshot::Tensors() const {
  std::vector<at::Tensor> tensors = pieces;
  for (const StateDict::Entry& entry : contents.model) tensors.push_back(entry.tensor);
  if (contents.optimizer) CollectTensors(*contents.optimizer, tensors);
  if (contents.scheduler) CollectTensors(*contents.scheduler, tensors);
  CollectTensors(contents.extra, tensors);
  return tensors;
}

const void* MemoryOf(const at::Tensor& tensor) {
  return tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr;
}

absl::StatusOr<StagedSnapshot> Snapshot(const CheckpointContents& contents, BufferPool& pool,
                                        absl::Span<const at::Tensor> deferred,
                                        std::vector<DeferredSnapshotCopy>* deferred_copies) {
  return TakeSnapshot(
      pool, deferred, deferred_copies, [&](SnapshotContext& context, StagedSnapshot& staged) {
        CheckpointContents& copy = staged.contents;
        for (const StateDict::Entry& entry : contents.model) {
          copy.model.InsertOrAssign(
              entry.key, HostCopy(entry.tensor, context),
              entry.original_device.empty() ? entry.tensor.device().str() : entry.original_device);
        }
        if (contents.optimizer) {
          copy.optimizer = SnapshotValue(*contents.optimizer, context);
        }
        if (contents.scheduler) {
          copy.scheduler = SnapshotValue(*contents.scheduler, context);
        }
        copy.extra = SnapshotValue(contents.extra, context);
        copy.metadata = contents.metadata;
        copy.optimizer_param_names = contents.optimizer_param_names;
      });
}

absl::StatusOr<StagedSnapshot> SnapshotPieces(absl::Span<const at::Tensor> sources,
                                              BufferPool& pool,
                                              absl::Span<const at::Tensor> deferred,
                                              std::vector<DeferredSnapshotCopy>* deferred_copies) {
  return TakeSnapshot(pool, deferred, deferred_copies,
                      [&](SnapshotContext& context, StagedSnapshot& staged) {
                        staged.pieces.reserve(sources.size());
                        for (const at::Tensor& source : sources) {
                          staged.pieces.push_back(HostCopy(source, context));
                        }
                      });
}

absl::StatusOr<Value> SnapshotValueToHost(const Value& value) {
  BufferPool fresh_buffers;
  Value copy;
  ASSIGN_OR_RETURN(
      StagedSnapshot staged,
      TakeSnapshot(fresh_buffers, {}, nullptr, [&](SnapshotContext& context, StagedSnapshot&) {
        copy = SnapshotValue(value, context);
      }));
  RETURN_IF_ERROR(staged.WaitForDeviceCopies());
  return copy;
}

absl::StatusOr<CheckpointContents> SnapshotToHost(const CheckpointContents& contents) {
  BufferPool fresh_buffers;
  ASSIGN_OR_RETURN(StagedSnapshot staged, Snapshot(contents, fresh_buffers));
  RETURN_IF_ERROR(staged.WaitForDeviceCopies());
  return std::move(staged.contents);
}

}  // namespace ckpt::train
