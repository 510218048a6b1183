#include "libs/tensor/state_dict.h"

#include "absl/strings/str_cat.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {

absl::Status StateDict::Insert(std::string key, at::Tensor tensor, std::string original_device) {
  if (key.empty()) return absl::InvalidArgumentError("state dict key must not be empty");
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("state dict entry '", key, "' has no tensor"));
  }
  if (index_.contains(key)) {
    return absl::AlreadyExistsError(absl::StrCat("duplicate state dict key '", key, "'"));
  }
  index_.emplace(key, entries_.size());
  entries_.push_back(Entry{std::move(key), std::move(tensor), std::move(original_device)});
  return absl::OkStatus();
}

void StateDict::InsertOrAssign(std::string key, at::Tensor tensor, std::string original_device) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_[it->second].tensor = std::move(tensor);
    entries_[it->second].original_device = std::move(original_device);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.push_back(Entry{std::move(key), std::move(tensor), std::move(original_device)});
}

const at::Tensor* StateDict::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].tensor;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> keys;
  keys.reserve(entries_.size());
  for (const Entry& entry : entries_) keys.push_back(entry.key);
  return keys;
}

int64_t StateDict::TotalBytes() const {
  int64_t total = 0;
  for (const Entry& entry : entries_) total += StoredByteCount(entry.tensor);
  return total;
}

absl::StatusOr<StateDict> StateDict::WithKeys(const std::vector<std::string>& new_keys) const {
  if (new_keys.size() != entries_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WithKeys got ", new_keys.size(),
                                                   " keys for a state dict of ", entries_.size()));
  }
  StateDict renamed;
  for (size_t i = 0; i < entries_.size(); ++i) {
    absl::Status inserted =
        renamed.Insert(new_keys[i], entries_[i].tensor, entries_[i].original_device);
    if (!inserted.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("renaming '", entries_[i].key, "' to '",
                                                     new_keys[i], "': ", inserted.message()));
    }
  }
  return renamed;
}

}  // namespace ckpt
