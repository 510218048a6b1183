#include "libs/ddp/distributed_sampler.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/randperm.h"
#include "c10/util/Exception.h"

namespace ckpt::ddp {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      rank_(rank),
      world_size_(world_size),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  TORCH_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0, got ",
              dataset_size);
  TORCH_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank must be in [0, ",
              world_size, "), got ", rank);
  // PyTorch: ceil((n - world) / world) with drop_last and an uneven split, which is floor(n /
  // world); otherwise ceil(n / world).
  num_samples_ = (drop_last_ && dataset_size_ % world_size_ != 0)
                     ? dataset_size_ / world_size_
                     : (dataset_size_ + world_size_ - 1) / world_size_;
  ComputeIndices();
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  ComputeIndices();
}

void DistributedSampler::set_position(int64_t consumed) {
  TORCH_CHECK(consumed >= 0 && consumed <= num_samples_,
              "DistributedSampler: position must be in [0, num_samples()=", num_samples_, "], got ",
              consumed);
  position_ = consumed;
}

void DistributedSampler::set_block_sizes(std::vector<int64_t> block_sizes) {
  int64_t sum = 0;
  for (int64_t size : block_sizes) {
    TORCH_CHECK(size >= 0, "DistributedSampler: a block size must be >= 0, got ", size);
    sum += size;
  }
  TORCH_CHECK(block_sizes.empty() || sum == dataset_size_,
              "DistributedSampler: the block sizes sum to ", sum, ", not the dataset size ",
              dataset_size_);
  block_sizes_ = std::move(block_sizes);
  position_ = 0;
  ComputeIndices();
}

std::vector<int64_t> DistributedSampler::Peek(int64_t count) const {
  const int64_t end = std::min(num_samples_, position_ + std::max<int64_t>(count, 0));
  return std::vector<int64_t>(indices_.begin() + position_, indices_.begin() + end);
}

std::vector<int64_t> DistributedSampler::NextBatch(int64_t batch_size) {
  TORCH_CHECK(batch_size >= 1, "DistributedSampler: batch_size must be >= 1, got ", batch_size);
  const int64_t end = std::min(num_samples_, position_ + batch_size);
  std::vector<int64_t> batch(indices_.begin() + position_, indices_.begin() + end);
  position_ = end;
  return batch;
}

void DistributedSampler::ComputeIndices() {
  std::vector<int64_t> all(static_cast<size_t>(dataset_size_));
  if (shuffle_ && !block_sizes_.empty()) {
    // The order of the blocks, then each block's own permutation, from one generator.
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    const auto options = at::TensorOptions().dtype(at::kLong);
    const int64_t blocks = static_cast<int64_t>(block_sizes_.size());
    std::vector<int64_t> starts(block_sizes_.size(), 0);
    for (size_t b = 1; b < block_sizes_.size(); ++b) {
      starts[b] = starts[b - 1] + block_sizes_[b - 1];
    }
    const at::Tensor block_order = at::randperm(blocks, generator, options);
    auto out = all.begin();
    for (int64_t i = 0; i < blocks; ++i) {
      const auto b = static_cast<size_t>(block_order.data_ptr<int64_t>()[i]);
      const at::Tensor within = at::randperm(block_sizes_[b], generator, options);
      const int64_t* offsets = within.data_ptr<int64_t>();
      for (int64_t k = 0; k < block_sizes_[b]; ++k) *out++ = starts[b] + offsets[k];
    }
  } else if (shuffle_) {
    // torch.Generator().manual_seed(seed + epoch); torch.randperm(n, generator=g): the same CPU
    // generator and kernel, so the permutation is Python's to the element.
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    const at::Tensor permutation =
        at::randperm(dataset_size_, generator, at::TensorOptions().dtype(at::kLong));
    std::copy_n(permutation.data_ptr<int64_t>(), dataset_size_, all.begin());
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) all[static_cast<size_t>(i)] = i;
  }
  const int64_t total = total_size();
  std::vector<int64_t> padded;
  padded.reserve(static_cast<size_t>(total));
  if (drop_last_) {
    padded.assign(all.begin(), all.begin() + total);
  } else {
    // Repeat the list from its start until it has total elements (PyTorch's padding).
    padded = all;
    while (static_cast<int64_t>(padded.size()) < total) {
      const int64_t take =
          std::min<int64_t>(total - static_cast<int64_t>(padded.size()), dataset_size_);
      padded.insert(padded.end(), all.begin(), all.begin() + take);
    }
  }
  indices_.clear();
  indices_.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_size_) {
    indices_.push_back(padded[static_cast<size_t>(i)]);
  }
}

}  // namespace ckpt::ddp
