#include "libs/train/async_checkpointer.h"

#include <iostream>
#include <utility>

#include "ATen/ATen.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"

namespace ckpt::train {
namespace {

// A private contiguous CPU copy. `.to(kCPU, copy=true)` copies even when the tensor already
// lives on the CPU, and `contiguous()` of its result is then a no-op.
at::Tensor HostCopy(const at::Tensor& tensor) {
  at::Tensor copy = tensor.detach().to(at::kCPU, tensor.scalar_type(), /*non_blocking=*/false,
                                       /*copy=*/true);
  return copy.is_contiguous() ? copy : copy.contiguous();
}

Value SnapshotValue(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kTensor:
      return Value::Tensor(HostCopy(value.tensor()), value.tensor_original_device());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(value.items().size());
      for (const Value& item : value.items()) items.push_back(SnapshotValue(item));
      return value.is_list() ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    case Value::Kind::kDict: {
      std::vector<Value::Entry> entries;
      entries.reserve(value.entries().size());
      for (const Value::Entry& entry : value.entries()) {
        entries.emplace_back(entry.first, SnapshotValue(entry.second));
      }
      return Value::Dict(std::move(entries));
    }
    case Value::Kind::kOpaque:
      return Value::Opaque(value.opaque_class_name(), SnapshotValue(value.opaque_args()),
                           SnapshotValue(value.opaque_state()));
    default:
      return value;  // scalars and strings are values already.
  }
}

}  // namespace

absl::StatusOr<Value> SnapshotValueToHost(const Value& value) {
  return CatchTorchErrors([&] { return SnapshotValue(value); });
}

absl::StatusOr<CheckpointContents> SnapshotToHost(const CheckpointContents& contents) {
  return CatchTorchErrors([&]() -> CheckpointContents {
    CheckpointContents copy;
    for (const StateDict::Entry& entry : contents.model) {
      copy.model.InsertOrAssign(entry.key, HostCopy(entry.tensor),
                                entry.original_device.empty() ? entry.tensor.device().str()
                                                              : entry.original_device);
    }
    if (contents.optimizer) copy.optimizer = SnapshotValue(*contents.optimizer);
    if (contents.scheduler) copy.scheduler = SnapshotValue(*contents.scheduler);
    copy.extra = SnapshotValue(contents.extra);
    copy.metadata = contents.metadata;
    copy.optimizer_param_names = contents.optimizer_param_names;
    return copy;
  });
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
  ASSIGN_OR_RETURN(CheckpointContents snapshot, SnapshotToHost(contents));
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
    snapshot = CheckpointContents();  // free the host copy before reporting.
    absl::MutexLock lock(&mu_);
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
