#include "libs/tensor/dtype.h"

#include <array>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"

namespace ckpt {
namespace {

using ST = c10::ScalarType;

// One row per DType value, in enum order (checked by dtype_test).
constexpr std::array<DTypeInfo, kMaxDTypeValue + 1> kDTypes = {{
    {DType::kUnspecified, "unspecified", "", "", 0, false, false, false, std::nullopt},
    {DType::kFloat32, "float32", "FloatStorage", "F32", 4, true, false, false, ST::Float},
    {DType::kFloat64, "float64", "DoubleStorage", "F64", 8, true, false, false, ST::Double},
    {DType::kFloat16, "float16", "HalfStorage", "F16", 2, true, false, false, ST::Half},
    {DType::kBFloat16, "bfloat16", "BFloat16Storage", "BF16", 2, true, false, false, ST::BFloat16},
    {DType::kUInt8, "uint8", "ByteStorage", "U8", 1, false, false, false, ST::Byte},
    {DType::kInt8, "int8", "CharStorage", "I8", 1, false, false, false, ST::Char},
    {DType::kInt16, "int16", "ShortStorage", "I16", 2, false, false, false, ST::Short},
    {DType::kInt32, "int32", "IntStorage", "I32", 4, false, false, false, ST::Int},
    {DType::kInt64, "int64", "LongStorage", "I64", 8, false, false, false, ST::Long},
    {DType::kBool, "bool", "BoolStorage", "BOOL", 1, false, false, false, ST::Bool},
    {DType::kComplex32, "complex32", "ComplexHalfStorage", "", 4, false, true, false,
     ST::ComplexHalf},
    {DType::kComplex64, "complex64", "ComplexFloatStorage", "C64", 8, false, true, false,
     ST::ComplexFloat},
    {DType::kComplex128, "complex128", "ComplexDoubleStorage", "", 16, false, true, false,
     ST::ComplexDouble},
    {DType::kQInt8, "qint8", "QInt8Storage", "", 1, false, false, true, ST::QInt8},
    {DType::kQUInt8, "quint8", "QUInt8Storage", "", 1, false, false, true, ST::QUInt8},
    {DType::kQInt32, "qint32", "QInt32Storage", "", 4, false, false, true, ST::QInt32},
    {DType::kQUInt4x2, "quint4x2", "QUInt4x2Storage", "", 1, false, false, true, ST::QUInt4x2},
    {DType::kQUInt2x4, "quint2x4", "QUInt2x4Storage", "", 1, false, false, true, ST::QUInt2x4},
    {DType::kFloat8E4M3Fn, "float8_e4m3fn", "Float8_e4m3fnStorage", "F8_E4M3", 1, true, false,
     false, std::nullopt},
    {DType::kFloat8E5M2, "float8_e5m2", "Float8_e5m2Storage", "F8_E5M2", 1, true, false, false,
     std::nullopt},
    {DType::kFloat8E4M3FnUz, "float8_e4m3fnuz", "Float8_e4m3fnuzStorage", "", 1, true, false, false,
     std::nullopt},
    {DType::kFloat8E5M2FnUz, "float8_e5m2fnuz", "Float8_e5m2fnuzStorage", "", 1, true, false, false,
     std::nullopt},
    {DType::kUInt16, "uint16", "UInt16Storage", "U16", 2, false, false, false, std::nullopt},
    {DType::kUInt32, "uint32", "UInt32Storage", "U32", 4, false, false, false, std::nullopt},
    {DType::kUInt64, "uint64", "UInt64Storage", "U64", 8, false, false, false, std::nullopt},
}};

// Other spellings users and PyTorch use (torch.float == torch.float32, torch.half, ...).
struct Alias {
  absl::string_view alias;
  DType dtype;
};
constexpr Alias kAliases[] = {
    {"float", DType::kFloat32},      {"fp32", DType::kFloat32},
    {"f32", DType::kFloat32},        {"double", DType::kFloat64},
    {"fp64", DType::kFloat64},       {"f64", DType::kFloat64},
    {"half", DType::kFloat16},       {"fp16", DType::kFloat16},
    {"f16", DType::kFloat16},        {"bf16", DType::kBFloat16},
    {"byte", DType::kUInt8},         {"u8", DType::kUInt8},
    {"char", DType::kInt8},          {"i8", DType::kInt8},
    {"short", DType::kInt16},        {"i16", DType::kInt16},
    {"int", DType::kInt32},          {"i32", DType::kInt32},
    {"long", DType::kInt64},         {"i64", DType::kInt64},
    {"chalf", DType::kComplex32},    {"cfloat", DType::kComplex64},
    {"cdouble", DType::kComplex128},
};

}  // namespace

const DTypeInfo& GetDTypeInfo(DType dtype) {
  const int index = static_cast<int>(dtype);
  if (index < 0 || index > kMaxDTypeValue) return kDTypes[0];
  return kDTypes[index];
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  absl::string_view bare = lower;
  absl::ConsumePrefix(&bare, "torch.");
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype != DType::kUnspecified && bare == info.name) return info.dtype;
  }
  for (const Alias& alias : kAliases) {
    if (bare == alias.alias) return alias.dtype;
  }
  std::vector<absl::string_view> known;
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype != DType::kUnspecified) known.push_back(info.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name,
                                                 "'; expected one of: ", absl::StrJoin(known, ", "),
                                                 " (or fp32, fp16, bf16, half, long, ...)"));
}

absl::StatusOr<DType> DTypeFromStorageName(absl::string_view storage_name) {
  absl::string_view bare = storage_name;
  absl::ConsumePrefix(&bare, "torch.");
  absl::ConsumePrefix(&bare, "cuda.");  // Pre-1.6 files name torch.cuda.FloatStorage.
  for (const DTypeInfo& info : kDTypes) {
    if (!info.storage_name.empty() && bare == info.storage_name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown storage type '", storage_name, "' (expected e.g. torch.FloatStorage)"));
}

absl::StatusOr<DType> DTypeFromSafetensorsName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (!info.safetensors_name.empty() && name == info.safetensors_name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown safetensors dtype '", name, "' (expected e.g. F32, BF16, I64, BOOL)"));
}

absl::StatusOr<c10::ScalarType> ToScalarType(DType dtype) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  if (dtype == DType::kUnspecified || info.dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype value ", static_cast<int>(dtype), " is not a dtype"));
  }
  if (!info.scalar_type.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("dtype ", info.name,
                     " has no LibTorch 1.13 ScalarType; its bytes can be stored and "
                     "exported but not materialized as an at::Tensor here"));
  }
  return *info.scalar_type;
}

absl::StatusOr<DType> FromScalarType(c10::ScalarType scalar_type) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.scalar_type == scalar_type) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("ScalarType ", c10::toString(scalar_type), " has no ckpt dtype"));
}

absl::StatusOr<int64_t> ByteLengthOf(DType dtype, absl::Span<const int64_t> shape) {
  constexpr int64_t kMaxBytes = int64_t{1} << 62;
  const int element_size = ElementSize(dtype);
  if (element_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype value ", static_cast<int>(dtype), " has no element size"));
  }
  int64_t bytes = element_size;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", dim, " in shape [", absl::StrJoin(shape, ", "), "]"));
    }
    if (dim != 0 && bytes > kMaxBytes / dim) {
      return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] of ",
                                                     DTypeName(dtype), " overflows 2^62 bytes"));
    }
    bytes *= dim;
  }
  return bytes;
}

}  // namespace ckpt
