#ifndef CKPT_LIBS_DDP_COMMUNICATOR_H_
#define CKPT_LIBS_DDP_COMMUNICATOR_H_

// The one way the trainer and libs/ddp issue collectives: a c10d process group together with the
// device its backend moves tensors on.
//
// Why it exists: NCCL moves only CUDA tensors, and only on the device its communicator was made
// for (cuda:<local rank>; torchrun-launched PyTorch calls torch.cuda.set_device(local_rank) for
// this). A collective handed a CPU tensor throws; one handed a tensor on another GPU uses the wrong
// communicator or hangs. So no code builds a tensor for a collective by itself: it asks the
// Communicator to Place() it (a copy to the collective device when it is elsewhere, as
// Tensor::to), and the tensor collectives refuse anything that is not placed. Gloo on the CPU
// places on the CPU, so the same code runs unchanged in CPU builds.
//
// How tensors are placed is a TensorPlacement. The real one (PlaceOnDevice) compares devices. On a
// CPU-only machine every tensor is on the CPU, so that comparison cannot tell a tensor that went
// through Place() from one that did not; libs/ddp/testing/device_checking_process_group.h has a
// placement that can, so CPU tests fail where a real NCCL group would.
//
// Every collective is blocking unless named ...Async, and every rank must issue the same
// collectives in the same order. Errors (a refused tensor, a dead peer, a timeout) are thrown as
// c10::Error; callers at a ckpt library boundary convert with ckpt::CatchTorchErrors.
//
// Example:
//   ckpt::ddp::Communicator& comm = pg.comm;  // from InitProcessGroup
//   std::string run_id = comm.BroadcastString(rank == 0 ? MakeRunId() : "");
//   std::vector<double> sums = comm.AllReduceSum({loss_sum, correct, examples});
//   at::Tensor flat = comm.Place(at::cat(pieces));
//   comm.Broadcast(flat, /*root=*/0);

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "c10/core/Device.h"
#include "c10/util/intrusive_ptr.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace ckpt::ddp {

// Where a process group's backend can move tensors, and how a tensor gets there.
class TensorPlacement {
 public:
  virtual ~TensorPlacement() = default;
  // The device collectives run on: cpu for Gloo on the CPU, cuda:<local rank> for NCCL.
  virtual at::Device device() const = 0;
  // `tensor` where collectives can move it: the tensor itself when it is already placed, else a
  // copy (so writing into the result never changes `tensor`, as with Tensor::to).
  virtual at::Tensor Place(const at::Tensor& tensor) const = 0;
  // Whether a collective may be given `tensor` as it is.
  virtual bool IsPlaced(const at::Tensor& tensor) const = 0;
};

// The placement of a real process group: a tensor is placed when it is on `device`.
std::shared_ptr<const TensorPlacement> PlaceOnDevice(at::Device device);

class Communicator {
 public:
  // An empty communicator (valid() is false); assign a real one before use.
  Communicator() = default;
  // Collectives of `group` on `device` (the real placement).
  Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group, at::Device device);
  Communicator(c10::intrusive_ptr<c10d::ProcessGroup> group,
               std::shared_ptr<const TensorPlacement> placement);

  bool valid() const { return group_ && placement_ != nullptr; }
  c10d::ProcessGroup& group() const { return *group_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group_ptr() const { return group_; }
  int rank() const { return group_->getRank(); }
  int size() const { return group_->getSize(); }
  // The device collectives run on.
  at::Device device() const { return placement_->device(); }

  // `tensor` on the collective device (see TensorPlacement::Place).
  at::Tensor Place(const at::Tensor& tensor) const;
  bool IsPlaced(const at::Tensor& tensor) const { return placement_->IsPlaced(tensor); }

  // ---- Collectives on placed tensors (Place() them, or allocate them from placed ones). A tensor
  // that is not placed is refused with an error naming the collective device.

  // Starts an in-place sum over all ranks; the result is valid once the work's wait() returns.
  c10::intrusive_ptr<c10d::Work> AllReduceSumAsync(at::Tensor& tensor) const;
  // Overwrites `tensor` on every rank with root's.
  void Broadcast(at::Tensor& tensor, int root) const;

  // ---- Collectives on host values (placed and read back here).

  // The element-wise sum of `values` over all ranks, in float64. Every rank passes as many.
  std::vector<double> AllReduceSum(const std::vector<double>& values) const;
  // The mean of `value` over all ranks, summed in float64.
  double AllReduceMean(double value) const;
  // Returns root's `value_on_root` on every rank (the others' arguments are ignored).
  std::string BroadcastString(const std::string& value_on_root, int root = 0) const;
  // Returns once every rank has called Barrier.
  void Barrier() const;

 private:
  // Throws unless `tensor` is placed; `what` names the collective.
  void CheckPlaced(const at::Tensor& tensor, const char* what) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::shared_ptr<const TensorPlacement> placement_;
  // Whether collectives make device() current: for a real device only (see the .cc).
  bool guard_device_ = false;
};

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_COMMUNICATOR_H_
