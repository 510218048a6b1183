// The copies themselves need a GPU (tools/gpu_check.sh runs them through the trainer's
// checkpoints and the loader). Here: what a CPU-only build says when asked for them.

#include "libs/tensor/side_stream_copies.h"

#include <string>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/testing/torch_error.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

using ::ckpt::testing::TorchErrorOf;

TEST(SideStreamCopiesTest, RefusesTheCpuAndDevicesWithoutAnIndex) {
  EXPECT_THAT(TorchErrorOf([] { SideStreamCopies copies(c10::Device("cpu")); }),
              HasSubstr("need an accelerator device with an index (e.g. cuda:0), got cpu"));
  EXPECT_THAT(TorchErrorOf([] { SideStreamCopies copies(c10::Device("cuda")); }),
              HasSubstr("got cuda"));
}

TEST(SideStreamCopiesTest, ACpuOnlyLibTorchSaysItHasNoCuda) {
  if (at::hasCUDA()) GTEST_SKIP() << "this LibTorch has CUDA; tools/gpu_check.sh covers it";
  EXPECT_THAT(TorchErrorOf([] { SideStreamCopies copies(c10::Device("cuda:0")); }),
              HasSubstr("not linked with support for cuda devices"));
}

}  // namespace
}  // namespace ckpt
