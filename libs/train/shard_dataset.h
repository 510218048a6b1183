#ifndef CKPT_LIBS_TRAIN_SHARD_DATASET_H_
#define CKPT_LIBS_TRAIN_SHARD_DATASET_H_

// Internal to //libs/train:dataset (OpenDataset in dataset.h is the interface): the examples of
// a torch.save or safetensors file checked once for every source that reads them, and the data
// set streamed from a directory of shard files ("shards:DIR").

#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "libs/train/dataset.h"

namespace ckpt::train::internal {

// A file's examples, checked and converted to what a Batch holds.
struct Examples {
  at::Tensor inputs;   // float32 [N, ...] features, or int64 [N, ...] token ids.
  at::Tensor targets;  // int64 [N] class ids, or float32 [N, ...] regression / multi-label targets.
  InputKind kind = InputKind::kFeatures;
  int64_t num_classes = 0;  // max(class id) + 1; 0 for float targets.
  int64_t vocab_size = 0;   // max(token id) + 1; 0 for features.
};

// Checks `inputs` and `targets` read from `name` (the messages start with it): N > 0 rows each;
// inputs of a floating dtype (converted to float32) or an integer one (token ids >= 0, to int64);
// targets an integer [N] of class ids >= 0 (to int64) or floating [N, ...] (to float32); neither
// a view that claims more bytes than its storage holds (an expanded tensor, which converting
// would materialize). INVALID_ARGUMENT saying what was found otherwise.
absl::StatusOr<Examples> CheckExamples(const std::string& name, const at::Tensor& inputs,
                                       const at::Tensor& targets);

// The names a file's inputs and targets may have: 'x' / 'inputs' and 'y' / 'targets' / 'labels'.
inline constexpr const char* kInputNames[] = {"x", "inputs"};
inline constexpr const char* kTargetNames[] = {"y", "targets", "labels"};

// Reads one shard: a torch.save dict or a safetensors file (by its ".safetensors" name) holding
// inputs and targets under the names above. Errors name the file.
absl::StatusOr<Examples> ReadShard(const std::string& path);

// "shards:DIR": every *.pt, *.pth and *.safetensors file in DIR (not its subdirectories), or
// "shards:GLOB" (a pattern such as /data/train-*.safetensors), in name order; the data set is
// their examples one after another. Every shard is read once at open to check it agrees with the
// first (example shape, input dtype, kind of targets) and to count its examples; training then
// reads them through a cache of two, so at most two shards' tensors are resident: the one the
// last Get read and, after Prefetch, the next one, loading in the background. (Call Prefetch
// after the Get it follows: it evicts the shard used least recently.) A shard that changes
// under a run (another number of examples, another shape) fails the batch that reads it, naming
// the file.
class ShardedDataset final : public Dataset {
 public:
  struct Shard {
    std::string path;
    int64_t begin = 0;  // index of its first example in the data set.
    int64_t size = 0;
  };

  // INVALID_ARGUMENT for an empty directory or pattern, a shard without inputs or targets, or
  // shards that disagree (naming both files); NOT_FOUND for a missing directory; the readers'
  // errors for a malformed shard.
  static absl::StatusOr<std::unique_ptr<ShardedDataset>> Open(const std::string& location);

  int64_t size() const override { return size_; }
  // Gathers the rows shard by shard, loading each shard the cache does not hold. Throws
  // c10::Error naming the file when a shard can no longer be read or changed since Open.
  Batch Get(const std::vector<int64_t>& indices) const override;
  std::vector<int64_t> example_shape() const override { return example_shape_; }
  InputKind input_kind() const override { return kind_; }
  int64_t num_classes() const override { return num_classes_; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string Describe() const override;
  std::vector<int64_t> shard_sizes() const override;
  void Prefetch(const std::vector<int64_t>& indices) const override;

  const std::vector<Shard>& shards() const { return shards_; }
  // For tests: shards read since Open (loads, prefetches included), and how many are resident.
  int64_t loads() const;
  int64_t resident() const;

 private:
  ShardedDataset() = default;

  // The shard holding example `index` (in [0, size())).
  size_t ShardOf(int64_t index) const;
  // The cache entry for `shard`, starting its load (and evicting the least recently used entry
  // to keep two) when it is absent. Called with mu_ held.
  std::shared_future<std::shared_ptr<const Examples>> Acquire(size_t shard) const;
  std::shared_ptr<const Examples> Load(size_t shard) const;

  std::string location_;
  std::vector<Shard> shards_;
  int64_t size_ = 0;
  std::vector<int64_t> example_shape_;
  std::vector<int64_t> target_shape_;  // one example's target: {} for class ids.
  InputKind kind_ = InputKind::kFeatures;
  at::ScalarType target_type_ = at::kLong;
  int64_t num_classes_ = 0;
  int64_t vocab_size_ = 0;

  struct Resident {
    size_t shard;
    std::shared_future<std::shared_ptr<const Examples>> examples;
  };
  mutable std::mutex mu_;
  mutable std::list<Resident> cache_;  // most recently used first; at most kResidentShards.
  mutable int64_t loads_ = 0;
};

// Shards resident at once per data set (and so per rank): the one serving batches and the next.
inline constexpr size_t kResidentShards = 2;

}  // namespace ckpt::train::internal

#endif  // CKPT_LIBS_TRAIN_SHARD_DATASET_H_
