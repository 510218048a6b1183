#include "libs/train/async_checkpointer.h"

#include <iostream>
#include <map>
#include <utility>

#include "ATen/ATen.h"
#include "libs/io/prefault.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"

namespace ckpt::train {
namespace {

// Host tensors of an earlier snapshot, reused by shape and dtype. Writing into memory that is
// already mapped avoids a page fault per 4 KiB, which made the first copy of fresh memory cost
// most of the stall (tools/bench R7).
class BufferPool {
 public:
  void Add(at::Tensor tensor) {
    buffers_.emplace(Key(tensor), std::move(tensor));
  }
  // A contiguous CPU tensor shaped and typed like `like`: a spare one when there is one.
  at::Tensor Take(const at::Tensor& like) {
    auto it = buffers_.find(Key(like));
    if (it == buffers_.end()) {
      at::Tensor fresh = at::empty(like.sizes(), like.options().device(at::kCPU));
      // Mapped in one call, not a page fault per 4 KiB during the copy (libs/io/prefault.h).
      if (fresh.nbytes() >= (size_t{1} << 20)) PrefaultForWrite(fresh.data_ptr(), fresh.nbytes());
      return fresh;
    }
    at::Tensor buffer = std::move(it->second);
    buffers_.erase(it);
    return buffer;
  }

 private:
  static std::string Key(const at::Tensor& tensor) {
    return c10::str(tensor.scalar_type(), tensor.sizes());
  }
  std::multimap<std::string, at::Tensor> buffers_;
};

// A private contiguous CPU copy.
at::Tensor HostCopy(const at::Tensor& tensor, BufferPool* pool) {
  const at::Tensor source = tensor.detach();
  if (pool == nullptr || source.layout() != at::kStrided) {
    at::Tensor copy = source.to(at::kCPU, source.scalar_type(), /*non_blocking=*/false,
                                /*copy=*/true);
    return copy.is_contiguous() ? copy : copy.contiguous();
  }
  at::Tensor buffer = pool->Take(source);
  buffer.copy_(source);
  return buffer;
}

Value SnapshotValue(const Value& value, BufferPool* pool) {
  switch (value.kind()) {
    case Value::Kind::kTensor:
      return Value::Tensor(HostCopy(value.tensor(), pool), value.tensor_original_device());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(value.items().size());
      for (const Value& item : value.items()) items.push_back(SnapshotValue(item, pool));
      return value.is_list() ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    case Value::Kind::kDict: {
      std::vector<Value::Entry> entries;
      entries.reserve(value.entries().size());
      for (const Value::Entry& entry : value.entries()) {
        entries.emplace_back(entry.first, SnapshotValue(entry.second, pool));
      }
      return Value::Dict(std::move(entries));
    }
    case Value::Kind::kOpaque:
      return Value::Opaque(value.opaque_class_name(), SnapshotValue(value.opaque_args(), pool),
                           SnapshotValue(value.opaque_state(), pool));
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

absl::StatusOr<CheckpointContents> Snapshot(const CheckpointContents& contents,
                                            BufferPool* pool) {
  return CatchTorchErrors([&]() -> CheckpointContents {
    CheckpointContents copy;
    for (const StateDict::Entry& entry : contents.model) {
      copy.model.InsertOrAssign(entry.key, HostCopy(entry.tensor, pool),
                                entry.original_device.empty() ? entry.tensor.device().str()
                                                              : entry.original_device);
    }
    if (contents.optimizer) copy.optimizer = SnapshotValue(*contents.optimizer, pool);
    if (contents.scheduler) copy.scheduler = SnapshotValue(*contents.scheduler, pool);
    copy.extra = SnapshotValue(contents.extra, pool);
    copy.metadata = contents.metadata;
    copy.optimizer_param_names = contents.optimizer_param_names;
    return copy;
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
  return CatchTorchErrors([&] { return SnapshotValue(value, nullptr); });
}

absl::StatusOr<CheckpointContents> SnapshotToHost(const CheckpointContents& contents) {
  return Snapshot(contents, nullptr);
}

AsyncCheckpointer::AsyncCheckpointer(CheckpointStore* store, std::string model_name)
    : store_(store), model_name_(std::move(model_name)) {}

AsyncCheckpointer::~AsyncCheckpointer() {
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

absl::Status AsyncCheckpointer::Submit(const CheckpointContents& contents,
                                       CommitOptions options) {
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
  ASSIGN_OR_RETURN(CheckpointContents snapshot, Snapshot(contents, &pool));
  const absl::Time end = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = true;
    ++stats_.submitted;
    stats_.last_snapshot = end - snapshot_start;
    stats_.last_stall = end - start;
    stats_.total_stall += end - start;
  }
  // The progress callback of the caller (if any) would run on the background thread; keep it.
  uploader_ = std::thread([this, snapshot = std::move(snapshot),
                           options = std::move(options)]() mutable {
    const absl::Time upload_start = absl::Now();
    absl::StatusOr<CommitResult> committed =
        store_->CommitCheckpoint(model_name_, snapshot, options);
    std::vector<at::Tensor> spare = TensorsOf(snapshot);
    snapshot = CheckpointContents();
    absl::MutexLock lock(&mu_);
    spare_buffers_ = std::move(spare);  // kept for the next snapshot.
    in_flight_ = false;
    stats_.last_upload = absl::Now() - upload_start;
    if (committed.ok()) {
      ++stats_.committed;
      stats_.last_commit = *std::move(committed);
    } else {
      ++stats_.failed;
      last_error_ = committed.status();
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CommitResult>> AsyncCheckpointer::Wait() {
  RETURN_IF_ERROR(JoinInFlight());
  absl::MutexLock lock(&mu_);
  return stats_.last_commit;
}

}  // namespace ckpt::train
