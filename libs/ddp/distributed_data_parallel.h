#ifndef CKPT_LIBS_DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define CKPT_LIBS_DDP_DISTRIBUTED_DATA_PARALLEL_H_

// Data-parallel training over a c10d process group: every rank holds a replica of the module,
// runs forward/backward on its own batch, and gradients are averaged across ranks with bucketed
// all-reduces that start during backward (as PyTorch's DistributedDataParallel), so each rank's
// optimizer step sees the gradient of the global batch.
//
// Buckets hold parameters in reverse registration order (gradients become ready roughly in that
// order during backward), one flat tensor per bucket of a single dtype and device, up to
// bucket_cap_bytes each (a larger parameter gets a bucket of its own). A gradient hook on every
// parameter that requires grad copies (existing .grad + this backward's gradient) into the
// parameter's slice of its bucket; a bucket whose slices are all written is all-reduced as soon as
// every bucket before it has been launched, so all ranks issue the collectives in one order (Gloo
// and NCCL match collectives by order). FinishGradientSync completes the rest and writes
// sum / world_size into every parameter's .grad.
//
// Every tensor it hands to a collective (buckets, coalesced broadcasts) is allocated or placed by
// the Communicator, on the group's device; the module's parameters must already be there
// (module->to(comm.device()) for NCCL), which the constructor checks.
//
// The replica is given as its tensors (ReplicaTensors), so a torch::nn::Module and a TorchScript
// torch::jit::Module (a model a team scripted in Python) go through the same buckets and hooks;
// the constructors taking a module only gather its tensors.
//
// Ownership: shares the module (or the replica's tensors) and the group. The hooks point at this
// object, so it is neither copyable nor movable and must outlive any backward pass over the
// module.
// Thread-safety: hooks run on autograd threads and are serialized by an internal mutex; the
// public methods are meant to be called from the training thread, between backward passes.
// Errors are thrown as c10::Error.
//
// Example:
//   DistributedDataParallel ddp(model, pg.comm);
//   for (...) {
//     optimizer.zero_grad();
//     ddp.PrepareForward();
//     at::Tensor loss = Loss(model->forward(inputs), targets);
//     loss.backward();
//     ddp.FinishGradientSync();
//     optimizer.step();
//   }

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ATen/core/Tensor.h"
#include "c10/util/intrusive_ptr.h"
#include "libs/ddp/communicator.h"
#include <functional>

#include "torch/csrc/distributed/c10d/Work.hpp"
#include "torch/csrc/jit/api/module.h"
#include "torch/nn/module.h"

namespace ckpt::ddp {

struct DataParallelOptions {
  // Upper bound on one gradient bucket, in bytes. Smaller buckets start communication earlier
  // in backward but cost more collectives. PyTorch's default: 25 MiB.
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  // Like PyTorch's broadcast_buffers=True: PrepareForward broadcasts rank 0's buffers (e.g.
  // BatchNorm running statistics) so every replica runs forward with the same ones.
  bool broadcast_buffers = true;
};

// One replica as DDP sees it: its parameters in the module's parameters() order (bucket indices
// refer to it) and a way to read its buffers. Buffers are read afresh at every broadcast, because
// a module may rebind a buffer attribute to a new tensor (TorchScript code can), where parameters
// are fixed once their gradient hooks are registered.
struct ReplicaTensors {
  std::vector<at::Tensor> parameters;
  std::function<std::vector<at::Tensor>()> buffers;
};

// The tensors of a LibTorch module, and of a TorchScript module (parameters and buffers of the
// whole module tree, in the order its named_parameters() / named_buffers() give them).
ReplicaTensors TensorsOf(std::shared_ptr<torch::nn::Module> module);
ReplicaTensors TensorsOf(const torch::jit::Module& module);

class DistributedDataParallel {
 public:
  // Registers gradient hooks on every parameter that requires grad and broadcasts parameters and
  // buffers from rank 0 so all ranks start equal (a collective: every rank constructs together).
  // Throws if a parameter is not on the collective device.
  DistributedDataParallel(ReplicaTensors replica, Communicator comm,
                          DataParallelOptions options = {});
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, Communicator comm,
                          DataParallelOptions options = {})
      : DistributedDataParallel(TensorsOf(std::move(module)), std::move(comm), options) {}
  DistributedDataParallel(const torch::jit::Module& module, Communicator comm,
                          DataParallelOptions options = {})
      : DistributedDataParallel(TensorsOf(module), std::move(comm), options) {}
  ~DistributedDataParallel();  // removes the hooks

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Broadcasts parameters and buffers from rank 0 (e.g. after rank 0 loaded a checkpoint).
  // Collective.
  void SyncParametersAndBuffers();

  // Broadcasts rank 0's buffers if options.broadcast_buffers; call before each forward.
  // Collective.
  void PrepareForward();

  // Call after loss.backward(): launches the buckets not launched yet (a parameter that received
  // no gradient in this backward contributes its existing .grad, or zeros), waits for all of
  // them and writes the averaged gradient (sum / world_size) into every parameter's .grad
  // (defining it if undefined). No-op while a NoSyncGuard is alive. Collective.
  void FinishGradientSync();

  // While a guard lives, backward passes accumulate gradients locally without communication
  // (PyTorch's no_sync); the first synchronized backward after it averages the accumulated sum.
  class NoSyncGuard {
   public:
    NoSyncGuard(NoSyncGuard&& other) noexcept : ddp_(other.ddp_), previous_(other.previous_) {
      other.ddp_ = nullptr;
    }
    NoSyncGuard& operator=(NoSyncGuard&& other) noexcept {
      if (this != &other) {
        Release();
        ddp_ = other.ddp_;
        previous_ = other.previous_;
        other.ddp_ = nullptr;
      }
      return *this;
    }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    ~NoSyncGuard() { Release(); }

   private:
    friend class DistributedDataParallel;
    explicit NoSyncGuard(DistributedDataParallel* ddp);
    void Release();

    DistributedDataParallel* ddp_;
    bool previous_ = false;  // restored on release, so guards nest
  };
  NoSyncGuard NoSync();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // For each bucket (in launch order), the indices into the replica's parameters it holds.
  std::vector<std::vector<int64_t>> bucket_parameter_indices() const;
  // Bytes all-reduced so far (every launched bucket counts once), for stats.
  int64_t bytes_all_reduced() const;

 private:
  struct Slot {
    int64_t parameter_index;  // into parameters_
    int64_t offset;           // in elements, into the bucket's flat tensor
    int64_t numel;
  };
  struct Bucket {
    at::Tensor flat;  // all slots, contiguous; all-reduced in place
    std::vector<Slot> slots;
    int64_t pending = 0;                  // slots not yet written in this iteration
    c10::intrusive_ptr<c10d::Work> work;  // set once launched in this iteration
  };
  struct Location {
    int64_t bucket = -1;  // -1: the parameter does not require grad
    int64_t slot = -1;
  };

  void BuildBuckets();
  at::Tensor OnGradient(int64_t parameter_index, const at::Tensor& grad);
  // Writes (existing .grad, or zeros) into the slot; requires mutex_ held.
  void FillFromExistingGrad(Bucket& bucket, const Slot& slot);
  // Launches, in index order, every complete bucket whose predecessors are launched.
  void LaunchReadyBucketsLocked();
  void BroadcastTensors(const std::vector<at::Tensor>& tensors);

  std::function<std::vector<at::Tensor>()> buffers_;  // the replica's, read at each broadcast
  Communicator comm_;
  DataParallelOptions options_;
  std::vector<at::Tensor> parameters_;  // the replica's, at construction
  std::vector<Location> locations_;     // per parameter
  std::vector<unsigned> hook_handles_;  // per parameter; meaningful where it has a bucket

  mutable std::mutex mutex_;  // guards everything below (hooks run on autograd threads)
  std::vector<Bucket> buckets_;
  std::vector<std::vector<bool>> slot_ready_;  // [bucket][slot], this iteration
  int64_t next_to_launch_ = 0;
  bool no_sync_ = false;
  int64_t bytes_all_reduced_ = 0;
};

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_DISTRIBUTED_DATA_PARALLEL_H_
