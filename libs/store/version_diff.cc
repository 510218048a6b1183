#include "libs/store/version_diff.h"

#include <map>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"

namespace ckpt {
namespace {

std::string DTypeText(v1::DType dtype) { return std::string(DTypeName(static_cast<DType>(dtype))); }

}  // namespace

absl::StatusOr<VersionDiff> DiffVersions(CheckpointStore& store, const v1::VersionRef& a,
                                         const v1::VersionRef& b) {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader_a, store.OpenVersion(a));
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader_b, store.OpenVersion(b));
  const v1::Manifest& manifest_a = reader_a->manifest();
  const v1::Manifest& manifest_b = reader_b->manifest();
  VersionDiff diff;
  diff.a = FormatVersionRef(manifest_a.model(), manifest_a.version());
  diff.b = FormatVersionRef(manifest_b.model(), manifest_b.version());

  std::map<std::string, const v1::TensorMeta*> in_b;
  for (const v1::TensorMeta& meta : manifest_b.tensors()) in_b[meta.key()] = &meta;
  std::map<std::string, bool> seen_in_a;
  for (const v1::TensorMeta& meta_a : manifest_a.tensors()) {
    seen_in_a[meta_a.key()] = true;
    auto it = in_b.find(meta_a.key());
    if (it == in_b.end()) {
      diff.removed.push_back(meta_a.key());
      continue;
    }
    const v1::TensorMeta& meta_b = *it->second;
    const bool same_layout = meta_a.dtype() == meta_b.dtype() &&
                             std::equal(meta_a.shape().begin(), meta_a.shape().end(),
                                        meta_b.shape().begin(), meta_b.shape().end());
    // Equal chunk lists mean equal bytes whichever content_hash scheme wrote each manifest.
    const bool same_chunks =
        std::equal(meta_a.chunks().begin(), meta_a.chunks().end(), meta_b.chunks().begin(),
                   meta_b.chunks().end(), [](const v1::ChunkRef& a, const v1::ChunkRef& b) {
                     return a.sha256() == b.sha256() && a.length() == b.length();
                   });
    if (same_layout && (meta_a.content_hash() == meta_b.content_hash() || same_chunks)) {
      ++diff.unchanged;
      continue;
    }
    TensorChange change;
    change.key = meta_a.key();
    change.shape_a.assign(meta_a.shape().begin(), meta_a.shape().end());
    change.shape_b.assign(meta_b.shape().begin(), meta_b.shape().end());
    change.dtype_a = DTypeText(meta_a.dtype());
    change.dtype_b = DTypeText(meta_b.dtype());
    const DTypeInfo& info = GetDTypeInfo(static_cast<DType>(meta_a.dtype()));
    // A sparse tensor's difference would need its dense form, which can be far larger than it.
    if (same_layout && info.scalar_type.has_value() && !info.is_quantized &&
        !meta_a.has_sparse() && !meta_b.has_sparse()) {
      ASSIGN_OR_RETURN(at::Tensor tensor_a, ReadTensor(*reader_a, meta_a));
      ASSIGN_OR_RETURN(at::Tensor tensor_b, ReadTensor(*reader_b, meta_b));
      ASSIGN_OR_RETURN(
          double max_difference, CatchTorchErrors([&] {
            if (tensor_a.numel() == 0) return 0.0;
            if (info.is_complex) {
              return (tensor_a - tensor_b).abs().max().item<double>();
            }
            return (tensor_a.to(at::kDouble) - tensor_b.to(at::kDouble)).abs().max().item<double>();
          }));
      change.max_abs_difference = max_difference;
    }
    diff.changed.push_back(std::move(change));
  }
  for (const v1::TensorMeta& meta_b : manifest_b.tensors()) {
    if (!seen_in_a.count(meta_b.key())) diff.added.push_back(meta_b.key());
  }
  return diff;
}

}  // namespace ckpt
