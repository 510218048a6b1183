#ifndef CKPT_LIBS_DDP_DISTRIBUTED_SAMPLER_H_
#define CKPT_LIBS_DDP_DISTRIBUTED_SAMPLER_H_

// The sample indices one rank of a data-parallel job reads, with exactly the semantics of
// PyTorch's torch.utils.data.DistributedSampler (so a job can move between Python and C++ and
// read the same samples), plus a resumable position inside the epoch for checkpointing.
//
// Not thread-safe; each rank owns one.
//
// Example:
//   DistributedSampler sampler(dataset_size, rank, world_size, /*shuffle=*/true, /*seed=*/0);
//   sampler.set_epoch(epoch);
//   sampler.set_position(consumed_from_checkpoint);
//   for (auto batch = sampler.NextBatch(32); !batch.empty(); batch = sampler.NextBatch(32)) { ... }

#include <cstdint>
#include <vector>

namespace ckpt::ddp {

class DistributedSampler {
 public:
  // dataset_size >= 0, world_size >= 1, rank in [0, world_size); throws c10::Error otherwise.
  // Without drop_last, each rank gets ceil(dataset_size / world_size) samples and the index list
  // is padded by repeating it from the start; with drop_last the tail that does not divide evenly
  // is dropped. Starts at epoch 0, position 0.
  DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  // Selects the epoch; the shuffle is torch.randperm(n) from a generator seeded with seed + epoch
  // (as PyTorch's sampler). Also rewinds position() to 0: a new epoch starts at its beginning.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // Shuffles in blocks, for data read in shards: block_sizes (summing to dataset_size) cut the
  // index range into consecutive blocks, and each epoch's order is the blocks in
  // torch.randperm(len(block_sizes)) order, each block's indices in a torch.randperm of its own,
  // all drawn in that sequence from the one generator seeded with seed + epoch. Padding and the
  // rank's stride are unchanged, so a rank reads the blocks one after another (two at a time at
  // most at a boundary) while each epoch still covers every index once. Python gives the same
  // indices as
  //   g = torch.Generator().manual_seed(seed + epoch); start = cumulative block starts
  //   order = [i for b in torch.randperm(len(sizes), generator=g).tolist()
  //              for i in (torch.randperm(sizes[b], generator=g) + start[b]).tolist()]
  //   [order[p] for p in DistributedSampler(range(n), world, rank, shuffle=False, ...)]
  // Without shuffle the order is 0..n-1 as before. Empty: no blocks (a plain randperm). Rewinds
  // position() to 0; throws c10::Error when the sizes are negative or do not sum to the size.
  void set_block_sizes(std::vector<int64_t> block_sizes);

  // Samples per rank per epoch, and num_samples() * world_size, as PyTorch computes them.
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * world_size_; }

  // This rank's indices for the current epoch (num_samples() of them): the (padded or truncated)
  // permutation's elements rank, rank + world_size, rank + 2 * world_size, ...
  std::vector<int64_t> EpochIndices() const { return indices_; }

  // How many of this rank's samples of the current epoch have been consumed (by NextBatch or
  // set_position), in [0, num_samples()].
  int64_t position() const { return position_; }
  // Resumes inside the epoch; throws c10::Error unless 0 <= consumed <= num_samples().
  void set_position(int64_t consumed);

  // The next min(batch_size, num_samples() - position()) indices, advancing position(). Empty at
  // the end of the epoch. batch_size must be >= 1.
  std::vector<int64_t> NextBatch(int64_t batch_size);

  // The next min(count, num_samples() - position()) indices without advancing: what a reader
  // should prefetch.
  std::vector<int64_t> Peek(int64_t count) const;

 private:
  void ComputeIndices();

  int64_t dataset_size_;
  int rank_;
  int world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> block_sizes_;  // empty: one randperm over the whole range.
  std::vector<int64_t> indices_;      // this rank's indices for epoch_
};

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_DISTRIBUTED_SAMPLER_H_
