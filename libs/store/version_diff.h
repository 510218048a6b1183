#ifndef CKPT_LIBS_STORE_VERSION_DIFF_H_
#define CKPT_LIBS_STORE_VERSION_DIFF_H_

// `ckpt diff MODEL@A MODEL@B`: which model tensors were added, removed or changed between two
// versions, with shape / dtype changes and the largest absolute difference of each changed
// tensor. Tensors with equal content hashes are unchanged without reading their bytes; changed
// ones are read one pair at a time, so memory stays at two tensors.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

struct TensorChange {
  std::string key;
  std::vector<int64_t> shape_a, shape_b;
  std::string dtype_a, dtype_b;
  // max |a - b| over elements, computed in float64; set only when shape and dtype agree and the
  // dtype is numeric (for bool: 1 if any element differs).
  std::optional<double> max_abs_difference;
};

struct VersionDiff {
  std::string a, b;                  // "MODEL@N".
  std::vector<std::string> added;    // In b, not in a.
  std::vector<std::string> removed;  // In a, not in b.
  std::vector<TensorChange> changed;
  int64_t unchanged = 0;
};

// Errors from GetManifest / reading tensors (NOT_FOUND for a missing version, DATA_LOSS).
absl::StatusOr<VersionDiff> DiffVersions(CheckpointStore& store, const v1::VersionRef& a,
                                         const v1::VersionRef& b);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_VERSION_DIFF_H_
