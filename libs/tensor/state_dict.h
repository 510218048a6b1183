#ifndef CKPT_LIBS_TENSOR_STATE_DICT_H_
#define CKPT_LIBS_TENSOR_STATE_DICT_H_

// StateDict: a model's named tensors in insertion order, as Python's OrderedDict state_dict is.
// Keys are unique. Holds at::Tensor handles: tensors that share storage in the source (tied
// weights) keep sharing it here. Not thread-safe for concurrent mutation.
//
// Example:
//   StateDict weights;
//   RETURN_IF_ERROR(weights.Insert("fc.weight", at::zeros({10, 512})));
//   if (const at::Tensor* w = weights.Find("fc.weight")) { ... }
//   for (const StateDict::Entry& entry : weights) { use(entry.key, entry.tensor); }

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

class StateDict {
 public:
  struct Entry {
    std::string key;
    at::Tensor tensor;
    // Where the producer had the tensor ("cuda:1", "mps"); empty if unknown. Informational:
    // the tensor itself is wherever `tensor` is (the readers put everything on the CPU).
    std::string original_device;
  };
  using const_iterator = std::vector<Entry>::const_iterator;

  StateDict() = default;

  // Appends `key`. ALREADY_EXISTS if the key is present; INVALID_ARGUMENT for an empty key or an
  // undefined tensor.
  absl::Status Insert(std::string key, at::Tensor tensor, std::string original_device = {});

  // Replaces the tensor of an existing key in place, or appends a new key.
  void InsertOrAssign(std::string key, at::Tensor tensor, std::string original_device = {});

  // nullptr when absent.
  const at::Tensor* Find(absl::string_view key) const;
  bool contains(absl::string_view key) const { return Find(key) != nullptr; }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }
  const Entry& entry(size_t index) const { return entries_[index]; }

  std::vector<std::string> keys() const;

  // Sum of numel * element size over all tensors (shared storage counted once per tensor).
  int64_t TotalBytes() const;

  // Same tensors (and original devices), in the same order, under `new_keys` (one per entry).
  // INVALID_ARGUMENT if the count differs or two new keys are equal.
  absl::StatusOr<StateDict> WithKeys(const std::vector<std::string>& new_keys) const;

 private:
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_STATE_DICT_H_
