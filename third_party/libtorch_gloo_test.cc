// Checks what //third_party:libtorch promises: c10d's Gloo process group is declared (via
// USE_C10D_GLOO) and works in Debian's LibTorch. Two ranks, one thread each, all-reduce over
// loopback TCP with a FileStore rendezvous.

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ATen.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace {

TEST(LibTorchGlooTest, TwoRanksAllReduceOverLoopback) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const std::string store_path = std::string(tmp) + "/gloo_rendezvous";
  constexpr int kWorldSize = 2;
  std::vector<at::Tensor> results(kWorldSize);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    ranks.emplace_back([&, rank] {
      auto store = c10::make_intrusive<c10d::FileStore>(store_path, kWorldSize);
      auto options = c10d::ProcessGroupGloo::Options::create();
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, kWorldSize, options);
      std::vector<at::Tensor> tensors = {at::full({4}, static_cast<float>(rank + 1))};
      group->allreduce(tensors)->wait();
      results[rank] = tensors[0];
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (const at::Tensor& result : results) {
    EXPECT_TRUE(at::equal(result, at::full({4}, 3.0f))) << result;
  }
}

}  // namespace
