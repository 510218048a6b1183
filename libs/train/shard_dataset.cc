#include "libs/train/shard_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/tensor.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_reader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/value.h"

namespace ckpt::train::internal {
namespace {

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

bool IsIntegral(at::ScalarType type) { return at::isIntegralType(type, /*includeBool=*/false); }

bool IsShardFile(const std::filesystem::path& path) {
  const std::string extension = path.extension().string();
  return extension == ".pt" || extension == ".pth" || extension == ".safetensors";
}

// The files `location` names: a directory's shard files, or a glob's matches, sorted by name.
absl::StatusOr<std::vector<std::string>> ListShards(const std::string& location) {
  std::vector<std::string> paths;
  std::error_code error;
  if (std::filesystem::is_directory(location, error)) {
    for (const auto& entry : std::filesystem::directory_iterator(location, error)) {
      if (entry.is_regular_file(error) && IsShardFile(entry.path())) {
        paths.push_back(entry.path().string());
      }
    }
    if (error) {
      return absl::PermissionDeniedError(
          absl::StrCat("shards:", location, ": cannot list the directory: ", error.message()));
    }
    if (paths.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shards:", location, ": the directory holds no .pt, .pth or .safetensors files"));
    }
  } else if (location.find_first_of("*?[") != std::string::npos) {
    glob_t matches{};
    const int result = glob(location.c_str(), 0, nullptr, &matches);
    for (size_t i = 0; result == 0 && i < matches.gl_pathc; ++i) {
      if (std::filesystem::is_regular_file(matches.gl_pathv[i], error)) {
        paths.push_back(matches.gl_pathv[i]);
      }
    }
    globfree(&matches);
    if (paths.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards:", location, ": the pattern matches no files"));
    }
  } else if (std::filesystem::exists(location, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shards:", location,
                     " is a file: shards: takes a directory or a pattern (for one file, use "
                     "pt:FILE)"));
  } else {
    return absl::NotFoundError(absl::StrCat("shards:", location, ": no such directory"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

absl::StatusOr<Examples> CheckExamplesOrThrow(const std::string& name, const at::Tensor& inputs,
                                              const at::Tensor& targets) {
  if (inputs.dim() < 1 || inputs.size(0) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the inputs have shape ",
                                                   ShapeString(inputs.sizes()),
                                                   "; expected [N, ...] with N > 0"));
  }
  if (targets.dim() < 1 || targets.size(0) != inputs.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": 'x' has ", inputs.size(0), " rows but 'y' has ",
        targets.dim() < 1 ? std::string("none (a scalar)") : absl::StrCat(targets.size(0)),
        targets.dim() == 1 ? " labels" : " rows"));
  }
  // Converting makes each tensor contiguous: one whose shape claims more bytes than its storage
  // holds (an expanded or overlapping view, e.g. torch.zeros(1).expand(10**12)) would be
  // materialized at its claimed size. Data files hold plain tensors; refuse such a view.
  for (const auto& [role, tensor] : {std::pair{"x", &inputs}, std::pair{"y", &targets}}) {
    const uint64_t claimed =
        static_cast<uint64_t>(tensor->numel()) * static_cast<uint64_t>(tensor->element_size());
    const uint64_t stored = tensor->storage().nbytes();
    if (claimed > stored) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": '", role, "' ", ShapeString(tensor->sizes()), " claims ", claimed,
                       " bytes from a storage of ", stored,
                       " (an expanded or overlapping view); save ", role, ".contiguous() instead"));
    }
  }
  Examples examples;
  if (IsIntegral(targets.scalar_type())) {
    if (targets.dim() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": integer targets are class ids and must be 1-D [N], found ",
                       ShapeString(targets.sizes()), " (store multi-label targets as floats)"));
    }
    examples.targets = targets.to(at::kLong).contiguous();
    const int64_t min_label = examples.targets.min().item<int64_t>();
    if (min_label < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": 'y' holds label ", min_label, "; class ids must be >= 0"));
    }
    examples.num_classes = examples.targets.max().item<int64_t>() + 1;
  } else if (at::isFloatingType(targets.scalar_type())) {
    examples.targets = targets.to(at::kFloat).contiguous();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": 'y' has dtype ", at::toString(targets.scalar_type()),
                     "; expected integer class ids or floating-point targets"));
  }
  if (at::isFloatingType(inputs.scalar_type())) {
    examples.inputs = inputs.to(at::kFloat).contiguous();
    examples.kind = InputKind::kFeatures;
  } else if (IsIntegral(inputs.scalar_type())) {
    examples.inputs = inputs.to(at::kLong).contiguous();
    examples.kind = InputKind::kTokens;
    const int64_t min_token = examples.inputs.min().item<int64_t>();
    if (min_token < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": 'x' holds token id ", min_token, "; token ids must be >= 0"));
    }
    examples.vocab_size = examples.inputs.max().item<int64_t>() + 1;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": 'x' has dtype ", at::toString(inputs.scalar_type()),
                     "; expected a floating dtype (features) or an integer dtype (token ids)"));
  }
  return examples;
}

}  // namespace

absl::StatusOr<Examples> CheckExamples(const std::string& name, const at::Tensor& inputs,
                                       const at::Tensor& targets) {
  // LibTorch may throw converting the tensors (e.g. out of memory); no exception leaves here.
  try {
    return CheckExamplesOrThrow(name, inputs, targets);
  } catch (...) {
    return StatusFromCurrentException();
  }
}

absl::StatusOr<Examples> ReadShard(const std::string& path) {
  // Found tensors by role; `find` maps a name to a tensor or nullptr.
  auto pick = [&](const auto& names, auto find, const char* role,
                  const std::string& found_keys) -> absl::StatusOr<at::Tensor> {
    for (const char* name : names) {
      ASSIGN_OR_RETURN(const at::Tensor* tensor, find(name));
      if (tensor != nullptr) return tensor->detach();
    }
    std::vector<std::string> quoted;
    for (const char* name : names) quoted.push_back(absl::StrCat("'", name, "'"));
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no ", role, " (a tensor named ", absl::StrJoin(quoted, " or "),
                     "); it holds ", found_keys.empty() ? std::string("nothing") : found_keys));
  };
  at::Tensor inputs, targets;
  if (absl::EndsWith(path, ".safetensors")) {
    ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensorsFile(path));
    const std::string keys = absl::StrJoin(file.tensors.keys(), ", ");
    auto find = [&](const char* name) -> absl::StatusOr<const at::Tensor*> {
      return file.tensors.Find(name);
    };
    ASSIGN_OR_RETURN(inputs, pick(kInputNames, find, "inputs", keys));
    ASSIGN_OR_RETURN(targets, pick(kTargetNames, find, "targets", keys));
  } else {
    ASSIGN_OR_RETURN(TorchFile file, ReadTorchFile(path));
    if (!file.root.is_dict()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": expected a dict {'x': inputs, 'y': targets}, found ",
                       file.root.DebugString().substr(0, 80)));
    }
    std::vector<std::string> names;
    for (const auto& entry : file.root.entries()) {
      names.push_back(entry.first.is_int() ? absl::StrCat(entry.first.int_key())
                                           : absl::StrCat("'", entry.first.string_key(), "'"));
    }
    const std::string keys = absl::StrJoin(names, ", ");
    auto find = [&](const char* name) -> absl::StatusOr<const at::Tensor*> {
      const Value* value = file.root.Find(std::string(name));
      if (value == nullptr) return nullptr;
      if (!value->is_tensor()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": '", name, "' is not a tensor"));
      }
      return &value->tensor();
    };
    ASSIGN_OR_RETURN(inputs, pick(kInputNames, find, "inputs", keys));
    ASSIGN_OR_RETURN(targets, pick(kTargetNames, find, "targets", keys));
  }
  return CheckExamples(path, inputs, targets);
}

// --- ShardedDataset ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShardedDataset>> ShardedDataset::Open(const std::string& location) {
  ASSIGN_OR_RETURN(std::vector<std::string> paths, ListShards(location));
  std::unique_ptr<ShardedDataset> data(new ShardedDataset());
  data->location_ = location;
  std::string first_path;
  at::ScalarType first_input_type = at::kFloat;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(Examples examples, ReadShard(path));
    const std::vector<int64_t> shape(examples.inputs.sizes().begin() + 1,
                                     examples.inputs.sizes().end());
    const std::vector<int64_t> target_shape(examples.targets.sizes().begin() + 1,
                                            examples.targets.sizes().end());
    if (first_path.empty()) {
      first_path = path;
      data->example_shape_ = shape;
      data->target_shape_ = target_shape;
      data->kind_ = examples.kind;
      data->target_type_ = examples.targets.scalar_type();
      first_input_type = examples.inputs.scalar_type();
    } else {
      auto describe = [](const std::vector<int64_t>& input, at::ScalarType input_type,
                         const std::vector<int64_t>& target, at::ScalarType target_type) {
        return absl::StrCat("inputs ", ShapeString(input), " ", at::toString(input_type),
                            " and targets ", ShapeString(target), " ", at::toString(target_type));
      };
      if (shape != data->example_shape_ || examples.inputs.scalar_type() != first_input_type ||
          target_shape != data->target_shape_ ||
          examples.targets.scalar_type() != data->target_type_) {
        return absl::InvalidArgumentError(
            absl::StrCat("shards:", location, ": ", path, " has examples of ",
                         describe(shape, examples.inputs.scalar_type(), target_shape,
                                  examples.targets.scalar_type()),
                         " but ", first_path, " has ",
                         describe(data->example_shape_, first_input_type, data->target_shape_,
                                  data->target_type_),
                         " (as read: floating inputs become float32, integer ones int64)"));
      }
    }
    data->num_classes_ = std::max(data->num_classes_, examples.num_classes);
    data->vocab_size_ = std::max(data->vocab_size_, examples.vocab_size);
    data->shards_.push_back(Shard{path, data->size_, examples.inputs.size(0)});
    data->size_ += examples.inputs.size(0);
  }
  return data;
}

std::string ShardedDataset::Describe() const {
  std::string out = absl::StrCat("shards:", location_, ": ", shards_.size(), " file(s), ", size_,
                                 " examples of ", ShapeString(example_shape_), ", ");
  if (target_type_ == at::kLong) {
    absl::StrAppend(&out, num_classes_, " classes");
  } else {
    absl::StrAppend(&out, "float targets ", ShapeString(target_shape_));
  }
  if (kind_ == InputKind::kTokens) absl::StrAppend(&out, ", vocab ", vocab_size_);
  return out;
}

std::vector<int64_t> ShardedDataset::shard_sizes() const {
  std::vector<int64_t> sizes;
  for (const Shard& shard : shards_) sizes.push_back(shard.size);
  return sizes;
}

size_t ShardedDataset::ShardOf(int64_t index) const {
  // The last shard whose first example is at or before `index`.
  auto after = std::upper_bound(shards_.begin(), shards_.end(), index,
                                [](int64_t i, const Shard& shard) { return i < shard.begin; });
  return static_cast<size_t>(std::distance(shards_.begin(), after) - 1);
}

std::shared_ptr<const Examples> ShardedDataset::Load(size_t shard) const {
  const Shard& expected = shards_[shard];
  absl::StatusOr<Examples> examples = ReadShard(expected.path);
  if (!examples.ok()) ThrowAsC10Error(examples.status());
  const std::vector<int64_t> shape(examples->inputs.sizes().begin() + 1,
                                   examples->inputs.sizes().end());
  if (examples->inputs.size(0) != expected.size || shape != example_shape_ ||
      examples->targets.scalar_type() != target_type_) {
    ThrowAsC10Error(absl::FailedPreconditionError(
        absl::StrCat(expected.path, " changed since the run started: it held ", expected.size,
                     " examples of ", ShapeString(example_shape_), " and now holds ",
                     examples->inputs.size(0), " of ", ShapeString(shape))));
  }
  return std::make_shared<const Examples>(*std::move(examples));
}

std::shared_future<std::shared_ptr<const Examples>> ShardedDataset::Acquire(size_t shard) const {
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->shard == shard) {
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front().examples;
    }
  }
  while (cache_.size() >= kResidentShards) cache_.pop_back();
  ++loads_;
  cache_.push_front(Resident{
      shard, std::async(std::launch::async, [this, shard] { return Load(shard); }).share()});
  return cache_.front().examples;
}

Batch ShardedDataset::Get(const std::vector<int64_t>& indices) const {
  for (int64_t index : indices) {
    if (index < 0 || index >= size_) {
      std::fprintf(stderr, "Dataset::Get: index %lld out of range [0, %lld) in shards:%s\n",
                   static_cast<long long>(index), static_cast<long long>(size_), location_.c_str());
      std::abort();
    }
  }
  // Runs of consecutive indices in the same shard (a batch is one run, or two at a shard's
  // end): each run's rows are copied out before the next shard is acquired, so a batch never
  // needs more than the cache holds.
  std::vector<at::Tensor> inputs, targets;
  for (size_t begin = 0; begin < indices.size();) {
    const size_t shard = ShardOf(indices[begin]);
    const int64_t first = shards_[shard].begin;
    const int64_t last = first + shards_[shard].size;
    size_t end = begin;
    std::vector<int64_t> rows;
    while (end < indices.size() && indices[end] >= first && indices[end] < last) {
      rows.push_back(indices[end++] - first);
    }
    std::shared_future<std::shared_ptr<const Examples>> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending = Acquire(shard);
    }
    const std::shared_ptr<const Examples> examples = pending.get();  // rethrows a failed load.
    const at::Tensor selected = at::tensor(at::ArrayRef<int64_t>(rows), at::kLong);
    inputs.push_back(examples->inputs.index_select(0, selected));
    targets.push_back(examples->targets.index_select(0, selected));
    begin = end;
  }
  Batch batch;
  batch.inputs = inputs.size() == 1 ? inputs[0] : at::cat(inputs);
  batch.targets = targets.size() == 1 ? targets[0] : at::cat(targets);
  return batch;
}

void ShardedDataset::Prefetch(const std::vector<int64_t>& indices) const {
  if (indices.empty()) return;
  // The shard the upcoming indices start in; the current one stays (it is the most recent).
  std::lock_guard<std::mutex> lock(mu_);
  Acquire(ShardOf(indices.front()));
}

int64_t ShardedDataset::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

int64_t ShardedDataset::resident() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(cache_.size());
}

}  // namespace ckpt::train::internal
