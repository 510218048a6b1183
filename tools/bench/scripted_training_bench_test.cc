#include "tools/bench/scripted_training_bench.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt::bench {
namespace {

using ::ckpt::testing::StatusIs;

// The trainer prints samples/s since its first step; the rate between two steps is recovered
// from the two cumulative figures.
TEST(TrainerSamplesPerSecondTest, RecoversTheRateBetweenTwoProgressLines) {
  // 64 samples a step: the first 5 steps took 10 s (a slow warm-up), the next 30 took 15 s.
  const std::string log =
      "trainer: resnet18-shards, 2 rank(s) over gloo\n"
      "trainer: epoch 0  step 5/35  loss 2.3000  lr 0.001  32 samples/s  ETA 0:00:15\n"
      "trainer: epoch 0  step 20/35  loss 1.1000  lr 0.001  74 samples/s  ETA 0:00:08\n"
      "trainer: epoch 0  step 35/35  loss 0.5000  lr 0.001  89.6 samples/s  ETA 0:00:00\n";
  ASSERT_OK_AND_ASSIGN(const double rate, TrainerSamplesPerSecond(log, 5, 35));
  EXPECT_NEAR(rate, 30.0 * 64 / 15, 1e-9);
}

TEST(TrainerSamplesPerSecondTest, AMissingStepIsAnError) {
  EXPECT_THAT(
      TrainerSamplesPerSecond("trainer: epoch 0  step 5/35  loss 2  lr 1  32 samples/s\n", 5, 35),
      StatusIs(absl::StatusCode::kInvalidArgument, "no samples/s at steps 5 and 35"));
}

}  // namespace
}  // namespace ckpt::bench
