#ifndef CKPT_LIBS_STORE_MANIFEST_VALIDATION_H_
#define CKPT_LIBS_STORE_MANIFEST_VALIDATION_H_

// Checks an upload's header (a v1::Manifest without chunks) before any byte is stored, so that a
// version that cannot be loaded back is refused up front with a message that names the problem.
//
// Rejected with INVALID_ARGUMENT (PyTorch would fail, or silently do the wrong thing, on load):
//  - a tensor with an empty or duplicate key, an unknown dtype, a negative dimension, or a
//    byte_length other than numel * element size; chunk refs filled in (the store computes them);
//    a content_hash that is not 32 bytes;
//  - a value tree with a node of no kind, nesting deeper than kMaxValueDepth, or a TensorRef to a
//    key missing from state_tensors;
//  - an optimizer state that is not {"state": dict, "param_groups": [{"params": [int...]}...]};
//    that lists one parameter index twice; or whose parameter count (or largest index) exceeds
//    the number of floating-point / complex model tensors. PyTorch's optimizer state counts
//    parameters, which may be fewer than the state dict's tensors (buffers such as BatchNorm's
//    running_mean, and frozen parameters, are not optimized), so only *more* parameters than
//    trainable-typed tensors is a contradiction;
//  - optimizer_param_names naming an index that no param group lists, a key that is not a model
//    tensor, or one key for two indices;
//  - a scheduler state dict without an integer "last_epoch" (LRScheduler.load_state_dict only
//    updates attributes, so a resume would silently restart the schedule); composite schedulers
//    (SequentialLR, ChainedScheduler) are checked through their "_schedulers" entries instead;
//  - a bundle_layout that ValidateBundleLayout (libs/format/bundle.h) refuses.
//
// Accepted with a warning (PyTorch accepts them, but they are suspicious):
//  - optimizer "state" entries for indices that no param group lists (PyTorch keeps them unused);
//  - an optimizer state tensor whose shape differs from its named parameter's (some optimizers,
//    e.g. factored ones, keep such state legitimately);
//  - a scheduler state that is not a dict (e.g. an opaque pickled object): stored as is;
//  - state tensors that no value tree references.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

// OK unless the parent is not "MODEL@VERSION" with a number (an alias would move, and lineage
// must stay true), or a parent relation is given without a parent.
absl::Status ValidateLineage(const v1::Lineage& lineage);

// Validates `header` as described above. Returns the warnings (empty when all is well).
absl::StatusOr<std::vector<std::string>> ValidateManifestHeader(const v1::Manifest& header);

// The parameter indices an optimizer state_dict's param_groups list, in order (the order
// torch.optim numbers parameters in). INVALID_ARGUMENT, naming the group, for the malformed
// param_groups described above (missing, not int, negative, listed twice).
absl::StatusOr<std::vector<int64_t>> OptimizerParameterIndices(const v1::Value& optimizer);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_MANIFEST_VALIDATION_H_
