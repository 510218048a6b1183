#include "libs/tensor/device.h"

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(ParseDeviceTest, ParsesTypesAndIndices) {
  EXPECT_EQ(ParseDevice("cpu").value(), (DeviceSpec{"cpu", -1}));
  EXPECT_EQ(ParseDevice("cuda").value(), (DeviceSpec{"cuda", -1}));
  EXPECT_EQ(ParseDevice("cuda:1").value(), (DeviceSpec{"cuda", 1}));
  EXPECT_EQ(ParseDevice(" mps ").value(), (DeviceSpec{"mps", -1}));
  // Types this build has never heard of still parse: the checkpoint may come from one.
  EXPECT_EQ(ParseDevice("privateuseone:3").value(), (DeviceSpec{"privateuseone", 3}));
  EXPECT_EQ(ParseDevice("cuda:12").value().ToString(), "cuda:12");
}

TEST(ParseDeviceTest, RejectsMalformedNames) {
  for (const char* bad : {"", "cuda:", "cuda:-1", "cuda:x", ":1", "CUDA", "cu da", "cuda:1:2"}) {
    EXPECT_THAT(ParseDevice(bad), StatusIs(absl::StatusCode::kInvalidArgument, "bad device"))
        << bad;
  }
}

TEST(DeviceMapTest, ResolvesLikeMapLocation) {
  const DeviceSpec cuda1 = ParseDevice("cuda:1").value();
  const DeviceSpec cuda0 = ParseDevice("cuda:0").value();
  DeviceMap all_cpu = DeviceMap::AllTo(DeviceSpec::Cpu());
  EXPECT_EQ(all_cpu.Resolve(cuda1), DeviceSpec::Cpu());
  DeviceMap remap = DeviceMap::Identity();
  remap.Map(cuda1, cuda0);
  EXPECT_EQ(remap.Resolve(cuda1), cuda0);
  EXPECT_EQ(remap.Resolve(DeviceSpec::Cpu()), DeviceSpec::Cpu());
  all_cpu.Map(cuda1, cuda0);
  EXPECT_EQ(all_cpu.Resolve(cuda1), cuda0);
  EXPECT_EQ(all_cpu.Resolve(ParseDevice("mps").value()), DeviceSpec::Cpu());
}

TEST(ResolveTorchDeviceTest, CpuAlwaysResolves) {
  ASSERT_OK_AND_ASSIGN(c10::Device device, ResolveTorchDevice(DeviceSpec::Cpu()));
  EXPECT_TRUE(device.is_cpu());
}

TEST(ResolveTorchDeviceTest, UnavailableTargetsAreFailedPreconditions) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has CUDA";
  EXPECT_THAT(ResolveTorchDevice(ParseDevice("cuda:0").value()),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cuda:0 needs CUDA"));
  EXPECT_THAT(ResolveTorchDevice(ParseDevice("xla:0").value()),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not available"));
  EXPECT_THAT(ResolveTorchDevice(ParseDevice("warpdrive").value()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DTypePolicyTest, CastsOnlyFloatingTensors) {
  ASSERT_OK_AND_ASSIGN(DTypePolicy to_bf16, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  EXPECT_EQ(to_bf16.Apply(DType::kFloat32), DType::kBFloat16);
  EXPECT_EQ(to_bf16.Apply(DType::kFloat16), DType::kBFloat16);
  EXPECT_EQ(to_bf16.Apply(DType::kInt64), DType::kInt64);
  EXPECT_EQ(to_bf16.Apply(DType::kBool), DType::kBool);
  EXPECT_EQ(to_bf16.Apply(DType::kComplex64), DType::kComplex64);
  EXPECT_EQ(DTypePolicy::Keep().Apply(DType::kFloat32), DType::kFloat32);
  EXPECT_THAT(DTypePolicy::CastFloatingTo(DType::kInt8),
              StatusIs(absl::StatusCode::kInvalidArgument, "int8"));
}

TEST(PlaceTensorTest, ATensorFromAMissingDeviceLoadsOnCpu) {
  // The original device ("cuda:7") is only looked up in the map, never opened.
  const DeviceSpec original = ParseDevice("cuda:7").value();
  const DeviceSpec target = DeviceMap::AllTo(DeviceSpec::Cpu()).Resolve(original);
  const at::Tensor weights = at::arange(6, at::kFloat);
  ASSERT_OK_AND_ASSIGN(at::Tensor placed, PlaceTensor(weights, target, DTypePolicy::Keep()));
  EXPECT_TRUE(placed.is_same(weights));  // Nothing to do: no copy.

  ASSERT_OK_AND_ASSIGN(DTypePolicy to_half, DTypePolicy::CastFloatingTo(DType::kFloat16));
  ASSERT_OK_AND_ASSIGN(at::Tensor half, PlaceTensor(weights, target, to_half));
  EXPECT_EQ(half.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(half.to(at::kFloat), weights));
  const at::Tensor steps = at::arange(3, at::kLong);
  ASSERT_OK_AND_ASSIGN(at::Tensor kept, PlaceTensor(steps, target, to_half));
  EXPECT_EQ(kept.scalar_type(), at::kLong);
}

}  // namespace
}  // namespace ckpt
