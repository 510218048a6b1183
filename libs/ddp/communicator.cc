#include "libs/ddp/communicator.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "c10/core/DeviceGuard.h"
#include "c10/util/Exception.h"
#include "torch/csrc/distributed/c10d/Types.hpp"

namespace ckpt::ddp {
namespace {

class DevicePlacement final : public TensorPlacement {
 public:
  explicit DevicePlacement(at::Device device) : device_(device) {}
  at::Device device() const override { return device_; }
  at::Tensor Place(const at::Tensor& tensor) const override { return tensor.to(device_); }
  bool IsPlaced(const at::Tensor& tensor) const override { return tensor.device() == device_; }

 private:
  const at::Device device_;
};

// Makes the collective device current for the duration of a collective, as PyTorch's
// torch.cuda.device(...) context does: c10d's NCCL group creates streams and communicators on the
// current device, and the current device is per thread (a collective may be issued from another
// thread than the one InitProcessGroup set it on). A no-op for the CPU and for custom placements
// (tests declaring a device they do not have).
class CollectiveDeviceGuard {
 public:
  CollectiveDeviceGuard(bool enabled, at::Device device) {
    if (enabled && !device.is_cpu()) guard_.reset_device(device);
  }

 private:
  c10::OptionalDeviceGuard guard_;
};

}  // namespace

std::shared_ptr<const TensorPlacement> PlaceOnDevice(at::Device device) {
  return std::make_shared<DevicePlacement>(device);
}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group, at::Device device)
    : Communicator(std::move(group), PlaceOnDevice(device)) {
  guard_device_ = true;
}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
                           std::shared_ptr<const TensorPlacement> placement)
    : group_(std::move(group)), placement_(std::move(placement)) {
  TORCH_CHECK(group_, "Communicator: process group is null");
  TORCH_CHECK(placement_ != nullptr, "Communicator: placement is null");
}

at::Tensor Communicator::Place(const at::Tensor& tensor) const {
  CollectiveDeviceGuard guard(guard_device_, device());
  return placement_->Place(tensor);
}

void Communicator::CheckPlaced(const at::Tensor& tensor, const char* what) const {
  TORCH_CHECK(tensor.defined(), what, ": the tensor is undefined");
  TORCH_CHECK(placement_->IsPlaced(tensor), what, " on rank ", rank(), ": a ", tensor.scalar_type(),
              " tensor of shape ", tensor.sizes(), " on ", tensor.device(),
              " is not on the collective device ", device(),
              "; collectives take tensors placed with Communicator::Place (NCCL moves only "
              "tensors on its rank's own GPU)");
}

c10::intrusive_ptr<c10d::Work> Communicator::AllReduceSumAsync(at::Tensor& tensor) const {
  CheckPlaced(tensor, "all-reduce");
  CollectiveDeviceGuard guard(guard_device_, device());
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  return group_->allreduce(tensors, options);
}

void Communicator::Broadcast(at::Tensor& tensor, int root) const {
  TORCH_CHECK(root >= 0 && root < size(), "broadcast root must be in [0, ", size(), "), got ",
              root);
  CheckPlaced(tensor, "broadcast");
  CollectiveDeviceGuard guard(guard_device_, device());
  std::vector<at::Tensor> tensors = {tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  group_->broadcast(tensors, options)->wait();
}

std::vector<double> Communicator::AllReduceSum(const std::vector<double>& values) const {
  if (values.empty()) return {};
  const at::Tensor host = at::empty({static_cast<int64_t>(values.size())}, at::kDouble);
  std::memcpy(host.data_ptr<double>(), values.data(), values.size() * sizeof(double));
  at::Tensor placed = Place(host);
  AllReduceSumAsync(placed)->wait();
  const at::Tensor result = placed.cpu().contiguous();
  const double* sums = result.data_ptr<double>();
  return std::vector<double>(sums, sums + values.size());
}

double Communicator::AllReduceMean(double value) const { return AllReduceSum({value})[0] / size(); }

std::string Communicator::BroadcastString(const std::string& value_on_root, int root) const {
  TORCH_CHECK(root >= 0 && root < size(), "BroadcastString root must be in [0, ", size(), "), got ",
              root);
  const bool is_root = rank() == root;
  // Two broadcasts: the length first, so every rank can size its receive buffer.
  at::Tensor length = Place(
      at::full({1}, is_root ? static_cast<int64_t>(value_on_root.size()) : int64_t{0}, at::kLong));
  Broadcast(length, root);
  const int64_t size = length.cpu().item<int64_t>();
  if (size == 0) return std::string();
  at::Tensor bytes = at::empty({size}, at::kByte);
  if (is_root) std::memcpy(bytes.data_ptr(), value_on_root.data(), value_on_root.size());
  at::Tensor payload = Place(bytes);
  Broadcast(payload, root);
  const at::Tensor received = payload.cpu().contiguous();
  return std::string(static_cast<const char*>(received.data_ptr()), static_cast<size_t>(size));
}

void Communicator::Barrier() const {
  CollectiveDeviceGuard guard(guard_device_, device());
  c10d::BarrierOptions options;
  // NCCL implements a barrier as an all-reduce on a device; name ours, or c10d guesses
  // rank % device count, which is wrong when ranks do not map to GPUs that way.
  if (device().is_cuda()) options.device_ids = {device().index()};
  group_->barrier(options)->wait();
}

}  // namespace ckpt::ddp
