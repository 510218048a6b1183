#include "libs/ddp/testing/device_checking_process_group.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "c10/core/StorageImpl.h"
#include "c10/util/Exception.h"
#include "c10/util/intrusive_ptr.h"
#include "libs/ddp/communicator.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace ckpt::ddp::testing {
namespace {

// The CPU memory (storages) that stands for memory on the declared device. Weak references, so a
// freed storage whose address is reused by an unplaced tensor does not count as placed.
class PlacedStorages {
 public:
  void Add(const at::Tensor& tensor) {
    std::lock_guard<std::mutex> lock(mutex_);
    const c10::Storage& storage = tensor.storage();
    storages_.insert_or_assign(storage.unsafeGetStorageImpl(), storage.getWeakStorageImpl());
    if (storages_.size() > sweep_at_) {
      for (auto it = storages_.begin(); it != storages_.end();) {
        it = it->second.expired() ? storages_.erase(it) : std::next(it);
      }
      sweep_at_ = std::max<size_t>(1024, 2 * storages_.size());
    }
  }

  bool Contains(const at::Tensor& tensor) const {
    if (!tensor.defined() || !tensor.has_storage()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    const c10::StorageImpl* impl = tensor.storage().unsafeGetStorageImpl();
    auto it = storages_.find(impl);
    return it != storages_.end() && it->second.lock().get() == impl;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> storages_;
  size_t sweep_at_ = 1024;
};

class DeclaredDevicePlacement final : public TensorPlacement {
 public:
  DeclaredDevicePlacement(c10::Device declared, std::shared_ptr<PlacedStorages> placed)
      : declared_(declared), placed_(std::move(placed)) {}

  at::Device device() const override { return declared_; }

  at::Tensor Place(const at::Tensor& tensor) const override {
    TORCH_CHECK(tensor.device().is_cpu(),
                "the declared-device placement keeps tensors on the CPU; ", "got one on ",
                tensor.device());
    if (placed_->Contains(tensor)) return tensor;
    // A real move to another device copies; so does this, into memory recorded as placed.
    at::Tensor copy = tensor.clone(at::MemoryFormat::Preserve);
    placed_->Add(copy);
    return copy;
  }

  bool IsPlaced(const at::Tensor& tensor) const override { return placed_->Contains(tensor); }

 private:
  const c10::Device declared_;
  const std::shared_ptr<PlacedStorages> placed_;
};

// Forwards the collectives the trainer and libs/ddp use to a real group after checking that every
// tensor was placed; the others keep c10d's "does not support" error.
class DeviceCheckingProcessGroup final : public c10d::ProcessGroup {
 public:
  DeviceCheckingProcessGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner, c10::Device declared,
                             std::shared_ptr<PlacedStorages> placed)
      : c10d::ProcessGroup(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        declared_(declared),
        placed_(std::move(placed)) {}

  const std::string getBackendName() const override { return inner_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    Check("broadcast", tensors);
    return inner_->broadcast(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    Check("allreduce", tensors);
    return inner_->allreduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    Check("allreduce_coalesced", tensors);
    return inner_->allreduce_coalesced(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    Check("reduce", tensors);
    return inner_->reduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    Check("allgather", inputs);
    for (const std::vector<at::Tensor>& output : outputs) Check("allgather", output);
    return inner_->allgather(outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return inner_->barrier(opts);
  }

 private:
  void Check(const char* collective, const std::vector<at::Tensor>& tensors) const {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& tensor = tensors[i];
      TORCH_CHECK(placed_->Contains(tensor), collective, " on rank ", getRank(), ": tensor ", i,
                  " (", tensor.scalar_type(), ", shape ", tensor.sizes(),
                  ") was not placed on the group's device ", declared_,
                  " by Communicator::Place; a real NCCL group on ", declared_,
                  " would refuse it (device-checking test group)");
    }
  }

  const c10::intrusive_ptr<c10d::ProcessGroup> inner_;
  const c10::Device declared_;
  const std::shared_ptr<PlacedStorages> placed_;
};

}  // namespace

ProcessGroupHandle WithDeclaredDevice(ProcessGroupHandle handle, c10::Device declared) {
  TORCH_CHECK(handle.comm.valid(), "WithDeclaredDevice: the handle has no process group");
  auto placed = std::make_shared<PlacedStorages>();
  auto group =
      c10::make_intrusive<DeviceCheckingProcessGroup>(handle.comm.group_ptr(), declared, placed);
  handle.comm =
      Communicator(std::move(group), std::make_shared<DeclaredDevicePlacement>(declared, placed));
  return handle;
}

}  // namespace ckpt::ddp::testing
