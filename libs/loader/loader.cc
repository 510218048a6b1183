#include "libs/loader/loader.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"
#include "torch/csrc/autograd/grad_mode.h"
#include "torch/nn/module.h"

namespace ckpt {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::vector<int64_t> ShapeOf(const v1::TensorMeta& meta) {
  return std::vector<int64_t>(meta.shape().begin(), meta.shape().end());
}

KeyNormalization NormalizationOf(const v1::Manifest& manifest) {
  return KeyNormalization::FromProto(manifest.metadata().key_normalization());
}

// The model tensors of `manifest` under `keys`: consumer key -> tensor meta, in manifest order.
absl::StatusOr<std::vector<std::pair<std::string, const v1::TensorMeta*>>> NamedTensors(
    const v1::Manifest& manifest, const KeyPolicy& keys) {
  std::vector<std::string> canonical;
  canonical.reserve(manifest.tensors_size());
  for (const v1::TensorMeta& meta : manifest.tensors()) canonical.push_back(meta.key());
  ASSIGN_OR_RETURN(std::vector<std::string> named,
                   ApplyKeyPolicy(canonical, keys, NormalizationOf(manifest)));
  std::vector<std::pair<std::string, const v1::TensorMeta*>> result;
  result.reserve(named.size());
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    result.emplace_back(std::move(named[i]), &manifest.tensors(i));
  }
  return result;
}

// The model tensors `target` selects. INVALID_ARGUMENT naming every include_keys entry the
// version lacks and every include_prefixes entry that matches nothing.
absl::StatusOr<std::vector<const v1::TensorMeta*>> SelectTensors(const v1::Manifest& manifest,
                                                                 const LoadTarget& target) {
  std::vector<const v1::TensorMeta*> selected;
  const bool everything = target.include_keys.empty() && target.include_prefixes.empty();
  const absl::flat_hash_set<std::string> wanted(target.include_keys.begin(),
                                                target.include_keys.end());
  absl::flat_hash_set<std::string> found_keys;
  absl::flat_hash_set<std::string> used_prefixes;
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    bool take = everything;
    if (wanted.contains(meta.key())) {
      found_keys.insert(meta.key());
      take = true;
    }
    for (const std::string& prefix : target.include_prefixes) {
      if (absl::StartsWith(meta.key(), prefix)) {
        used_prefixes.insert(prefix);
        take = true;
      }
    }
    if (take) selected.push_back(&meta);
  }
  std::vector<std::string> absent_keys;
  for (const std::string& key : target.include_keys) {
    if (!found_keys.contains(key)) absent_keys.push_back(key);
  }
  std::vector<std::string> unmatched_prefixes;
  for (const std::string& prefix : target.include_prefixes) {
    if (!used_prefixes.contains(prefix)) unmatched_prefixes.push_back(prefix);
  }
  if (!absent_keys.empty() || !unmatched_prefixes.empty()) {
    std::string message = absl::StrCat(FormatVersionRef(manifest.model(), manifest.version()),
                                       ": the requested subset names what the version lacks");
    if (!absent_keys.empty()) {
      absl::StrAppend(&message, "; keys: [", absl::StrJoin(absent_keys, ", "), "]");
    }
    if (!unmatched_prefixes.empty()) {
      absl::StrAppend(&message, "; prefixes matching no key: [",
                      absl::StrJoin(unmatched_prefixes, ", "), "]");
    }
    absl::StrAppend(&message, " (subsets name canonical keys)");
    return absl::InvalidArgumentError(message);
  }
  return selected;
}

}  // namespace

absl::StatusOr<Value> ValueTreeFromManifest(
    const v1::Manifest& manifest, const v1::Value& tree,
    const std::function<absl::StatusOr<at::Tensor>(const v1::TensorMeta&)>& make_tensor) {
  absl::flat_hash_map<std::string, const v1::TensorMeta*> state_tensors;
  for (const v1::TensorMeta& meta : manifest.state_tensors()) {
    state_tensors.emplace(meta.key(), &meta);
  }
  return ValueFromProto(tree, [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
    auto it = state_tensors.find(key);
    if (it == state_tensors.end()) {
      return absl::DataLossError(absl::StrCat(
          FormatVersionRef(manifest.model(), manifest.version()),
          ": value tree references state tensor '", key, "', which the manifest lacks"));
    }
    return make_tensor(*it->second);
  });
}

absl::StatusOr<Value> LoadValueTree(const VersionReader& reader, const v1::Manifest& manifest,
                                    const v1::Value& tree, const DeviceSpec& device) {
  return ValueTreeFromManifest(manifest, tree,
                               [&](const v1::TensorMeta& meta) -> absl::StatusOr<at::Tensor> {
                                 ASSIGN_OR_RETURN(at::Tensor tensor, ReadTensor(reader, meta));
                                 return PlaceTensor(tensor, device, DTypePolicy::Keep());
                               });
}

namespace {

// `checkpoint` (consumer keys and metas) against `expected`, in the consumer's order for missing
// keys and shape mismatches and the checkpoint's order for unexpected keys.
CompatibilityReport Compare(
    const std::vector<std::pair<std::string, const v1::TensorMeta*>>& checkpoint,
    const std::vector<ExpectedTensor>& expected) {
  CompatibilityReport report;
  absl::flat_hash_map<absl::string_view, const v1::TensorMeta*> by_key;
  for (const auto& [key, meta] : checkpoint) by_key.emplace(key, meta);
  absl::flat_hash_set<absl::string_view> expected_keys;
  for (const ExpectedTensor& tensor : expected) {
    expected_keys.insert(tensor.key);
    auto it = by_key.find(tensor.key);
    if (it == by_key.end()) {
      report.missing_keys.push_back(tensor.key);
    } else if (ShapeOf(*it->second) != tensor.shape) {
      report.shape_mismatches.push_back({tensor.key, ShapeOf(*it->second), tensor.shape});
    }
  }
  for (const auto& [key, meta] : checkpoint) {
    if (!expected_keys.contains(key)) report.unexpected_keys.push_back(key);
  }
  return report;
}

// Module tensors by name: parameters, then buffers (undefined buffers skipped).
std::vector<std::pair<std::string, at::Tensor>> ModuleTensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) tensors.emplace_back(item.key(), item.value());
  }
  return tensors;
}

std::string KeyPolicyName(const KeyPolicy& policy) {
  switch (policy.kind()) {
    case KeyPolicy::Kind::kCanonical:
      return "canonical keys";
    case KeyPolicy::Kind::kAddPrefix:
      return absl::StrCat("prefix \"", policy.prefix(), "\"");
    case KeyPolicy::Kind::kOriginal:
      return "the producer's original keys";
  }
  return "unknown key policy";
}

// Key policies worth trying for `expected`, in order of preference: the given one, canonical,
// every dotted prefix the expected keys all share ("module.", "module._orig_mod.", ...), and
// last the producer's original keys (explicit prefixes say more about the consumer than "whatever
// the producer had").
std::vector<KeyPolicy> CandidatePolicies(const std::vector<ExpectedTensor>& expected,
                                         const KeyPolicy& given) {
  std::vector<KeyPolicy> candidates = {given, KeyPolicy::Canonical()};
  if (expected.empty()) {
    candidates.push_back(KeyPolicy::Original());
    return candidates;
  }
  const std::string& first = expected.front().key;
  for (size_t dot = first.find('.'); dot != std::string::npos; dot = first.find('.', dot + 1)) {
    const absl::string_view prefix(first.data(), dot + 1);
    const bool shared = std::all_of(expected.begin(), expected.end(), [&](const ExpectedTensor& t) {
      return t.key.size() > prefix.size() && absl::StartsWith(t.key, prefix);
    });
    if (!shared) break;
    candidates.push_back(KeyPolicy::AddPrefix(prefix));
  }
  candidates.push_back(KeyPolicy::Original());
  return candidates;
}

bool NamesMatch(const CompatibilityReport& report) {
  return report.missing_keys.empty() && report.unexpected_keys.empty();
}

}  // namespace

std::string CompatibilityReport::ToString() const {
  std::vector<std::string> parts;
  if (!missing_keys.empty()) {
    parts.push_back(absl::StrCat("missing: [", absl::StrJoin(missing_keys, ", "), "]"));
  }
  if (!unexpected_keys.empty()) {
    parts.push_back(absl::StrCat("unexpected: [", absl::StrJoin(unexpected_keys, ", "), "]"));
  }
  if (!shape_mismatches.empty()) {
    std::vector<std::string> mismatches;
    for (const ShapeMismatch& mismatch : shape_mismatches) {
      mismatches.push_back(absl::StrCat(mismatch.key, ": ", ShapeString(mismatch.checkpoint_shape),
                                        " in checkpoint, ", ShapeString(mismatch.expected_shape),
                                        " in module"));
    }
    parts.push_back(absl::StrCat("shape mismatch: ", absl::StrJoin(mismatches, ", ")));
  }
  if (parts.empty()) return "compatible";
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<std::vector<PlannedTensor>> PlanLoad(const v1::Manifest& manifest,
                                                    const LoadTarget& target) {
  ASSIGN_OR_RETURN(std::vector<const v1::TensorMeta*> selected, SelectTensors(manifest, target));
  std::vector<std::string> canonical;
  canonical.reserve(selected.size());
  for (const v1::TensorMeta* meta : selected) canonical.push_back(meta->key());
  ASSIGN_OR_RETURN(std::vector<std::string> keys,
                   ApplyKeyPolicy(canonical, target.keys, NormalizationOf(manifest)));
  std::vector<PlannedTensor> planned;
  planned.reserve(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) {
    planned.push_back({std::move(keys[i]), selected[i]});
  }
  return planned;
}

absl::StatusOr<LoadedState> Load(CheckpointStore& store, const v1::VersionRef& ref,
                                 const LoadTarget& target) {
  // The device first: an unusable target fails before the store is touched.
  RETURN_IF_ERROR(ResolveTorchDevice(target.device).status());
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store.OpenVersion(ref));
  return Load(*reader, target);
}

absl::StatusOr<LoadedState> Load(const VersionReader& reader, const LoadTarget& target) {
  RETURN_IF_ERROR(ResolveTorchDevice(target.device).status());
  LoadedState state;
  state.manifest = reader.manifest();
  const v1::Manifest& manifest = state.manifest;
  ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(manifest, target));
  for (PlannedTensor& tensor_plan : planned) {
    const v1::TensorMeta& meta = *tensor_plan.meta;
    // Streamed chunk by chunk into a CPU tensor allocated from the manifest's dtype and shape.
    ASSIGN_OR_RETURN(at::Tensor tensor, ReadTensor(reader, meta));
    ASSIGN_OR_RETURN(at::Tensor placed, PlaceTensor(tensor, target.device, target.dtype));
    tensor = at::Tensor();  // the CPU copy goes before the next tensor is read.
    RETURN_IF_ERROR(
        state.model.Insert(std::move(tensor_plan.key), std::move(placed), meta.original_device()));
  }
  if (target.include_optimizer && manifest.has_optimizer_state()) {
    ASSIGN_OR_RETURN(state.optimizer,
                     LoadValueTree(reader, manifest, manifest.optimizer_state(), target.device));
  }
  if (target.include_scheduler && manifest.has_scheduler_state()) {
    ASSIGN_OR_RETURN(state.scheduler,
                     LoadValueTree(reader, manifest, manifest.scheduler_state(), target.device));
  }
  return state;
}

absl::StatusOr<CompatibilityReport> LoadInto(CheckpointStore& store, const v1::VersionRef& ref,
                                             torch::nn::Module& module,
                                             const LoadIntoOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store.OpenVersion(ref));
  const v1::Manifest& manifest = reader->manifest();
  ASSIGN_OR_RETURN(auto checkpoint, NamedTensors(manifest, options.keys));
  const std::vector<std::pair<std::string, at::Tensor>> destinations = ModuleTensors(module);
  std::vector<ExpectedTensor> expected;
  expected.reserve(destinations.size());
  for (const auto& [key, tensor] : destinations) {
    expected.push_back({key, tensor.sizes().vec()});
  }
  CompatibilityReport report = Compare(checkpoint, expected);
  if (options.strict && !report.compatible()) {
    return absl::InvalidArgumentError(
        absl::StrCat(FormatVersionRef(manifest.model(), manifest.version()),
                     " does not fit the module (strict): ", report.ToString()));
  }
  absl::flat_hash_map<absl::string_view, const v1::TensorMeta*> by_key;
  for (const auto& [key, meta] : checkpoint) by_key.emplace(key, meta);
  torch::NoGradGuard no_grad;
  for (const auto& [key, destination] : destinations) {
    auto it = by_key.find(key);
    if (it == by_key.end() || ShapeOf(*it->second) != destination.sizes().vec()) continue;
    ASSIGN_OR_RETURN(at::Tensor tensor, ReadTensor(*reader, *it->second));
    ASSIGN_OR_RETURN(tensor, PlaceTensor(tensor, DeviceSpec::Cpu(), options.dtype));
    at::Tensor target = destination;
    RETURN_IF_ERROR(CatchTorchErrors([&] { target.copy_(tensor); }));
    report.loaded_keys.push_back(key);
  }
  return report;
}

std::vector<ExpectedTensor> ExpectedTensorsOf(const torch::nn::Module& module) {
  std::vector<ExpectedTensor> expected;
  for (const auto& [key, tensor] : ModuleTensors(module)) {
    expected.push_back({key, tensor.sizes().vec()});
  }
  return expected;
}

PreflightReport Preflight(const v1::Manifest& manifest, const std::vector<ExpectedTensor>& expected,
                          const KeyPolicy& keys) {
  PreflightReport preflight;
  bool first = true;
  for (const KeyPolicy& candidate : CandidatePolicies(expected, keys)) {
    absl::StatusOr<std::vector<std::pair<std::string, const v1::TensorMeta*>>> named =
        NamedTensors(manifest, candidate);
    if (!named.ok()) {
      // A policy that maps two keys to one cannot fit; under it nothing is found.
      if (first) preflight.report = Compare({}, expected);
      first = false;
      continue;
    }
    CompatibilityReport report = Compare(*named, expected);
    const bool fits = NamesMatch(report);
    if (first) preflight.report = report;
    first = false;
    if (fits && !preflight.suggested_keys.has_value()) preflight.suggested_keys = candidate;
  }
  const std::string version = FormatVersionRef(manifest.model(), manifest.version());
  if (preflight.report.compatible()) {
    preflight.summary = absl::StrCat(version, " fits: all ", expected.size(),
                                     " expected tensors match under ", KeyPolicyName(keys), ".");
  } else {
    preflight.summary = absl::StrCat(version, " does not fit under ", KeyPolicyName(keys), ": ",
                                     preflight.report.ToString(), ".");
    if (preflight.suggested_keys.has_value() && !NamesMatch(preflight.report)) {
      absl::StrAppend(&preflight.summary, " Every key matches under ",
                      KeyPolicyName(*preflight.suggested_keys), ".");
    }
  }
  return preflight;
}

absl::StatusOr<PreflightReport> Preflight(CheckpointStore& store, const v1::VersionRef& ref,
                                          const std::vector<ExpectedTensor>& expected,
                                          const KeyPolicy& keys) {
  ASSIGN_OR_RETURN(v1::Manifest manifest, store.GetManifest(ref));
  return Preflight(manifest, expected, keys);
}

absl::StatusOr<v1::Manifest> AdaptedManifest(const v1::Manifest& stored,
                                             const std::vector<PlannedTensor>& planned,
                                             const LoadTarget& target) {
  v1::Manifest adapted = stored;
  adapted.clear_tensors();
  for (const PlannedTensor& tensor : planned) {
    v1::TensorMeta& meta = *adapted.add_tensors();
    meta = *tensor.meta;  // chunk refs kept: the consumer checks uncast bytes against them.
    meta.set_key(tensor.key);
    const DType cast = target.dtype.Apply(static_cast<DType>(tensor.meta->dtype()));
    if (static_cast<int>(cast) != tensor.meta->dtype()) {
      if (meta.has_sparse()) {
        RETURN_IF_ERROR(CastSparseMeta(cast, meta));  // the values only, never the indices.
      } else {
        meta.set_dtype(static_cast<v1::DType>(cast));
        ASSIGN_OR_RETURN(const int64_t bytes,
                         ByteLengthOf(cast, std::vector<int64_t>(tensor.meta->shape().begin(),
                                                                 tensor.meta->shape().end())));
        meta.set_byte_length(bytes);
      }
      // Both named the stored bytes; the stream follows the cast bytes with a TensorDigest.
      meta.clear_content_hash();
      meta.clear_chunks();
    }
  }
  if (!target.include_optimizer) {
    adapted.clear_optimizer_state();
    adapted.clear_optimizer_param_names();
  }
  if (!target.include_scheduler) adapted.clear_scheduler_state();
  if (!target.include_extra) adapted.clear_extra_state();
  // State tensors go out as stored, chunk refs and all.
  if (!target.include_optimizer && !target.include_scheduler && !target.include_extra) {
    adapted.clear_state_tensors();
  }
  return adapted;
}

}  // namespace ckpt
