#include "libs/train/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/multinomial.h"
#include "ATen/ops/randint.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/randperm.h"
#include "ATen/ops/softmax.h"
#include "ATen/ops/tensor.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/train/shard_dataset.h"

namespace ckpt::train {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// All examples in memory as one tensor per field; Get() gathers rows.
class InMemoryDataset final : public Dataset {
 public:
  struct Parts {
    std::string name;    // "synthetic", "mnist:DIR", "pt:FILE": the start of Describe().
    at::Tensor inputs;   // [N, example...]; uint8 when `bytes_to_unit` is set.
    at::Tensor targets;  // int64 [N].
    InputKind kind = InputKind::kFeatures;
    int64_t num_classes = 0;
    int64_t vocab_size = 0;
    // MNIST pixels stay uint8 in memory (4x smaller) and become float in [0,1] per batch.
    bool bytes_to_unit = false;
  };

  explicit InMemoryDataset(Parts parts) : parts_(std::move(parts)) {}

  int64_t size() const override { return parts_.targets.size(0); }

  Batch Get(const std::vector<int64_t>& indices) const override {
    const int64_t n = size();
    for (int64_t index : indices) {
      if (index < 0 || index >= n) {
        // A sampler bug, not bad input: the trainer only draws indices from [0, size()).
        std::fprintf(stderr, "Dataset::Get: index %lld out of range [0, %lld) in %s\n",
                     static_cast<long long>(index), static_cast<long long>(n), parts_.name.c_str());
        std::abort();
      }
    }
    at::Tensor rows = at::tensor(at::ArrayRef<int64_t>(indices), at::kLong);
    Batch batch;
    batch.inputs = parts_.inputs.index_select(0, rows);
    if (parts_.bytes_to_unit) batch.inputs = batch.inputs.to(at::kFloat).div_(255.0);
    batch.targets = parts_.targets.index_select(0, rows);
    return batch;
  }

  std::vector<int64_t> example_shape() const override {
    at::IntArrayRef sizes = parts_.inputs.sizes();
    return std::vector<int64_t>(sizes.begin() + 1, sizes.end());
  }
  InputKind input_kind() const override { return parts_.kind; }
  int64_t num_classes() const override { return parts_.num_classes; }
  int64_t vocab_size() const override { return parts_.vocab_size; }

  std::string Describe() const override {
    std::string out = absl::StrCat(parts_.name, ": ", size(), " examples of ",
                                   ShapeString(example_shape()), ", ");
    if (parts_.targets.scalar_type() == at::kLong) {
      absl::StrAppend(&out, parts_.num_classes, " classes");
    } else {
      at::IntArrayRef target_shape = parts_.targets.sizes().slice(1);
      absl::StrAppend(&out, "float targets ", ShapeString(target_shape.vec()));
    }
    if (parts_.kind == InputKind::kTokens) absl::StrAppend(&out, ", vocab ", parts_.vocab_size);
    return out;
  }

 private:
  Parts parts_;
};

// --- synthetic ---------------------------------------------------------------------------------

// Images: one fixed random prototype per class plus unit Gaussian noise (per-pixel SNR 1, so a
// single example is noisy but 144 pixels make the class recoverable: a linear model learns it).
// Tokens: each class has its own random distribution over the vocabulary; a sequence is 16
// draws from it, so the class shows in token frequencies (what mean-pooled attention sees).
absl::StatusOr<std::unique_ptr<Dataset>> OpenSynthetic(const DataSpec& spec) {
  if (spec.synthetic_examples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic_examples must be positive, got ", spec.synthetic_examples));
  }
  const bool tokens = spec.model_kind == "transformer";
  if (!tokens && spec.model_kind != "mlp" && spec.model_kind != "cnn") {
    return absl::InvalidArgumentError(absl::StrCat("synthetic data: unknown model kind '",
                                                   spec.model_kind,
                                                   "' (expected mlp, cnn or transformer)"));
  }
  {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed);
    const int64_t n = spec.synthetic_examples;
    InMemoryDataset::Parts parts;
    parts.name = "synthetic";
    parts.num_classes = kSyntheticClasses;
    if (tokens) {
      at::Tensor logits = at::randn({kSyntheticClasses, kSyntheticVocab}, gen) * 2.0;
      at::Tensor probs = at::softmax(logits, /*dim=*/1);
      parts.targets = at::randint(kSyntheticClasses, {n}, gen, at::kLong);
      parts.inputs = at::multinomial(probs.index_select(0, parts.targets), kSyntheticSeqLen,
                                     /*replacement=*/true, gen);
      parts.kind = InputKind::kTokens;
      parts.vocab_size = kSyntheticVocab;
    } else {
      at::Tensor prototypes =
          at::randn({kSyntheticClasses, 1, kSyntheticImageSize, kSyntheticImageSize}, gen);
      parts.targets = at::randint(kSyntheticClasses, {n}, gen, at::kLong);
      at::Tensor noise = at::randn({n, 1, kSyntheticImageSize, kSyntheticImageSize}, gen);
      parts.inputs = prototypes.index_select(0, parts.targets) + noise;
      parts.kind = InputKind::kFeatures;
    }
    return std::unique_ptr<Dataset>(std::make_unique<InMemoryDataset>(std::move(parts)));
  }
}

// --- MNIST IDX ---------------------------------------------------------------------------------

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path.string()));
  return std::move(bytes).str();
}

uint32_t BigEndian32(const std::string& bytes, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The first of `names` that exists in `dir`. NOT_FOUND listing them otherwise, and pointing at
// a '.gz' copy when there is one (we read uncompressed IDX only).
absl::StatusOr<std::filesystem::path> FindIdxFile(const std::filesystem::path& dir,
                                                  const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (std::filesystem::is_regular_file(dir / name)) return dir / name;
  }
  for (const std::string& name : names) {
    if (std::filesystem::exists(dir / (name + ".gz"))) {
      return absl::NotFoundError(absl::StrCat("mnist: found ", (dir / name).string(),
                                              ".gz but IDX files must be uncompressed: gunzip it"));
    }
  }
  return absl::NotFoundError(
      absl::StrCat("mnist: none of ", absl::StrJoin(names, ", "), " in ", dir.string()));
}

// Checks the IDX header of `bytes` (magic `magic`, `dims` big-endian sizes after it) and that
// the file holds exactly the data they promise. Returns the sizes.
absl::StatusOr<std::vector<int64_t>> ParseIdxHeader(const std::string& bytes, uint32_t magic,
                                                    int dims, const std::string& path) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (bytes.size() < header) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size(), " bytes, shorter than the ",
                                            header, "-byte IDX header (truncated?)"));
  }
  const uint32_t found = BigEndian32(bytes, 0);
  if (found != magic) {
    char expected_hex[16], found_hex[16];
    std::snprintf(expected_hex, sizeof(expected_hex), "0x%08x", magic);
    std::snprintf(found_hex, sizeof(found_hex), "0x%08x", found);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad IDX magic ", found_hex, ", expected ", expected_hex));
  }
  std::vector<int64_t> sizes;
  uint64_t payload = 1;
  for (int i = 0; i < dims; ++i) {
    sizes.push_back(BigEndian32(bytes, 4 + 4 * i));
    payload *= static_cast<uint64_t>(sizes.back());
  }
  if (bytes.size() - header < payload) {
    return absl::DataLossError(absl::StrCat(path, ": header says ", ShapeString(sizes), " (",
                                            payload, " bytes of data) but the file has ",
                                            bytes.size() - header, " (truncated?)"));
  }
  if (bytes.size() - header > payload) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header says ", ShapeString(sizes), " (",
                                                   payload, " bytes of data) but the file has ",
                                                   bytes.size() - header));
  }
  return sizes;
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenMnist(const std::string& dir_name) {
  const std::filesystem::path dir(dir_name);
  if (!std::filesystem::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("mnist: directory ", dir_name, " does not exist"));
  }
  ASSIGN_OR_RETURN(std::filesystem::path images_path,
                   FindIdxFile(dir, {"train-images-idx3-ubyte", "train-images.idx3-ubyte"}));
  ASSIGN_OR_RETURN(std::filesystem::path labels_path,
                   FindIdxFile(dir, {"train-labels-idx1-ubyte", "train-labels.idx1-ubyte"}));
  ASSIGN_OR_RETURN(std::string images, ReadWholeFile(images_path));
  ASSIGN_OR_RETURN(std::string labels, ReadWholeFile(labels_path));
  ASSIGN_OR_RETURN(std::vector<int64_t> image_sizes,
                   ParseIdxHeader(images, 0x00000803, 3, images_path.string()));
  ASSIGN_OR_RETURN(std::vector<int64_t> label_sizes,
                   ParseIdxHeader(labels, 0x00000801, 1, labels_path.string()));
  const int64_t n = image_sizes[0];
  if (label_sizes[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat("mnist: ", images_path.string(), " has ", n,
                                                   " images but ", labels_path.string(), " has ",
                                                   label_sizes[0], " labels"));
  }
  if (n == 0)
    return absl::InvalidArgumentError(absl::StrCat("mnist: ", dir_name, " holds no images"));
  const char* label_bytes = labels.data() + 8;
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<unsigned char>(label_bytes[i]);
    if (label > 9) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path.string(), ": label ", label,
                                                     " at index ", i, " is out of range [0, 9]"));
    }
  }
  {
    InMemoryDataset::Parts parts;
    parts.name = absl::StrCat("mnist:", dir_name);
    parts.inputs = at::empty({n, 1, image_sizes[1], image_sizes[2]}, at::kByte);
    std::memcpy(parts.inputs.data_ptr(), images.data() + 16, images.size() - 16);
    parts.targets = at::empty({n}, at::kByte);
    std::memcpy(parts.targets.data_ptr(), label_bytes, n);
    parts.targets = parts.targets.to(at::kLong);
    parts.kind = InputKind::kFeatures;
    parts.num_classes = 10;
    parts.bytes_to_unit = true;
    return std::unique_ptr<Dataset>(std::make_unique<InMemoryDataset>(std::move(parts)));
  }
}

// --- torch.save {'x': ..., 'y': ...} -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<Dataset>> OpenPt(const std::string& path) {
  // The reader's own errors (e.g. NOT_FOUND for the path) already name the file.
  ASSIGN_OR_RETURN(internal::Examples examples, internal::ReadShard(path));
  InMemoryDataset::Parts parts;
  parts.name = absl::StrCat("pt:", path);
  parts.inputs = std::move(examples.inputs);
  parts.targets = std::move(examples.targets);
  parts.kind = examples.kind;
  parts.num_classes = examples.num_classes;
  parts.vocab_size = examples.vocab_size;
  return std::unique_ptr<Dataset>(std::make_unique<InMemoryDataset>(std::move(parts)));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDatasetOrThrow(const DataSpec& spec) {
  const std::string& source = spec.source;
  if (source == "synthetic") return OpenSynthetic(spec);
  if (absl::StartsWith(source, "mnist:") && source.size() > 6) return OpenMnist(source.substr(6));
  if (absl::StartsWith(source, "pt:") && source.size() > 3) return OpenPt(source.substr(3));
  if (absl::StartsWith(source, "shards:") && source.size() > 7) {
    ASSIGN_OR_RETURN(std::unique_ptr<internal::ShardedDataset> shards,
                     internal::ShardedDataset::Open(source.substr(7)));
    return std::unique_ptr<Dataset>(std::move(shards));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data source '", source,
                   "' (expected synthetic, mnist:DIR, pt:FILE, shards:DIR or shards:GLOB)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const DataSpec& spec) {
  // LibTorch throws (allocation, a dtype conversion it refuses); no exception leaves here.
  try {
    return OpenDatasetOrThrow(spec);
  } catch (...) {
    return StatusFromCurrentException();
  }
}

absl::StatusOr<DataSplit> SplitHeldOut(int64_t size, double fraction, uint64_t seed) {
  if (!(fraction >= 0 && fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_fraction must be in [0, 1), not ", fraction));
  }
  DataSplit split;
  if (fraction == 0) {
    split.train.resize(size);
    for (int64_t i = 0; i < size; ++i) split.train[i] = i;
    return split;
  }
  const int64_t held_out = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(static_cast<double>(size) * fraction)));
  if (held_out >= size) {
    return absl::InvalidArgumentError(absl::StrCat("eval_fraction ", fraction, " of ", size,
                                                   " examples leaves none to train on"));
  }
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const at::Tensor order = at::randperm(size, generator, at::kLong);
  const int64_t* indices = order.data_ptr<int64_t>();
  split.held_out.assign(indices, indices + held_out);
  split.train.assign(indices + held_out, indices + size);
  std::sort(split.held_out.begin(), split.held_out.end());
  std::sort(split.train.begin(), split.train.end());
  return split;
}

}  // namespace ckpt::train
