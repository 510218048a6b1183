#ifndef CKPT_LIBS_TRAIN_ZERO_OPTIMIZER_H_
#define CKPT_LIBS_TRAIN_ZERO_OPTIMIZER_H_

// ZeroOptimizer: ZeRO stage 1 (Rajbhandari et al., 2020; DeepSpeed's stage 1, PyTorch's
// ZeroRedundancyOptimizer): the optimizer state of a data-parallel job is partitioned across its
// ranks, so each rank holds about 1/N of it.
//
// The partition: the parameters' bytes, in parameter order, cut into one consecutive stretch per
// rank, balanced by bytes, on 4 MiB chunk boundaries inside a parameter (SplitUpload over the
// parameters, libs/store/upload_split.h). A rank's slice of every optimizer state tensor is then
// a byte range a parted store upload takes from that rank alone (CheckpointStore::JoinUpload).
//
// Each Step(), after DDP has averaged the gradients (and the trainer clipped them, over the full
// gradients, as without ZeRO): every rank copies its slices of the gradients onto its shard
// parameters, steps a LibTorch optimizer over those shards only, writes the updated slices back
// into the full parameters, and broadcasts them, so every rank holds every parameter again. SGD,
// Adam and AdamW are element-wise, so the parameters are the ones the same optimizer over the
// full parameters computes, bit for bit (libs/train/zero_optimizer_test.cc).
//
// Checkpoints hold the logical state: GatherStateDict() assembles PyTorch's state_dict() layout of
// an optimizer over all the parameters (full tensors, ids 0..n-1), which exports as an ordinary
// torch.optim state dict and restores into a run with or without ZeRO, on any number of ranks;
// LoadStateDict() takes such a dict (from any world size) and keeps this rank's slices.
//
// Collectives: Step, GatherStateDict and LoadStateDict's checks are called by every rank
// together, in the same order. Not thread-safe. Methods throw c10::Error where LibTorch does
// (Step), the others return a Status.
//
// Example (every rank):
//   ASSIGN_OR_RETURN(std::unique_ptr<ZeroOptimizer> zero,
//                    ZeroOptimizer::Create(spec, model->parameters(), group.comm));
//   zero->ZeroGrad(); loss.backward();   // DDP all-reduces the gradients
//   zero->Step();
//   ASSIGN_OR_RETURN(Value state, zero->GatherStateDict());   // to CheckpointContents

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/ddp/communicator.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/upload_split.h"
#include "libs/tensor/value.h"
#include "libs/train/optimizer.h"
#include "torch/optim/optimizer.h"

namespace ckpt::train {

class ZeroOptimizer {
 public:
  // Elements [begin, end) of parameter `parameter` (flattened), owned by rank `owner`.
  struct Slice {
    int owner = 0;
    int parameter = 0;
    int64_t begin = 0;
    int64_t end = 0;
  };

  // Partitions `parameters` (contiguous; one param group) over `comm`'s ranks and builds a
  // spec.kind optimizer over this rank's shards. INVALID_ARGUMENT for a non-contiguous parameter
  // or what MakeOptimizer refuses. `comm` must outlive this object.
  static absl::StatusOr<std::unique_ptr<ZeroOptimizer>> Create(const OptimizerSpec& spec,
                                                               std::vector<at::Tensor> parameters,
                                                               const ddp::Communicator& comm);

  // Zeroes every parameter's gradient, as Optimizer::zero_grad over all of them would.
  void ZeroGrad();
  // Steps this rank's shards and broadcasts every rank's updated slices (a collective).
  void Step();

  // The optimizer over this rank's shards: its param group's hyper-parameters (lr for the
  // scheduler) are the run's.
  torch::optim::Optimizer& shard_optimizer() { return *optimizer_; }
  const torch::optim::Optimizer& shard_optimizer() const { return *optimizer_; }

  // Every rank's slices, in parameter order (a rank's are consecutive); this rank's shards.
  const std::vector<Slice>& partition() const { return partition_; }
  const std::vector<Slice>& own_slices() const { return own_; }
  // Bytes of optimizer state this rank holds against what an unsharded optimizer would hold.
  int64_t shard_state_bytes() const;

  // The logical state of an optimizer over all the parameters in PyTorch's layout (see the file
  // comment), assembled from every rank's shards (a collective). Fresh tensors, not live ones.
  absl::StatusOr<Value> GatherStateDict() const;

  // What a rank writes of a parallel checkpoint without gathering anything (a collective that
  // exchanges only dtypes and per-parameter values): GatherStateDict()'s layout with each
  // per-element state tensor a shape-only placeholder (meta device, the full shape; its Value
  // names the parameters' device), this rank's slices of the parameters and of those state
  // tensors as OwnedTensorBytes over the live tensors (snapshot them before the next Step), and
  // the tensors the ranks' slices partition (the parameters and the placeholders, alike on every
  // rank). For AsyncCheckpointer::SharedUpload's `owned` and `partitioned`: each rank then holds a
  // copy of its slices only.
  struct ShardedState {
    Value state_dict;
    std::vector<OwnedTensorBytes> owned;
    std::vector<at::Tensor> partitioned;
  };
  absl::StatusOr<ShardedState> ShardedStateDict() const;

  // Restores a logical state dict (GatherStateDict's or a plain optimizer's, from any world
  // size): this rank keeps its slices of each state tensor. Errors as LoadOptimizerStateDict, and
  // INVALID_ARGUMENT for more than one param group or a state tensor whose size differs from its
  // parameter's.
  absl::Status LoadStateDict(const Value& state_dict);

  // As LoadStateDict for the optimizer state of the version `reader` reads, reading from the store
  // only this rank's byte ranges of each per-element state tensor (VersionReader::ReadTensorRange)
  // and the per-parameter values: a resuming rank reads and holds its shard, not the whole state.
  // FAILED_PRECONDITION when the version has no optimizer state; errors as LoadStateDict and the
  // reader's.
  absl::Status LoadStateFrom(const VersionReader& reader);

 private:
  ZeroOptimizer(const ddp::Communicator& comm, std::vector<at::Tensor> parameters)
      : comm_(comm), parameters_(std::move(parameters)) {}

  // The logical state dict's layout, from every rank's description of its slices (a collective:
  // dtypes and per-parameter values only), its per-element tensors made by `make_tensor` (the
  // parameter, the entry's dtype). per_element[p]: parameter p's such tensors by key;
  // described[s]: whether slice s of partition_ has state; shard_dict: this rank's optimizer's
  // state_dict(), over live tensors.
  struct LogicalState {
    Value state_dict;
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> per_element;
    std::vector<bool> described;
    Value shard_dict;
  };
  using TensorMaker =
      std::function<absl::StatusOr<at::Tensor>(const at::Tensor& parameter, at::ScalarType dtype)>;
  absl::StatusOr<LogicalState> DescribeLogicalState(const TensorMaker& make_tensor) const;

  // The element range `slice` of `tensor` flattened (a view).
  static at::Tensor FlatSlice(const at::Tensor& tensor, const Slice& slice);
  // LoadStateDict with `slice_of` giving a slice of a per-element state tensor (a copy).
  using SliceReader =
      std::function<absl::StatusOr<at::Tensor>(const at::Tensor& full, const Slice& slice)>;
  absl::Status LoadSlices(const Value& state_dict, const SliceReader& slice_of);

  const ddp::Communicator& comm_;
  std::vector<at::Tensor> parameters_;
  std::vector<Slice> partition_;
  std::vector<Slice> own_;
  std::vector<at::Tensor> shards_;  // own_[j]'s parameters, leaves the optimizer steps.
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_ZERO_OPTIMIZER_H_
