#ifndef CKPT_LIBS_TENSOR_DTYPE_H_
#define CKPT_LIBS_TENSOR_DTYPE_H_

// The dtypes ckpt stores, and their names in every format it speaks: PyTorch ("torch.float32"),
// torch.save's storage classes ("FloatStorage"), safetensors ("F32") and LibTorch's ScalarType.
//
// Every dtype PyTorch can serialize is representable, including those LibTorch 1.13 has no
// ScalarType for (float8, uint16/32/64, written by newer PyTorch): those are kept as bytes, and
// ToScalarType says so.

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "c10/core/ScalarType.h"

namespace ckpt {

// Values equal ckpt.v1.DType's (proto/ckpt/v1/types.proto); never renumber.
enum class DType : int {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kUInt8 = 5,
  kInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kBool = 10,
  kComplex32 = 11,
  kComplex64 = 12,
  kComplex128 = 13,
  kQInt8 = 14,
  kQUInt8 = 15,
  kQInt32 = 16,
  kQUInt4x2 = 17,
  kQUInt2x4 = 18,
  kFloat8E4M3Fn = 19,
  kFloat8E5M2 = 20,
  kFloat8E4M3FnUz = 21,
  kFloat8E5M2FnUz = 22,
  kUInt16 = 23,
  kUInt32 = 24,
  kUInt64 = 25,
};

inline constexpr int kMaxDTypeValue = 25;

// Facts about one dtype. Names are empty where a format has no name for it.
struct DTypeInfo {
  DType dtype;
  absl::string_view name;              // "float32": ckpt's name, PyTorch's without "torch.".
  absl::string_view storage_name;      // "FloatStorage": torch.save's typed storage class.
  absl::string_view safetensors_name;  // "F32".
  int element_size;                    // bytes per element (quint4x2 / quint2x4 pack: 1).
  bool is_floating_point;              // float16/32/64, bfloat16, float8: what dtype casts touch.
  bool is_complex;
  bool is_quantized;
  std::optional<c10::ScalarType> scalar_type;  // LibTorch 1.13's, when it has one.
};

// Facts for `dtype`; kUnspecified and out-of-range values get a record with element_size 0.
const DTypeInfo& GetDTypeInfo(DType dtype);

inline int ElementSize(DType dtype) { return GetDTypeInfo(dtype).element_size; }
inline absl::string_view DTypeName(DType dtype) { return GetDTypeInfo(dtype).name; }

// Parses a dtype name as users and formats write it: "float32", "torch.float32", "float", "fp32",
// "f32", "half", "bf16", "long", ... INVALID_ARGUMENT names the unknown text.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// "FloatStorage" or "torch.FloatStorage" -> kFloat32. INVALID_ARGUMENT if unknown.
absl::StatusOr<DType> DTypeFromStorageName(absl::string_view storage_name);

// "F32" -> kFloat32. INVALID_ARGUMENT if the safetensors spec has no such dtype.
absl::StatusOr<DType> DTypeFromSafetensorsName(absl::string_view name);

// LibTorch's ScalarType for `dtype`; FAILED_PRECONDITION for dtypes LibTorch 1.13 lacks (their
// bytes are still stored and exported, only not materialized as an at::Tensor of that type).
absl::StatusOr<c10::ScalarType> ToScalarType(DType dtype);

// Every ScalarType LibTorch 1.13 has maps to a DType; INVALID_ARGUMENT for Undefined.
absl::StatusOr<DType> FromScalarType(c10::ScalarType scalar_type);

// Checked numel * element size for `shape`; INVALID_ARGUMENT on a negative dimension or overflow
// past 2^62 bytes.
absl::StatusOr<int64_t> ByteLengthOf(DType dtype, absl::Span<const int64_t> shape);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_DTYPE_H_
