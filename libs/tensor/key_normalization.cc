#include "libs/tensor/key_normalization.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ckpt {
namespace {

struct WrapperSegment {
  absl::string_view segment;
  absl::string_view wrapper;
  bool may_occur_inside;  // Reserved by PyTorch, so it cannot be a name of the user's model.
};

constexpr WrapperSegment kWrapperSegments[] = {
    {"module", "ddp", false},
    {"_orig_mod", "compile", true},
    {"_fsdp_wrapped_module", "fsdp", true},
    {"_fpw_module", "fsdp", true},
    {"_checkpoint_wrapped_module", "checkpoint", true},
};

const WrapperSegment* FindWrapperSegment(absl::string_view segment) {
  for (const WrapperSegment& wrapper : kWrapperSegments) {
    if (wrapper.segment == segment) return &wrapper;
  }
  return nullptr;
}

void NoteWrapper(absl::string_view wrapper, std::vector<std::string>& wrappers) {
  if (std::find(wrappers.begin(), wrappers.end(), wrapper) == wrappers.end()) {
    wrappers.emplace_back(wrapper);
  }
}

// The first dot-separated segment of `key` if more segments follow, else empty.
absl::string_view LeadingModuleSegment(absl::string_view key) {
  const size_t dot = key.find('.');
  if (dot == absl::string_view::npos || dot + 1 == key.size()) return {};
  return key.substr(0, dot);
}

}  // namespace

std::string KeyNormalization::OriginalKey(absl::string_view canonical_key) const {
  if (auto it = inner_renames.find(std::string(canonical_key)); it != inner_renames.end()) {
    return it->second;
  }
  return absl::StrCat(stripped_prefix, canonical_key);
}

v1::KeyNormalization KeyNormalization::ToProto() const {
  v1::KeyNormalization proto;
  proto.set_stripped_prefix(stripped_prefix);
  for (const std::string& wrapper : wrappers) proto.add_wrappers(wrapper);
  for (const auto& [canonical, original] : inner_renames) {
    (*proto.mutable_inner_renames())[canonical] = original;
  }
  return proto;
}

KeyNormalization KeyNormalization::FromProto(const v1::KeyNormalization& proto) {
  KeyNormalization normalization;
  normalization.stripped_prefix = proto.stripped_prefix();
  normalization.wrappers.assign(proto.wrappers().begin(), proto.wrappers().end());
  normalization.inner_renames.insert(proto.inner_renames().begin(), proto.inner_renames().end());
  return normalization;
}

absl::StatusOr<NormalizedKeys> NormalizeKeys(const std::vector<std::string>& keys) {
  NormalizedKeys result;
  if (keys.empty()) return result;
  for (const std::string& key : keys) {
    if (key.empty()) return absl::InvalidArgumentError("state dict has an empty key");
  }

  // Leading wrappers: strip while every key shares the same wrapper segment.
  KeyNormalization& normalization = result.normalization;
  std::string& prefix = normalization.stripped_prefix;
  while (true) {
    const absl::string_view segment =
        LeadingModuleSegment(absl::string_view(keys[0]).substr(prefix.size()));
    const WrapperSegment* wrapper = FindWrapperSegment(segment);
    if (wrapper == nullptr) break;
    const bool shared = std::all_of(keys.begin(), keys.end(), [&](const std::string& key) {
      return LeadingModuleSegment(absl::string_view(key).substr(prefix.size())) == segment;
    });
    if (!shared) break;
    absl::StrAppend(&prefix, segment, ".");
    NoteWrapper(wrapper->wrapper, normalization.wrappers);
  }

  // Reserved wrapper segments inside keys (never the last segment, which names a tensor).
  result.keys.reserve(keys.size());
  absl::flat_hash_map<std::string, size_t> canonical_to_index;
  for (size_t i = 0; i < keys.size(); ++i) {
    const absl::string_view rest = absl::string_view(keys[i]).substr(prefix.size());
    std::vector<absl::string_view> segments = absl::StrSplit(rest, '.');
    std::vector<absl::string_view> kept;
    kept.reserve(segments.size());
    for (size_t s = 0; s < segments.size(); ++s) {
      const WrapperSegment* wrapper = FindWrapperSegment(segments[s]);
      if (wrapper != nullptr && wrapper->may_occur_inside && s + 1 < segments.size()) {
        NoteWrapper(wrapper->wrapper, normalization.wrappers);
        continue;
      }
      kept.push_back(segments[s]);
    }
    std::string canonical = absl::StrJoin(kept, ".");
    if (kept.size() != segments.size()) normalization.inner_renames[canonical] = keys[i];
    auto [it, inserted] = canonical_to_index.emplace(canonical, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keys '", keys[it->second], "' and '", keys[i], "' both normalize to '", canonical,
          "'; the state dict mixes wrapped and unwrapped copies of one tensor"));
    }
    result.keys.push_back(std::move(canonical));
  }
  return result;
}

absl::StatusOr<std::pair<StateDict, KeyNormalization>> NormalizeStateDict(
    const StateDict& state_dict) {
  absl::StatusOr<NormalizedKeys> normalized = NormalizeKeys(state_dict.keys());
  if (!normalized.ok()) return normalized.status();
  absl::StatusOr<StateDict> renamed = state_dict.WithKeys(normalized->keys);
  if (!renamed.ok()) return renamed.status();
  return std::make_pair(*std::move(renamed), std::move(normalized->normalization));
}

absl::StatusOr<StateDict> StripExactPrefix(const StateDict& state_dict, absl::string_view prefix) {
  std::vector<std::string> keys;
  keys.reserve(state_dict.size());
  for (const StateDict::Entry& entry : state_dict) {
    if (!absl::StartsWith(entry.key, prefix) || entry.key.size() == prefix.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", entry.key, "' does not start with the prefix '", prefix, "' to strip"));
    }
    keys.push_back(entry.key.substr(prefix.size()));
  }
  return state_dict.WithKeys(keys);
}

KeyPolicy KeyPolicy::AddPrefix(absl::string_view prefix) {
  std::string with_dot(prefix);
  if (!with_dot.empty() && with_dot.back() != '.') with_dot += '.';
  return KeyPolicy(Kind::kAddPrefix, std::move(with_dot));
}

std::string ApplyKeyPolicy(absl::string_view canonical_key, const KeyPolicy& policy,
                           const KeyNormalization& normalization) {
  switch (policy.kind()) {
    case KeyPolicy::Kind::kCanonical:
      return std::string(canonical_key);
    case KeyPolicy::Kind::kAddPrefix:
      return absl::StrCat(policy.prefix(), canonical_key);
    case KeyPolicy::Kind::kOriginal:
      return normalization.OriginalKey(canonical_key);
  }
  return std::string(canonical_key);
}

absl::StatusOr<std::vector<std::string>> ApplyKeyPolicy(
    const std::vector<std::string>& canonical_keys, const KeyPolicy& policy,
    const KeyNormalization& normalization) {
  std::vector<std::string> out;
  out.reserve(canonical_keys.size());
  absl::flat_hash_map<std::string, absl::string_view> seen;
  for (const std::string& key : canonical_keys) {
    std::string mapped = ApplyKeyPolicy(key, policy, normalization);
    auto [it, inserted] = seen.emplace(mapped, key);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys '", it->second, "' and '", key, "' both become '", mapped, "'"));
    }
    out.push_back(std::move(mapped));
  }
  return out;
}

}  // namespace ckpt
