#include "libs/ddp/distributed_data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ATen/ScalarOps.h"
#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "ATen/ops/add.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/div.h"
#include "ATen/ops/zeros.h"
#include "c10/util/Exception.h"

namespace ckpt::ddp {
namespace {

// Broadcasts of parameters and buffers are coalesced into flat tensors of at most this many bytes
// (or the bucket cap, if larger): few collectives, bounded extra memory.
constexpr int64_t kMinBroadcastChunkBytes = 1 << 20;

bool SameKind(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

}  // namespace

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel* ddp) : ddp_(ddp) {
  std::lock_guard<std::mutex> lock(ddp_->mutex_);
  previous_ = ddp_->no_sync_;
  ddp_->no_sync_ = true;
}

void DistributedDataParallel::NoSyncGuard::Release() {
  if (ddp_ == nullptr) return;
  std::lock_guard<std::mutex> lock(ddp_->mutex_);
  ddp_->no_sync_ = previous_;
  ddp_ = nullptr;
}

ReplicaTensors TensorsOf(std::shared_ptr<torch::nn::Module> module) {
  TORCH_CHECK(module != nullptr, "DistributedDataParallel: module is null");
  ReplicaTensors replica;
  replica.parameters = module->parameters();
  // The closure keeps the module alive as long as the DDP object.
  replica.buffers = [module = std::move(module)] { return module->buffers(); };
  return replica;
}

ReplicaTensors TensorsOf(const torch::jit::Module& module) {
  ReplicaTensors replica;
  for (const at::Tensor& parameter : module.parameters()) replica.parameters.push_back(parameter);
  // A jit::Module is a handle to its object: the copy shares the module's attributes.
  replica.buffers = [module] {
    std::vector<at::Tensor> buffers;
    for (const at::Tensor& buffer : module.buffers()) buffers.push_back(buffer);
    return buffers;
  };
  return replica;
}

DistributedDataParallel::DistributedDataParallel(ReplicaTensors replica, Communicator comm,
                                                 DataParallelOptions options)
    : buffers_(std::move(replica.buffers)),
      comm_(std::move(comm)),
      options_(options),
      parameters_(std::move(replica.parameters)) {
  TORCH_CHECK(buffers_ != nullptr, "DistributedDataParallel: the replica has no buffer reader");
  TORCH_CHECK(comm_.valid(), "DistributedDataParallel: the communicator has no process group");
  TORCH_CHECK(options_.bucket_cap_bytes > 0,
              "DistributedDataParallel: bucket_cap_bytes must be positive, got ",
              options_.bucket_cap_bytes);
  BuildBuckets();
  // Equal starting points first: the hooks only average gradients, they never correct
  // diverged parameters.
  SyncParametersAndBuffers();
  hook_handles_.assign(parameters_.size(), 0);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (locations_[i].bucket < 0) continue;
    const int64_t index = static_cast<int64_t>(i);
    hook_handles_[i] = parameters_[i].register_hook(
        [this, index](const at::Tensor& grad) { return OnGradient(index, grad); });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (locations_[i].bucket >= 0) parameters_[i].remove_hook(hook_handles_[i]);
  }
}

void DistributedDataParallel::BuildBuckets() {
  locations_.assign(parameters_.size(), Location{});
  // The bucket each (dtype, device) is currently filling, and its size in bytes.
  struct OpenBucket {
    at::Tensor exemplar;
    int64_t bucket;
    int64_t bytes;
  };
  std::vector<OpenBucket> open;
  std::vector<int64_t> numels;  // per bucket
  for (int64_t i = static_cast<int64_t>(parameters_.size()) - 1; i >= 0; --i) {
    const at::Tensor& parameter = parameters_[static_cast<size_t>(i)];
    if (!parameter.requires_grad()) continue;
    TORCH_CHECK(
        at::isFloatingType(parameter.scalar_type()) || at::isComplexType(parameter.scalar_type()),
        "DistributedDataParallel: parameter ", i, " requires grad but has dtype ",
        parameter.scalar_type());
    const int64_t bytes = parameter.numel() * static_cast<int64_t>(parameter.element_size());
    auto it = std::find_if(open.begin(), open.end(), [&](const OpenBucket& candidate) {
      return SameKind(candidate.exemplar, parameter);
    });
    if (it != open.end() && it->bytes + bytes > options_.bucket_cap_bytes) {
      open.erase(it);
      it = open.end();
    }
    if (it == open.end()) {
      buckets_.emplace_back();
      numels.push_back(0);
      open.push_back(OpenBucket{parameter, static_cast<int64_t>(buckets_.size()) - 1, /*bytes=*/0});
      it = open.end() - 1;
    }
    Bucket& bucket = buckets_[static_cast<size_t>(it->bucket)];
    locations_[static_cast<size_t>(i)] =
        Location{it->bucket, static_cast<int64_t>(bucket.slots.size())};
    bucket.slots.push_back(Slot{i, numels[static_cast<size_t>(it->bucket)], parameter.numel()});
    numels[static_cast<size_t>(it->bucket)] += parameter.numel();
    it->bytes += bytes;
  }
  slot_ready_.clear();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const int64_t first_index = bucket.slots.front().parameter_index;
    const at::Tensor& first = parameters_[static_cast<size_t>(first_index)];
    // Placed, so the all-reduce takes it; on the parameters' device, so the hooks fill it without
    // a copy. A parameter elsewhere would make every gradient cross devices: refuse it here.
    bucket.flat = comm_.Place(at::zeros({numels[b]}, first.options().requires_grad(false)));
    TORCH_CHECK(bucket.flat.device() == first.device(), "DistributedDataParallel: parameter ",
                first_index, " is on ", first.device(),
                " but the process group's collectives run on ", comm_.device(),
                "; move the module there first (module->to(device))");
    bucket.pending = static_cast<int64_t>(bucket.slots.size());
    slot_ready_.emplace_back(bucket.slots.size(), false);
  }
}

at::Tensor DistributedDataParallel::OnGradient(int64_t parameter_index, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (no_sync_) return grad;
  at::NoGradGuard no_grad;
  const Location location = locations_[static_cast<size_t>(parameter_index)];
  Bucket& bucket = buckets_[static_cast<size_t>(location.bucket)];
  const Slot& slot = bucket.slots[static_cast<size_t>(location.slot)];
  const at::Tensor& parameter = parameters_[static_cast<size_t>(parameter_index)];
  TORCH_CHECK(grad.defined() && grad.layout() == at::kStrided,
              "DistributedDataParallel: parameter ", parameter_index,
              " received an undefined or sparse gradient; only dense gradients are supported");
  TORCH_CHECK(SameKind(grad, bucket.flat) && grad.sizes() == parameter.sizes(),
              "DistributedDataParallel: parameter ", parameter_index, " has dtype ",
              parameter.scalar_type(), " on ", parameter.device(), " shape ", parameter.sizes(),
              " but its gradient has dtype ", grad.scalar_type(), " on ", grad.device(), " shape ",
              grad.sizes());
  at::Tensor view = bucket.flat.narrow(0, slot.offset, slot.numel).view(parameter.sizes());
  std::vector<bool>& ready = slot_ready_[static_cast<size_t>(location.bucket)];
  if (ready[static_cast<size_t>(location.slot)]) {
    // A second backward through this parameter before FinishGradientSync (e.g. retain_graph):
    // its gradient adds up, as .grad would, unless the bucket is already on the wire.
    TORCH_CHECK(!bucket.work, "DistributedDataParallel: parameter ", parameter_index,
                " received a second gradient after its bucket was all-reduced; call "
                "FinishGradientSync after each backward, or accumulate inside NoSync()");
    view.add_(grad);
    return grad;
  }
  // The hook runs before autograd accumulates `grad` into .grad, so .grad still holds what
  // earlier (NoSync) backward passes accumulated; the bucket carries the sum. (One pass over the
  // bytes: LibTorch's zero_grad() leaves .grad defined, so this is the common case.)
  const at::Tensor& existing = parameter.grad();
  if (existing.defined()) {
    at::add_out(view, grad, existing);
  } else {
    view.copy_(grad);
  }
  ready[static_cast<size_t>(location.slot)] = true;
  --bucket.pending;
  LaunchReadyBucketsLocked();
  return grad;
}

void DistributedDataParallel::FillFromExistingGrad(Bucket& bucket, const Slot& slot) {
  const at::Tensor& parameter = parameters_[static_cast<size_t>(slot.parameter_index)];
  at::Tensor view = bucket.flat.narrow(0, slot.offset, slot.numel).view(parameter.sizes());
  const at::Tensor& existing = parameter.grad();
  if (existing.defined()) {
    view.copy_(existing);
  } else {
    view.zero_();
  }
}

void DistributedDataParallel::LaunchReadyBucketsLocked() {
  while (next_to_launch_ < static_cast<int64_t>(buckets_.size()) &&
         buckets_[static_cast<size_t>(next_to_launch_)].pending == 0) {
    Bucket& bucket = buckets_[static_cast<size_t>(next_to_launch_)];
    bucket.work = comm_.AllReduceSumAsync(bucket.flat);
    bytes_all_reduced_ += static_cast<int64_t>(bucket.flat.nbytes());
    ++next_to_launch_;
  }
}

void DistributedDataParallel::FinishGradientSync() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (no_sync_) return;
    at::NoGradGuard no_grad;
    // Parameters that took no part in this backward still join the all-reduce (every rank must
    // send every bucket), with what they have.
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& bucket = buckets_[b];
      if (bucket.pending == 0) continue;
      for (size_t s = 0; s < bucket.slots.size(); ++s) {
        if (slot_ready_[b][s]) continue;
        FillFromExistingGrad(bucket, bucket.slots[s]);
        slot_ready_[b][s] = true;
        --bucket.pending;
      }
    }
    LaunchReadyBucketsLocked();
    for (const Bucket& bucket : buckets_) works.push_back(bucket.work);
  }
  for (const auto& work : works) work->wait();

  std::lock_guard<std::mutex> lock(mutex_);
  at::NoGradGuard no_grad;
  // The average is written straight into .grad (one pass, not a division of the bucket and then
  // a copy); the bucket is overwritten by the next backward anyway.
  // A wrapped number, as a Scalar argument would be: it never changes the result's dtype (a 0-dim
  // tensor would, for 0-dim gradients).
  const at::Tensor world_size =
      at::native::wrapped_scalar_tensor(c10::Scalar(static_cast<int64_t>(comm_.size())));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    for (const Slot& slot : bucket.slots) {
      at::Tensor& parameter = parameters_[static_cast<size_t>(slot.parameter_index)];
      const at::Tensor summed =
          bucket.flat.narrow(0, slot.offset, slot.numel).view(parameter.sizes());
      at::Tensor& grad = parameter.mutable_grad();
      if (grad.defined()) {  // .grad has its parameter's dtype, device and shape, as the bucket.
        at::div_out(grad, summed, world_size);
      } else {
        grad = at::div(summed, world_size);
      }
    }
    bucket.pending = static_cast<int64_t>(bucket.slots.size());
    bucket.work.reset();
    std::fill(slot_ready_[b].begin(), slot_ready_[b].end(), false);
  }
  next_to_launch_ = 0;
}

DistributedDataParallel::NoSyncGuard DistributedDataParallel::NoSync() { return NoSyncGuard(this); }

void DistributedDataParallel::SyncParametersAndBuffers() {
  std::vector<at::Tensor> tensors = parameters_;
  for (const at::Tensor& buffer : buffers_()) tensors.push_back(buffer);
  BroadcastTensors(tensors);
}

void DistributedDataParallel::PrepareForward() {
  if (!options_.broadcast_buffers) return;
  BroadcastTensors(buffers_());
}

void DistributedDataParallel::BroadcastTensors(const std::vector<at::Tensor>& tensors) {
  if (comm_.size() == 1) return;  // rank 0's values are already everyone's
  at::NoGradGuard no_grad;
  const int64_t chunk_bytes = std::max(options_.bucket_cap_bytes, kMinBroadcastChunkBytes);
  // Group by (dtype, device) in first-seen order, which every rank computes identically.
  std::vector<std::vector<at::Tensor>> groups;
  for (const at::Tensor& tensor : tensors) {
    if (!tensor.defined() || tensor.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& candidate) {
      return SameKind(candidate.front(), tensor);
    });
    if (it == groups.end()) {
      groups.push_back({tensor});
    } else {
      it->push_back(tensor);
    }
  }
  for (const std::vector<at::Tensor>& kind : groups) {
    size_t begin = 0;
    while (begin < kind.size()) {
      size_t end = begin;
      int64_t bytes = 0;
      std::vector<at::Tensor> pieces;
      while (end < kind.size() &&
             (end == begin || bytes + static_cast<int64_t>(kind[end].nbytes()) <= chunk_bytes)) {
        bytes += static_cast<int64_t>(kind[end].nbytes());
        pieces.push_back(kind[end].reshape({-1}));
        ++end;
      }
      at::Tensor flat = comm_.Place(at::cat(pieces));
      comm_.Broadcast(flat, /*root=*/0);
      int64_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        at::Tensor target = kind[i];
        target.copy_(flat.narrow(0, offset, target.numel()).view(target.sizes()));
        offset += target.numel();
      }
      begin = end;
    }
  }
}

std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_parameter_indices() const {
  std::vector<std::vector<int64_t>> indices;
  for (const Bucket& bucket : buckets_) {
    indices.emplace_back();
    for (const Slot& slot : bucket.slots) indices.back().push_back(slot.parameter_index);
  }
  return indices;
}

int64_t DistributedDataParallel::bytes_all_reduced() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_all_reduced_;
}

}  // namespace ckpt::ddp
