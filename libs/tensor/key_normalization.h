#ifndef CKPT_LIBS_TENSOR_KEY_NORMALIZATION_H_
#define CKPT_LIBS_TENSOR_KEY_NORMALIZATION_H_

// Canonical state-dict keys: what a module's state_dict() gives when nothing wraps it.
//
// Wrappers rename every key of the model they wrap:
//   DataParallel / DistributedDataParallel   "module."                      (leading)
//   torch.compile (OptimizedModule)          "_orig_mod."                   (leading, or inside
//                                                                            keys when only a
//                                                                            submodule is compiled)
//   FSDP                                     "_fsdp_wrapped_module." and, in PyTorch 1.11-1.12,
//                                            "_fpw_module."                 (leading or inside)
//   activation checkpointing                 "_checkpoint_wrapped_module."  (leading or inside)
// and they nest ("module._orig_mod.").
//
// NormalizeKeys strips a leading wrapper segment only when *every* key has it (what PyTorch's
// consume_prefix_in_state_dict_if_present does), repeatedly, and removes the reserved segments
// "_orig_mod", "_fsdp_wrapped_module", "_fpw_module" and "_checkpoint_wrapped_module" wherever
// they name a submodule inside a key: PyTorch reserves those attribute names for its wrappers,
// and its own FSDP / checkpoint-wrapper state-dict hooks drop them the same way. "module" inside
// a key belongs to the model ("head.module.weight") and is never touched there.
//
// What was stripped is returned so the producer's keys can be re-created exactly
// (KeyNormalization::OriginalKey, KeyPolicy::Original()).

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/state_dict.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// What NormalizeKeys removed.
struct KeyNormalization {
  // Leading prefix every original key had, e.g. "module._orig_mod."; empty if none.
  std::string stripped_prefix;
  // Wrappers detected, in the order met (outermost first): "ddp", "compile", "fsdp", "checkpoint".
  std::vector<std::string> wrappers;
  // canonical -> original for keys that lost inner wrapper segments. Every other key's original
  // is stripped_prefix + canonical.
  std::map<std::string, std::string> inner_renames;

  bool changed_keys() const { return !stripped_prefix.empty() || !inner_renames.empty(); }

  // The producer's key for `canonical_key`.
  std::string OriginalKey(absl::string_view canonical_key) const;

  v1::KeyNormalization ToProto() const;
  static KeyNormalization FromProto(const v1::KeyNormalization& proto);

  friend bool operator==(const KeyNormalization& a, const KeyNormalization& b) {
    return a.stripped_prefix == b.stripped_prefix && a.wrappers == b.wrappers &&
           a.inner_renames == b.inner_renames;
  }
};

struct NormalizedKeys {
  std::vector<std::string> keys;  // canonical, one per input key, same order.
  KeyNormalization normalization;
};

// INVALID_ARGUMENT if two keys become the same canonical key (both named) or a key is empty.
// An empty input gives an empty result.
absl::StatusOr<NormalizedKeys> NormalizeKeys(const std::vector<std::string>& keys);

// The same state dict under canonical keys.
absl::StatusOr<std::pair<StateDict, KeyNormalization>> NormalizeStateDict(
    const StateDict& state_dict);

// `state_dict` with `prefix` removed from the front of every key. INVALID_ARGUMENT naming the
// first key that does not start with it (or is nothing but the prefix).
absl::StatusOr<StateDict> StripExactPrefix(const StateDict& state_dict, absl::string_view prefix);

// How a consumer wants its keys.
class KeyPolicy {
 public:
  enum class Kind { kCanonical, kAddPrefix, kOriginal };

  // Canonical keys, no wrapper prefix: what an unwrapped module's load_state_dict expects.
  static KeyPolicy Canonical() { return KeyPolicy(Kind::kCanonical, ""); }
  // `prefix` + canonical key; "module." suits a DDP / DataParallel consumer. A prefix without
  // a trailing '.' gets one ("module" -> "module.").
  static KeyPolicy AddPrefix(absl::string_view prefix);
  // Exactly the producer's keys (re-applies what normalization stripped).
  static KeyPolicy Original() { return KeyPolicy(Kind::kOriginal, ""); }

  Kind kind() const { return kind_; }
  const std::string& prefix() const { return prefix_; }

 private:
  KeyPolicy(Kind kind, std::string prefix) : kind_(kind), prefix_(std::move(prefix)) {}
  Kind kind_;
  std::string prefix_;
};

// The key a consumer under `policy` sees for `canonical_key`.
std::string ApplyKeyPolicy(absl::string_view canonical_key, const KeyPolicy& policy,
                           const KeyNormalization& normalization);

// For a whole list; INVALID_ARGUMENT if the policy maps two keys to one (cannot happen for the
// built-in policies on keys that came out of NormalizeKeys).
absl::StatusOr<std::vector<std::string>> ApplyKeyPolicy(
    const std::vector<std::string>& canonical_keys, const KeyPolicy& policy,
    const KeyNormalization& normalization);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_KEY_NORMALIZATION_H_
