#ifndef CKPT_LIBS_TRAIN_DATASET_H_
#define CKPT_LIBS_TRAIN_DATASET_H_

// Training data for the trainer: a deterministic synthetic task (the default, learnable in a
// few hundred steps so loss visibly falls), MNIST IDX files, a {'x': ..., 'y': ...} dict
// written by Python's torch.save, or a directory of such files (or safetensors files) read a
// shard at a time.
//
// Every Dataset is immutable once opened: Get() is const, deterministic and safe to call from
// several threads. The one-file sources hold their examples in memory (MNIST's 60000 images are
// 47 MB as uint8); shards keep at most two files resident.
//
// Example:
//   DataSpec spec;
//   spec.source = "mnist:/data/mnist";
//   ASSIGN_OR_RETURN(std::unique_ptr<Dataset> data, OpenDataset(spec));
//   Batch batch = data->Get({0, 1, 2, 3});  // inputs [4,1,28,28] float in [0,1], targets [4]

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"

namespace ckpt::train {

struct Batch {
  at::Tensor inputs;   // [N, example_shape...]: float32 features or int64 token ids.
  at::Tensor targets;  // int64 class ids [N], or float32 targets [N, ...] (mse, bce losses).
};

// Float features (images, vectors) versus int64 token ids (for the transformer).
enum class InputKind { kFeatures, kTokens };

struct DataSpec {
  // "synthetic" | "mnist:DIR" | "pt:FILE" | "shards:DIR" | "shards:GLOB".
  std::string source = "synthetic";
  // Synthetic data is generated in the form this model needs: mlp / cnn get float images
  // [1,12,12]; transformer gets int64 tokens [16] over a vocabulary of 32. Ignored by files.
  std::string model_kind = "mlp";
  // Number of synthetic examples; ignored by files.
  int64_t synthetic_examples = 4096;
  // Seed of the synthetic task (prototypes, noise, labels); ignored by files.
  uint64_t seed = 1234;
};

// Shape of the synthetic tasks (exposed so tests and docs agree with the generator).
inline constexpr int64_t kSyntheticClasses = 10;
inline constexpr int64_t kSyntheticImageSize = 12;  // images are [1, 12, 12]
inline constexpr int64_t kSyntheticSeqLen = 16;
inline constexpr int64_t kSyntheticVocab = 32;

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;

  // The examples at `indices`, stacked on a new leading dim, on the CPU. Each index must be in
  // [0, size()): an index out of range is a caller bug and aborts with a message.
  virtual Batch Get(const std::vector<int64_t>& indices) const = 0;

  // One input without the batch dim, e.g. {1,28,28} or {16}.
  virtual std::vector<int64_t> example_shape() const = 0;
  virtual InputKind input_kind() const = 0;
  virtual int64_t num_classes() const = 0;
  // Number of distinct token ids (max id + 1); kTokens only, 0 for features.
  virtual int64_t vocab_size() const { return 0; }
  // One line for logs: "synthetic: 4096 examples of [1,12,12], 10 classes".
  virtual std::string Describe() const = 0;

  // For data read in shards: the number of examples in each, in index order (the first shard
  // holds indices [0, sizes[0]), and so on), so a sampler can keep a rank's reads within one
  // shard at a time (DistributedSampler::set_block_sizes). Empty for data held in memory.
  virtual std::vector<int64_t> shard_sizes() const { return {}; }
  // A hint that `indices` come next: sharded data starts reading their shard in the background.
  // Never required for correctness; a no-op for data held in memory.
  virtual void Prefetch(const std::vector<int64_t>& indices) const {}
};

// Opens `spec.source`:
//   "synthetic"  generated from spec.seed for spec.model_kind ("mlp" | "cnn" | "transformer");
//   "mnist:DIR"  DIR/train-images-idx3-ubyte + DIR/train-labels-idx1-ubyte (or the
//                train-images.idx3-ubyte spelling), uncompressed; pixels scaled to [0,1],
//                inputs [1,28,28];
//   "pt:FILE"    a torch.save dict with tensor 'x' (floating: features, converted to float32;
//                integer: token ids) and 'y' (integer: class ids, one per row of x,
//                num_classes = max(y) + 1; floating: targets [N, ...] for mse or
//                bce_with_logits, converted to float32). 'inputs' and 'targets' / 'labels' are
//                accepted for 'x' and 'y';
//   "shards:DIR" every *.pt, *.pth and *.safetensors file in DIR in name order, each holding
//                x and y as above (safetensors: tensors of those names), agreeing in example
//                shape and dtypes; "shards:GLOB" the files a pattern matches. Read a shard at
//                a time (shard_dataset.h has the details).
// Errors: INVALID_ARGUMENT for an unknown source or model kind, a malformed file (bad IDX magic,
// trailing bytes, counts that differ between images and labels, a pt file without 'x' / 'y',
// lengths that differ, labels or token ids out of range, shards that disagree, an empty shard
// directory, each naming the file); DATA_LOSS for an IDX file shorter than
// its header says (truncated); NOT_FOUND for a missing directory or file; errors of the
// torch.save reader as it reports them.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const DataSpec& spec);

// A data set's indices split into a part to train on and a held-out part to evaluate on, each in
// ascending order.
struct DataSplit {
  std::vector<int64_t> train;
  std::vector<int64_t> held_out;
};

// Holds out round(size * fraction) examples (at least one when fraction > 0): the first ones of
// torch.randperm(size) drawn from a generator of its own seeded with `seed` (so the split
// consumes no global random state, and Python reproduces it with
// torch.randperm(size, generator=torch.Generator().manual_seed(seed))). fraction 0: every index
// trains, none is held out. INVALID_ARGUMENT unless 0 <= fraction < 1 and both parts of a split
// are non-empty.
absl::StatusOr<DataSplit> SplitHeldOut(int64_t size, double fraction, uint64_t seed);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_DATASET_H_
