// Sparse tensors (torch.sparse_coo, sparse_csr, sparse_csc, sparse_bsr, sparse_bsc) as the store
// keeps them: one TensorMeta whose `sparse` field lists the dense parts (indices, values) and
// whose bytes are those parts' bytes one after another (proto/ckpt/v1/types.proto, SparseLayout).
//
// Keeping a sparse tensor as one entry of concatenated bytes, rather than as a tensor with parts
// of their own chunks, leaves everything that works on bytes unchanged: chunking, dedup, content
// hashes, verify, retention and garbage collection never look inside a tensor. Only the places
// that turn bytes into an at::Tensor, or cast them, need to know, and they call this library:
//
//   v1::TensorMeta meta;
//   RETURN_IF_ERROR(DescribeSparseTensor(tensor, meta));     // dtype, shape, parts, byte_length
//   ASSIGN_OR_RETURN(at::Tensor bytes, StoredBytes(tensor));  // what goes into the chunks
//   ...
//   ASSIGN_OR_RETURN(at::Tensor back, SparseTensorFromBytes(meta, bytes_read));
#ifndef CKPT_LIBS_TENSOR_SPARSE_LAYOUT_H_
#define CKPT_LIBS_TENSOR_SPARSE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/tensor/dtype.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// True for a tensor of a sparse layout (not strided, not a mkldnn or other opaque layout).
bool IsSparseTensor(const at::Tensor& tensor);

// "sparse_coo", "sparse_csr", ... as torch names the layout; "strided" when `meta` is dense.
std::string SparseLayoutName(const v1::TensorMeta& meta);

// The dense parts of a sparse `tensor` in stored order (as SparseLayout.parts names them) and the
// layout's name ("sparse_coo", ...). INVALID_ARGUMENT for a tensor not of a sparse layout.
struct SparseParts {
  std::string layout_name;
  std::vector<at::Tensor> parts;
};
absl::StatusOr<SparseParts> SparsePartsOf(const at::Tensor& tensor);

// How many bytes the store keeps for `tensor`: nbytes() for a dense one (which LibTorch refuses
// for a sparse tensor), its parts' bytes for a sparse one; 0 for an undefined one.
int64_t StoredByteCount(const at::Tensor& tensor);

// Fills `meta`'s dtype (of the values), shape (the dense size), sparse layout, byte_length and
// requires_grad from a sparse `tensor` on any device. INVALID_ARGUMENT naming meta.key() for a
// layout the store cannot keep (for instance a dtype LibTorch has but the store does not).
absl::Status DescribeSparseTensor(const at::Tensor& tensor, v1::TensorMeta& meta);

// The bytes the store keeps for `tensor`, as a contiguous CPU tensor: a dense tensor contiguous on
// the CPU (itself when it already is), or a sparse tensor's parts one after another (a uint8
// tensor of StoredByteLength bytes).
absl::StatusOr<at::Tensor> StoredBytes(const at::Tensor& tensor);

// How many bytes `meta`'s tensor is: numel * element size for a dense tensor; for a sparse one
// the sum of its parts, after checking that the parts fit the layout (their names, index dtypes,
// the values' dtype and the parts' shapes against the dense shape). INVALID_ARGUMENT saying what
// is wrong, for the validation of an upload.
absl::StatusOr<int64_t> StoredByteLength(const v1::TensorMeta& meta);

// A sparse CPU tensor rebuilt from `bytes` (StoredByteLength(meta) of them) as `meta` describes
// it; torch's own checks of the indices run on it. DATA_LOSS naming meta.key() when the bytes
// or the layout do not make a valid tensor (a stored manifest is past validation by then).
absl::StatusOr<at::Tensor> SparseTensorFromBytes(const v1::TensorMeta& meta,
                                                 absl::string_view bytes);

// The layout torch names "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr" or "sparse_bsc"
// (also with a "torch." prefix); INVALID_ARGUMENT for any other name.
absl::StatusOr<c10::Layout> SparseLayoutFromName(absl::string_view name);

// A sparse CPU tensor of `layout` from its parts (COO: indices, values; the compressed layouts:
// compressed indices, plain indices, values) and dense `size`, after torch's own checks of the
// indices (as a checked torch.sparse_coo_tensor makes one). `coalesced` (COO only) marks indices
// that are sorted and unique as such. INVALID_ARGUMENT with torch's reason otherwise.
absl::StatusOr<at::Tensor> MakeSparseTensor(c10::Layout layout, const std::vector<at::Tensor>& parts,
                                            const std::vector<int64_t>& size, bool coalesced);

// The refusal of a writer of dense tensors only (`format`: "safetensors", "a DCP directory") to
// take the sparse tensor `key` of layout `layout_name`: INVALID_ARGUMENT saying what keeps it.
absl::Status DenseOnlyFormatError(absl::string_view format, absl::string_view key,
                                  absl::string_view layout_name);

// `meta` of a sparse tensor with its values cast to `dtype` (the indices are never cast): the
// values part and meta's dtype change, and byte_length with them.
absl::Status CastSparseMeta(DType dtype, v1::TensorMeta& meta);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_SPARSE_LAYOUT_H_
