#include "libs/tensor/dtype.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(DTypeTest, TableRowsAreInEnumOrder) {
  for (int value = 0; value <= kMaxDTypeValue; ++value) {
    EXPECT_EQ(static_cast<int>(GetDTypeInfo(static_cast<DType>(value)).dtype), value);
  }
}

TEST(DTypeTest, ElementSizesMatchLibTorchForEveryScalarTypeItHas) {
  for (int value = 1; value <= kMaxDTypeValue; ++value) {
    const DTypeInfo& info = GetDTypeInfo(static_cast<DType>(value));
    if (!info.scalar_type.has_value()) continue;
    EXPECT_EQ(info.element_size, c10::elementSize(*info.scalar_type)) << info.name;
    EXPECT_EQ(info.is_complex, c10::isComplexType(*info.scalar_type)) << info.name;
    EXPECT_EQ(info.is_quantized, c10::isQIntType(*info.scalar_type)) << info.name;
    EXPECT_EQ(info.is_floating_point, c10::isFloatingType(*info.scalar_type)) << info.name;
  }
}

TEST(DTypeTest, ScalarTypesRoundTrip) {
  for (c10::ScalarType scalar_type :
       {c10::kFloat, c10::kDouble, c10::kHalf, c10::kBFloat16, c10::kByte, c10::kChar, c10::kShort,
        c10::kInt, c10::kLong, c10::kBool, c10::kComplexHalf, c10::kComplexFloat,
        c10::kComplexDouble, c10::kQInt8, c10::kQUInt8, c10::kQInt32}) {
    ASSERT_OK_AND_ASSIGN(DType dtype, FromScalarType(scalar_type));
    ASSERT_OK_AND_ASSIGN(c10::ScalarType back, ToScalarType(dtype));
    EXPECT_EQ(back, scalar_type);
  }
}

TEST(DTypeTest, DTypesLibTorchLacksAreKnownButNotMaterializable) {
  EXPECT_EQ(ElementSize(DType::kFloat8E4M3Fn), 1);
  EXPECT_EQ(ElementSize(DType::kUInt64), 8);
  EXPECT_THAT(ToScalarType(DType::kFloat8E5M2),
              StatusIs(absl::StatusCode::kFailedPrecondition, "float8_e5m2"));
  EXPECT_THAT(ToScalarType(DType::kUnspecified), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseDTypeTest, AcceptsPyTorchNamesAndCommonAliases) {
  EXPECT_EQ(ParseDType("float32").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("torch.float32").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("torch.float").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("fp16").value(), DType::kFloat16);
  EXPECT_EQ(ParseDType("half").value(), DType::kFloat16);
  EXPECT_EQ(ParseDType("BF16").value(), DType::kBFloat16);
  EXPECT_EQ(ParseDType("torch.long").value(), DType::kInt64);
  EXPECT_EQ(ParseDType("bool").value(), DType::kBool);
  EXPECT_EQ(ParseDType("torch.float8_e4m3fn").value(), DType::kFloat8E4M3Fn);
  EXPECT_THAT(ParseDType("float33"), StatusIs(absl::StatusCode::kInvalidArgument, "float33"));
}

TEST(StorageNameTest, MapsTorchSaveStorageClasses) {
  EXPECT_EQ(DTypeFromStorageName("FloatStorage").value(), DType::kFloat32);
  EXPECT_EQ(DTypeFromStorageName("torch.BFloat16Storage").value(), DType::kBFloat16);
  EXPECT_EQ(DTypeFromStorageName("torch.cuda.HalfStorage").value(), DType::kFloat16);
  EXPECT_EQ(DTypeFromStorageName("LongStorage").value(), DType::kInt64);
  EXPECT_EQ(DTypeFromStorageName("BoolStorage").value(), DType::kBool);
  EXPECT_THAT(DTypeFromStorageName("torch.UntypedStorage"),
              StatusIs(absl::StatusCode::kInvalidArgument, "UntypedStorage"));
}

TEST(SafetensorsNameTest, MapsTheSpecNames) {
  EXPECT_EQ(DTypeFromSafetensorsName("F32").value(), DType::kFloat32);
  EXPECT_EQ(DTypeFromSafetensorsName("BF16").value(), DType::kBFloat16);
  EXPECT_EQ(DTypeFromSafetensorsName("BOOL").value(), DType::kBool);
  EXPECT_EQ(DTypeFromSafetensorsName("F8_E4M3").value(), DType::kFloat8E4M3Fn);
  EXPECT_EQ(GetDTypeInfo(DType::kInt64).safetensors_name, "I64");
  EXPECT_THAT(DTypeFromSafetensorsName("f32"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ByteLengthOfTest, MultipliesWithOverflowAndSignChecks) {
  EXPECT_EQ(ByteLengthOf(DType::kFloat32, {10, 512}).value(), 20480);
  EXPECT_EQ(ByteLengthOf(DType::kFloat64, {}).value(), 8);  // A scalar.
  EXPECT_EQ(ByteLengthOf(DType::kInt64, {0, 1LL << 62}).value(), 0);
  EXPECT_THAT(ByteLengthOf(DType::kFloat32, {1LL << 40, 1LL << 30}),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
  EXPECT_THAT(ByteLengthOf(DType::kFloat32, {3, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
}

}  // namespace
}  // namespace ckpt
