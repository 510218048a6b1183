#include "libs/loader/local_loader.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// "fc.weight: bfloat16 in checkpoint, float32 expected" for each expected tensor whose declared
// dtype differs from what loading `manifest` under `target` gives.
std::vector<std::string> DtypeDifferences(const v1::Manifest& manifest,
                                          const std::vector<ExpectedTensor>& expected,
                                          LoadTarget target) {
  std::vector<std::string> differences;
  target.include_keys.clear();
  target.include_prefixes.clear();
  absl::StatusOr<std::vector<PlannedTensor>> named = PlanLoad(manifest, target);
  if (!named.ok()) return differences;  // the key policy does not apply; the report says so.
  absl::flat_hash_map<std::string, const v1::TensorMeta*> by_key;
  for (const PlannedTensor& tensor : *named) by_key.emplace(tensor.key, tensor.meta);
  for (const ExpectedTensor& tensor : expected) {
    if (tensor.dtype == DType::kUnspecified) continue;
    auto it = by_key.find(tensor.key);
    if (it == by_key.end()) continue;
    const DType loaded = target.dtype.Apply(static_cast<DType>(it->second->dtype()));
    if (loaded != tensor.dtype) {
      differences.push_back(absl::StrCat(tensor.key, ": ", DTypeName(loaded), " in checkpoint, ",
                                         DTypeName(tensor.dtype), " expected"));
    }
  }
  return differences;
}

}  // namespace

LocalLoader::LocalLoader(CheckpointStore& store, int64_t cache_bytes)
    : store_(store), cache_(cache_bytes) {}

absl::StatusOr<std::unique_ptr<VersionReader>> LocalLoader::OpenVersion(
    const v1::VersionRef& ref) const {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store_.OpenVersion(ref));
  return CachedVersionReader(std::move(reader), &cache_);
}

absl::StatusOr<LoadedState> LocalLoader::Load(const v1::VersionRef& ref,
                                              const LoadTarget& target) const {
  // The device first: an unusable target fails before the store is touched.
  RETURN_IF_ERROR(ResolveTorchDevice(target.device).status());
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, OpenVersion(ref));
  return ckpt::Load(*reader, target);
}

absl::StatusOr<PreflightReport> LocalLoader::Preflight(const v1::VersionRef& ref,
                                                       const std::vector<ExpectedTensor>& expected,
                                                       const LoadTarget& target) const {
  ASSIGN_OR_RETURN(v1::Manifest manifest, store_.GetManifest(ref));
  // The subset the consumer would load, by canonical key.
  LoadTarget canonical = target;
  canonical.keys = KeyPolicy::Canonical();
  ASSIGN_OR_RETURN(std::vector<PlannedTensor> selected, PlanLoad(manifest, canonical));
  absl::flat_hash_set<std::string> keep;
  for (const PlannedTensor& tensor : selected) keep.insert(tensor.key);
  v1::Manifest subset = manifest;
  subset.clear_tensors();
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    if (keep.contains(meta.key())) *subset.add_tensors() = meta;
  }
  PreflightReport report = ckpt::Preflight(subset, expected, target.keys);
  report.dtype_differences = DtypeDifferences(subset, expected, target);
  return report;
}

absl::StatusOr<ExportResult> LocalLoader::Export(const v1::VersionRef& ref,
                                                 const ExportOptions& options,
                                                 const std::string& path) const {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, OpenVersion(ref));
  return ExportToFile(*reader, options, path);
}

}  // namespace ckpt
