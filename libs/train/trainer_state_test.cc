#include "libs/train/trainer_state.h"

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::StatusIs;

TEST(TrainerStateTest, EveryFieldSurvivesEncodeAndDecode) {
  TrainerState state;
  state.epoch = 3;
  state.sampler_position = 48;
  state.global_step = 120;
  state.target_step = 300;
  state.world_size = 2;
  state.backend = "gloo";
  state.seed = 1234;
  state.batch_size = 16;
  state.accumulation_steps = 2;
  state.model.kind = "transformer";
  state.model.hidden = 32;
  state.model.layers = 3;
  state.model.heads = 2;
  state.model.path = "/teams/vision/net.ts";  // as a scripted model's spec would carry
  state.model.loss = "mse";
  state.data = "pt:/data/tokens.pt";
  state.eval_fraction = 0.125;
  state.rng_cpu = at::arange(10, at::kByte);
  state.rng_device = at::arange(16, at::kByte);  // a CUDA generator's: seed and offset.
  const Value extra = EncodeTrainerState(state);
  ASSERT_NE(extra.Find(kTrainerStateKey), nullptr);
  ASSERT_OK_AND_ASSIGN(TrainerState decoded, DecodeTrainerState(extra, "m@1"));
  EXPECT_EQ(decoded.epoch, 3);
  EXPECT_EQ(decoded.sampler_position, 48);
  EXPECT_EQ(decoded.global_step, 120);
  EXPECT_EQ(decoded.target_step, 300);
  EXPECT_EQ(decoded.world_size, 2);
  EXPECT_EQ(decoded.backend, "gloo");
  EXPECT_EQ(decoded.seed, 1234u);
  EXPECT_EQ(decoded.batch_size, 16);
  EXPECT_EQ(decoded.accumulation_steps, 2);
  EXPECT_EQ(decoded.model.kind, "transformer");
  EXPECT_EQ(decoded.model.hidden, 32);
  EXPECT_EQ(decoded.model.layers, 3);
  EXPECT_EQ(decoded.model.heads, 2);
  EXPECT_EQ(decoded.model.path, "/teams/vision/net.ts");
  EXPECT_EQ(decoded.model.loss, "mse");
  EXPECT_EQ(decoded.data, "pt:/data/tokens.pt");
  EXPECT_EQ(decoded.eval_fraction, 0.125);
  EXPECT_TRUE(at::equal(decoded.rng_cpu, state.rng_cpu));
  EXPECT_TRUE(at::equal(decoded.rng_device, state.rng_device));
}

TEST(TrainerStateTest, OlderVersionsWithoutTheGoalOrWorldSizeGetDefaults) {
  const Value extra =
      Value::Dict({{kTrainerStateKey, Value::Dict({{"global_step", Value::Int(40)}})}});
  ASSERT_OK_AND_ASSIGN(TrainerState decoded, DecodeTrainerState(extra, "m@1"));
  EXPECT_EQ(decoded.target_step, 40);
  EXPECT_EQ(decoded.world_size, 0);  // unknown.
  EXPECT_EQ(decoded.eval_fraction, 0);
  EXPECT_FALSE(decoded.rng_cpu.defined());
  EXPECT_FALSE(decoded.rng_device.defined());  // a CPU run, or written before it was recorded.
}

TEST(TrainerStateTest, AVersionTheTrainerDidNotWriteIsAPreconditionError) {
  EXPECT_THAT(
      DecodeTrainerState(Value::Dict({{"best_acc", Value::Float(0.5)}}), "imported@2").status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "imported@2 was not written by the trainer"));
  EXPECT_THAT(DecodeTrainerState(Value(), "x@1").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no 'trainer' dict"));
}

}  // namespace
}  // namespace ckpt::train
