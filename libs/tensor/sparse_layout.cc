#include "libs/tensor/sparse_layout.h"

#include <cstring>
#include <utility>
#include <vector>

#include "ATen/ops/_validate_sparse_compressed_tensor_args.h"
#include "ATen/ops/_validate_sparse_coo_tensor_args.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/sparse_compressed_tensor.h"
#include "ATen/ops/sparse_coo_tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"

namespace ckpt {
namespace {

// As value_proto.h's, which this library sits below (Value compares sparse tensors with it).
v1::DType DTypeToProto(DType dtype) { return static_cast<v1::DType>(dtype); }
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  if (dtype < 0 || dtype > kMaxDTypeValue) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  return static_cast<DType>(dtype);
}

constexpr absl::string_view kIndices = "indices";
constexpr absl::string_view kValues = "values";
constexpr absl::string_view kCompressedIndices = "compressed_indices";
constexpr absl::string_view kPlainIndices = "plain_indices";

struct LayoutFacts {
  v1::SparseLayout::Kind kind;
  c10::Layout layout;
  const char* name;
  bool blocked;
};

constexpr LayoutFacts kLayouts[] = {
    {v1::SparseLayout::KIND_COO, c10::kSparse, "sparse_coo", false},
    {v1::SparseLayout::KIND_CSR, c10::kSparseCsr, "sparse_csr", false},
    {v1::SparseLayout::KIND_CSC, c10::kSparseCsc, "sparse_csc", false},
    {v1::SparseLayout::KIND_BSR, c10::kSparseBsr, "sparse_bsr", true},
    {v1::SparseLayout::KIND_BSC, c10::kSparseBsc, "sparse_bsc", true},
};

const LayoutFacts* FactsOf(v1::SparseLayout::Kind kind) {
  for (const LayoutFacts& facts : kLayouts) {
    if (facts.kind == kind) return &facts;
  }
  return nullptr;
}

const LayoutFacts* FactsOf(c10::Layout layout) {
  for (const LayoutFacts& facts : kLayouts) {
    if (facts.layout == layout) return &facts;
  }
  return nullptr;
}

// "float32", or "dtype 99" for a value no DType has.
std::string DTypeText(v1::DType dtype) {
  absl::StatusOr<DType> known = DTypeFromProto(dtype);
  return known.ok() ? std::string(DTypeName(*known))
                    : absl::StrCat("dtype ", static_cast<int>(dtype));
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The tensor's parts in stored order, with their names.
absl::StatusOr<std::vector<std::pair<absl::string_view, at::Tensor>>> PartsOf(
    const at::Tensor& tensor) {
  return CatchTorchErrors(
      [&] {
        std::vector<std::pair<absl::string_view, at::Tensor>> parts;
        switch (tensor.layout()) {
          case c10::kSparse:
            parts = {{kIndices, tensor._indices()}, {kValues, tensor._values()}};
            break;
          case c10::kSparseCsr:
          case c10::kSparseBsr:
            parts = {{kCompressedIndices, tensor.crow_indices()},
                     {kPlainIndices, tensor.col_indices()},
                     {kValues, tensor.values()}};
            break;
          default:  // CSC, BSC (FactsOf has refused every other layout).
            parts = {{kCompressedIndices, tensor.ccol_indices()},
                     {kPlainIndices, tensor.row_indices()},
                     {kValues, tensor.values()}};
            break;
        }
        return parts;
      },
      absl::StatusCode::kInvalidArgument);
}

absl::StatusOr<DType> PartDType(const v1::TensorMeta& meta, const v1::TensorPart& part) {
  absl::StatusOr<DType> dtype = DTypeFromProto(part.dtype());
  if (!dtype.ok() || *dtype == DType::kUnspecified) {
    return absl::InvalidArgumentError(absl::StrCat("sparse tensor '", meta.key(), "': part '",
                                                   part.name(), "' has an unknown dtype ",
                                                   static_cast<int>(part.dtype())));
  }
  return *dtype;
}

// Checks the parts' names, dtypes and shapes against the layout and the dense shape.
absl::Status CheckParts(const v1::TensorMeta& meta, const LayoutFacts& facts) {
  const auto& parts = meta.sparse().parts();
  const std::string where = absl::StrCat(facts.name, " tensor '", meta.key(), "'");
  const auto fail = [&](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what...));
  };
  const bool coo = facts.kind == v1::SparseLayout::KIND_COO;
  const std::vector<absl::string_view> names =
      coo ? std::vector<absl::string_view>{kIndices, kValues}
          : std::vector<absl::string_view>{kCompressedIndices, kPlainIndices, kValues};
  if (parts.size() != static_cast<int>(names.size())) {
    return fail("has ", parts.size(), " parts; the layout has ", names.size(), " (",
                absl::StrJoin(names, ", "), ")");
  }
  for (int i = 0; i < parts.size(); ++i) {
    if (parts[i].name() != names[i]) {
      return fail("part ", i, " is '", parts[i].name(), "'; the layout's is '", names[i], "'");
    }
  }
  const v1::TensorPart& values = parts[parts.size() - 1];
  if (values.dtype() != meta.dtype()) {
    return fail("its values are ", DTypeText(values.dtype()), " but the tensor's dtype is ",
                DTypeText(meta.dtype()));
  }
  const auto& dense = meta.shape();
  if (coo) {
    const v1::TensorPart& indices = parts[0];
    if (indices.dtype() != v1::DTYPE_INT64 || indices.shape_size() != 2) {
      return fail("its indices must be int64 of shape [sparse_dim, nnz], found ",
                  DTypeText(indices.dtype()), " ", ShapeText(indices.shape()));
    }
    const int64_t sparse_dim = indices.shape(0);
    const int64_t nnz = indices.shape(1);
    std::vector<int64_t> expected = {nnz};
    if (sparse_dim > dense.size()) {
      return fail("sparse_dim ", sparse_dim, " exceeds the ", dense.size(), " dimensions of ",
                  ShapeText(dense));
    }
    expected.insert(expected.end(), dense.begin() + sparse_dim, dense.end());
    if (std::vector<int64_t>(values.shape().begin(), values.shape().end()) != expected) {
      return fail("its values have shape ", ShapeText(values.shape()), "; ", nnz,
                  " values of the dense dims of ", ShapeText(dense), " are ",
                  ShapeText(expected));
    }
    return absl::OkStatus();
  }
  const v1::TensorPart& compressed = parts[0];
  const v1::TensorPart& plain = parts[1];
  if ((compressed.dtype() != v1::DTYPE_INT32 && compressed.dtype() != v1::DTYPE_INT64) ||
      plain.dtype() != compressed.dtype()) {
    return fail("its indices must both be int32 or both int64, found ",
                DTypeText(compressed.dtype()), " and ", DTypeText(plain.dtype()));
  }
  const int batch = compressed.shape_size() - 1;
  if (batch < 0 || plain.shape_size() != batch + 1 || values.shape_size() < batch + 1 ||
      dense.size() < batch + 2) {
    return fail("parts of shapes ", ShapeText(compressed.shape()), ", ",
                ShapeText(plain.shape()), " and ", ShapeText(values.shape()),
                " do not make a compressed tensor of shape ", ShapeText(dense));
  }
  for (int i = 0; i < batch; ++i) {
    if (compressed.shape(i) != dense[i] || plain.shape(i) != dense[i] ||
        values.shape(i) != dense[i]) {
      return fail("batch dimension ", i, " differs between the parts and ", ShapeText(dense));
    }
  }
  if (plain.shape(batch) != values.shape(batch)) {
    return fail(plain.shape(batch), " plain indices but ", values.shape(batch), " values");
  }
  // The compressed dimension: rows for CSR / BSR, columns for CSC / BSC, in blocks when blocked.
  const bool by_rows =
      facts.kind == v1::SparseLayout::KIND_CSR || facts.kind == v1::SparseLayout::KIND_BSR;
  int64_t extent = dense[batch + (by_rows ? 0 : 1)];
  if (facts.blocked) {
    if (values.shape_size() < batch + 3 || values.shape(batch + 1) <= 0 ||
        values.shape(batch + 2) <= 0) {
      return fail("its values of shape ", ShapeText(values.shape()), " have no block dimensions");
    }
    const int64_t block = values.shape(batch + (by_rows ? 1 : 2));
    if (extent % block != 0) {
      return fail("blocks of ", block, " do not divide dimension ", extent);
    }
    extent /= block;
  }
  if (compressed.shape(batch) != extent + 1) {
    return fail("its compressed indices have ", compressed.shape(batch), " entries per batch; ",
                extent, " compressed rows or columns need ", extent + 1);
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSparseTensor(const at::Tensor& tensor) {
  return tensor.defined() && FactsOf(tensor.layout()) != nullptr;
}

std::string SparseLayoutName(const v1::TensorMeta& meta) {
  if (!meta.has_sparse()) return "strided";
  const LayoutFacts* facts = FactsOf(meta.sparse().kind());
  return facts != nullptr ? facts->name
                          : absl::StrCat("sparse kind ", static_cast<int>(meta.sparse().kind()));
}

int64_t StoredByteCount(const at::Tensor& tensor) {
  if (!IsSparseTensor(tensor)) return tensor.defined() ? static_cast<int64_t>(tensor.nbytes()) : 0;
  absl::StatusOr<SparseParts> sparse = SparsePartsOf(tensor);
  int64_t total = 0;
  if (sparse.ok()) {
    for (const at::Tensor& part : sparse->parts) total += static_cast<int64_t>(part.nbytes());
  }
  return total;
}

absl::StatusOr<SparseParts> SparsePartsOf(const at::Tensor& tensor) {
  const LayoutFacts* facts = tensor.defined() ? FactsOf(tensor.layout()) : nullptr;
  if (facts == nullptr) return absl::InvalidArgumentError("not a tensor of a sparse layout");
  ASSIGN_OR_RETURN(const auto named, PartsOf(tensor));
  SparseParts out;
  out.layout_name = facts->name;
  for (const auto& part : named) out.parts.push_back(part.second);
  return out;
}

absl::Status DescribeSparseTensor(const at::Tensor& tensor, v1::TensorMeta& meta) {
  const LayoutFacts* facts = tensor.defined() ? FactsOf(tensor.layout()) : nullptr;
  if (facts == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", meta.key(), "' is not of a sparse layout"));
  }
  ASSIGN_OR_RETURN(const auto parts, PartsOf(tensor));
  v1::SparseLayout& sparse = *meta.mutable_sparse();
  sparse.set_kind(facts->kind);
  for (const auto& [name, part] : parts) {
    absl::StatusOr<DType> dtype = FromScalarType(part.scalar_type());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sparse tensor '", meta.key(), "': its ", name,
                                                     ": ", dtype.status().message()));
    }
    v1::TensorPart& described = *sparse.add_parts();
    described.set_name(std::string(name));
    described.set_dtype(DTypeToProto(*dtype));
    for (const int64_t size : part.sizes()) described.add_shape(size);
  }
  if (facts->kind == v1::SparseLayout::KIND_COO) sparse.set_coalesced(tensor.is_coalesced());
  meta.set_dtype(sparse.parts(sparse.parts_size() - 1).dtype());
  meta.clear_shape();
  for (const int64_t size : tensor.sizes()) meta.add_shape(size);
  meta.set_requires_grad(tensor.requires_grad());
  ASSIGN_OR_RETURN(const int64_t byte_length, StoredByteLength(meta));
  meta.set_byte_length(byte_length);
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> StoredBytes(const at::Tensor& tensor) {
  if (!IsSparseTensor(tensor)) {
    return CatchTorchErrors([&] { return tensor.detach().to(at::kCPU).contiguous(); },
                            absl::StatusCode::kInvalidArgument);
  }
  ASSIGN_OR_RETURN(const auto parts, PartsOf(tensor));
  return CatchTorchErrors(
      [&] {
        std::vector<at::Tensor> cpu;
        int64_t total = 0;
        for (const auto& part : parts) {
          cpu.push_back(part.second.detach().to(at::kCPU).contiguous());
          total += static_cast<int64_t>(cpu.back().nbytes());
        }
        at::Tensor bytes = at::empty({total}, at::TensorOptions().dtype(at::kByte));
        char* out = static_cast<char*>(bytes.data_ptr());
        for (const at::Tensor& part : cpu) {
          if (part.nbytes() > 0) std::memcpy(out, part.data_ptr(), part.nbytes());
          out += part.nbytes();
        }
        return bytes;
      },
      absl::StatusCode::kInvalidArgument);
}

absl::StatusOr<int64_t> StoredByteLength(const v1::TensorMeta& meta) {
  absl::StatusOr<DType> dtype = DTypeFromProto(meta.dtype());
  if (!dtype.ok() || *dtype == DType::kUnspecified) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", meta.key(), "': unknown or unspecified dtype ", static_cast<int>(meta.dtype())));
  }
  if (!meta.has_sparse()) return ByteLengthOf(*dtype, meta.shape());
  const LayoutFacts* facts = FactsOf(meta.sparse().kind());
  if (facts == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", meta.key(),
                                                   "': unknown sparse layout kind ",
                                                   static_cast<int>(meta.sparse().kind())));
  }
  RETURN_IF_ERROR(ByteLengthOf(*dtype, meta.shape()).status());  // the dense shape is sane.
  // Every part's shape is sane (no negative dimension) before CheckParts computes with it.
  int64_t total = 0;
  for (const v1::TensorPart& part : meta.sparse().parts()) {
    ASSIGN_OR_RETURN(const DType part_dtype, PartDType(meta, part));
    ASSIGN_OR_RETURN(const int64_t bytes, ByteLengthOf(part_dtype, part.shape()));
    if (__builtin_add_overflow(total, bytes, &total)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse tensor '", meta.key(), "': its parts overflow 2^63 bytes"));
    }
  }
  RETURN_IF_ERROR(CheckParts(meta, *facts));
  return total;
}

absl::StatusOr<at::Tensor> SparseTensorFromBytes(const v1::TensorMeta& meta,
                                                 absl::string_view bytes) {
  const auto data_loss = [&](const absl::Status& status) {
    return absl::DataLossError(absl::StrCat(SparseLayoutName(meta), " tensor '", meta.key(),
                                            "' cannot be rebuilt: ", status.message()));
  };
  absl::StatusOr<int64_t> length = StoredByteLength(meta);
  if (!length.ok()) return data_loss(length.status());
  if (!meta.has_sparse() || *length != static_cast<int64_t>(bytes.size())) {
    return data_loss(absl::InvalidArgumentError(absl::StrCat(
        bytes.size(), " bytes given, its parts hold ", *length)));
  }
  std::vector<at::Tensor> parts;
  size_t offset = 0;
  for (const v1::TensorPart& part : meta.sparse().parts()) {
    ASSIGN_OR_RETURN(const DType dtype, PartDType(meta, part));
    absl::StatusOr<c10::ScalarType> scalar_type = ToScalarType(dtype);
    if (!scalar_type.ok()) return data_loss(scalar_type.status());
    const std::vector<int64_t> shape(part.shape().begin(), part.shape().end());
    absl::StatusOr<at::Tensor> tensor =
        CatchTorchErrors([&] { return at::empty(shape, at::TensorOptions().dtype(*scalar_type)); });
    if (!tensor.ok()) return data_loss(tensor.status());
    if (tensor->nbytes() > 0) std::memcpy(tensor->data_ptr(), bytes.data() + offset, tensor->nbytes());
    offset += tensor->nbytes();
    parts.push_back(*std::move(tensor));
  }
  absl::StatusOr<at::Tensor> rebuilt =
      MakeSparseTensor(FactsOf(meta.sparse().kind())->layout, parts,
                       std::vector<int64_t>(meta.shape().begin(), meta.shape().end()),
                       meta.sparse().coalesced());
  if (!rebuilt.ok()) return data_loss(rebuilt.status());
  if (meta.requires_grad()) {
    RETURN_IF_ERROR(CatchTorchErrors([&] { rebuilt->requires_grad_(true); }));
  }
  return rebuilt;
}

absl::StatusOr<c10::Layout> SparseLayoutFromName(absl::string_view name) {
  absl::ConsumePrefix(&name, "torch.");
  for (const LayoutFacts& facts : kLayouts) {
    if (name == facts.name) return facts.layout;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a sparse layout"));
}

absl::StatusOr<at::Tensor> MakeSparseTensor(c10::Layout layout, const std::vector<at::Tensor>& parts,
                                            const std::vector<int64_t>& size, bool coalesced) {
  const LayoutFacts* facts = FactsOf(layout);
  const size_t expected = layout == c10::kSparse ? 2 : 3;
  if (facts == nullptr || parts.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("a sparse tensor of ", parts.size(),
                                                   " parts; its layout needs ", expected));
  }
  for (const at::Tensor& part : parts) {
    if (!part.defined() || part.layout() != c10::kStrided || !part.device().is_cpu()) {
      return absl::InvalidArgumentError("a sparse tensor's parts must be dense CPU tensors");
    }
  }
  const at::TensorOptions options =
      at::TensorOptions().dtype(parts.back().scalar_type()).layout(layout);
  return CatchTorchErrors(
      [&] {
        if (layout == c10::kSparse) {
          at::_validate_sparse_coo_tensor_args(parts[0], parts[1], size);
          at::Tensor result = at::sparse_coo_tensor(parts[0], parts[1], size, options);
          // Coalescing indices that already are sorted and unique changes nothing but the flag.
          return coalesced ? result.coalesce() : result;
        }
        at::_validate_sparse_compressed_tensor_args(parts[0], parts[1], parts[2], size, layout);
        return at::sparse_compressed_tensor(parts[0], parts[1], parts[2], size, options);
      },
      absl::StatusCode::kInvalidArgument);
}

absl::Status DenseOnlyFormatError(absl::string_view format, absl::string_view key,
                                  absl::string_view layout_name) {
  return absl::InvalidArgumentError(absl::StrCat(
      "'", key, "' is a ", layout_name, " tensor, and ", format,
      " holds dense tensors only: write a torch .pt to keep its layout, or make it dense "
      "before saving (tensor.to_dense())"));
}

absl::Status CastSparseMeta(DType dtype, v1::TensorMeta& meta) {
  if (!meta.has_sparse() || meta.sparse().parts_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", meta.key(), "' is not a sparse tensor with parts"));
  }
  meta.set_dtype(DTypeToProto(dtype));
  meta.mutable_sparse()->mutable_parts(meta.sparse().parts_size() - 1)->set_dtype(
      DTypeToProto(dtype));
  ASSIGN_OR_RETURN(const int64_t byte_length, StoredByteLength(meta));
  meta.set_byte_length(byte_length);
  return absl::OkStatus();
}

}  // namespace ckpt
