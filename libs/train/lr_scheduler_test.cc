#include "libs/train/lr_scheduler.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"
#include "torch/optim/sgd.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<torch::optim::SGD> MakeSgd(double lr) {
  return std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{at::zeros({2})},
                                             torch::optim::SGDOptions(lr));
}

double GroupLr(const torch::optim::Optimizer& optimizer) {
  return optimizer.param_groups()[0].options().get_lr();
}

std::vector<std::string> Keys(const Value& dict) {
  std::vector<std::string> keys;
  for (const Value::Entry& entry : dict.entries()) keys.push_back(entry.first.string_key());
  return keys;
}

TEST(StepLrTest, LearningRatesEqualPythonStepLrBitForBit) {
  constexpr int kSteps = 25;
  auto optimizer = MakeSgd(0.1);
  SchedulerSpec spec;
  spec.kind = "step";
  spec.step_size = 4;
  spec.gamma = 0.3;  // not a power of two, so rounding differences would show.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LrScheduler> scheduler, MakeScheduler(spec, *optimizer));
  std::vector<double> ours;
  for (int i = 0; i < kSteps; ++i) {
    optimizer->step();
    scheduler->Step();
    ASSERT_EQ(GroupLr(*optimizer), scheduler->last_lr()[0]);
    ours.push_back(scheduler->last_lr()[0]);
  }

  ASSERT_OK_AND_ASSIGN(std::string output,
                       ::ckpt::testing::RunPython("libs/train/testdata/optim_check.py",
                                                  "steplr 0.1 4 0.3 " + std::to_string(kSteps)));
  std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), kSteps + 1) << output;
  // Python's own state_dict keys, in order.
  std::vector<std::string> python_keys = absl::StrSplit(lines[0], ' ');
  python_keys.erase(python_keys.begin());  // "keys"
  EXPECT_EQ(Keys(scheduler->StateDict()), python_keys);
  for (int i = 0; i < kSteps; ++i) {
    const double python_lr = std::strtod(lines[i + 1].c_str(), nullptr);  // float.hex: exact.
    EXPECT_EQ(ours[i], python_lr) << "step " << i + 1 << ": python " << lines[i + 1];
  }
  EXPECT_EQ(scheduler->last_epoch(), kSteps);
}

TEST(CosineSchedulerTest, WarmsUpLinearlyThenDecaysToMinRatio) {
  auto optimizer = MakeSgd(2.0);
  SchedulerSpec spec;
  spec.kind = "cosine";
  spec.warmup_steps = 4;
  spec.total_steps = 12;
  spec.min_lr_ratio = 0.1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LrScheduler> scheduler, MakeScheduler(spec, *optimizer));
  std::vector<double> lrs = {scheduler->last_lr()[0]};  // epoch 0, set by construction.
  for (int i = 1; i <= 20; ++i) {
    scheduler->Step();
    lrs.push_back(GroupLr(*optimizer));
  }
  EXPECT_DOUBLE_EQ(lrs[0], 0.0);
  EXPECT_DOUBLE_EQ(lrs[1], 0.5);
  EXPECT_DOUBLE_EQ(lrs[2], 1.0);
  EXPECT_DOUBLE_EQ(lrs[4], 2.0);         // warmup done: base lr.
  EXPECT_DOUBLE_EQ(lrs[8], 2.0 * 0.55);  // half way: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2.
  EXPECT_DOUBLE_EQ(lrs[12], 2.0 * 0.1);
  EXPECT_DOUBLE_EQ(lrs[20], 2.0 * 0.1);  // stays at the minimum after total_steps.
  for (int i = 5; i <= 12; ++i) EXPECT_LT(lrs[i], lrs[i - 1]) << "epoch " << i;
}

TEST(CosineSchedulerTest, WithoutWarmupStartsAtBaseLr) {
  auto optimizer = MakeSgd(0.3);
  SchedulerSpec spec;
  spec.kind = "cosine";
  spec.total_steps = 10;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LrScheduler> scheduler, MakeScheduler(spec, *optimizer));
  EXPECT_EQ(GroupLr(*optimizer), 0.3);
  Value state = scheduler->StateDict();
  EXPECT_EQ(Keys(state),
            (std::vector<std::string>{"base_lrs", "last_epoch", "verbose", "_step_count",
                                      "_get_lr_called_within_step", "_last_lr", "lr_lambdas",
                                      "warmup_steps", "total_steps", "min_lr_ratio"}));
  EXPECT_EQ(*state.Find("lr_lambdas"), Value::List({Value::None()}));
}

class SchedulerRoundTripTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SchedulerRoundTripTest, RestoredSchedulerContinuesWithIdenticalLearningRates) {
  SchedulerSpec spec;
  spec.kind = GetParam();
  spec.step_size = 3;
  spec.gamma = 0.7;
  spec.warmup_steps = 3;
  spec.total_steps = 15;
  spec.min_lr_ratio = 0.05;
  auto optimizer = MakeSgd(0.2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LrScheduler> original, MakeScheduler(spec, *optimizer));
  for (int i = 0; i < 7; ++i) original->Step();
  const Value saved = original->StateDict();

  // A fresh run configured differently: the state dict must bring everything back.
  SchedulerSpec other;
  other.kind = GetParam();
  other.step_size = 50;
  other.gamma = 0.9;
  other.total_steps = 100;
  auto fresh_optimizer = MakeSgd(1.0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LrScheduler> resumed,
                       MakeScheduler(other, *fresh_optimizer));
  ASSERT_OK(resumed->LoadStateDict(saved));
  EXPECT_EQ(resumed->StateDict(), saved);
  EXPECT_EQ(GroupLr(*fresh_optimizer), GroupLr(*optimizer));
  EXPECT_EQ(resumed->last_epoch(), 7);

  for (int i = 0; i < 15; ++i) {
    original->Step();
    resumed->Step();
    EXPECT_EQ(resumed->last_lr(), original->last_lr()) << "step " << i;
    EXPECT_EQ(GroupLr(*fresh_optimizer), GroupLr(*optimizer)) << "step " << i;
  }
  EXPECT_EQ(resumed->StateDict(), original->StateDict());
}

INSTANTIATE_TEST_SUITE_P(AllKinds, SchedulerRoundTripTest,
                         ::testing::Values("none", "step", "cosine"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(SchedulerLoadTest, RejectsStateDictOfAnotherKind) {
  auto optimizer = MakeSgd(0.1);
  SchedulerSpec step_spec;
  step_spec.kind = "step";
  ASSERT_OK_AND_ASSIGN(auto step, MakeScheduler(step_spec, *optimizer));
  SchedulerSpec cosine_spec;
  cosine_spec.kind = "cosine";
  ASSERT_OK_AND_ASSIGN(auto cosine, MakeScheduler(cosine_spec, *optimizer));
  ASSERT_OK_AND_ASSIGN(auto none, MakeScheduler(SchedulerSpec(), *optimizer));

  EXPECT_THAT(cosine->LoadStateDict(step->StateDict()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("for a 'step' scheduler, this scheduler is 'cosine'")));
  EXPECT_THAT(step->LoadStateDict(none->StateDict()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("for a 'none' scheduler, this scheduler is 'step'")));
  EXPECT_THAT(none->LoadStateDict(cosine->StateDict()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("for a 'cosine' scheduler, this scheduler is 'none'")));
}

TEST(SchedulerLoadTest, RejectsGroupCountMismatchAndMissingKeys) {
  auto optimizer = MakeSgd(0.1);
  SchedulerSpec spec;
  spec.kind = "step";
  ASSERT_OK_AND_ASSIGN(auto scheduler, MakeScheduler(spec, *optimizer));
  Value state = scheduler->StateDict();
  state.Set("base_lrs", Value::List({Value::Float(0.1), Value::Float(0.2)}));
  EXPECT_THAT(scheduler->LoadStateDict(state),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'base_lrs' has 2 entries, the optimizer has 1 param groups")));
  state = scheduler->StateDict();
  state.Set("last_epoch", Value::String("3"));
  EXPECT_THAT(scheduler->LoadStateDict(state),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'last_epoch'")));
}

TEST(MakeSchedulerTest, RejectsUnknownKindAndBadParameters) {
  auto optimizer = MakeSgd(0.1);
  SchedulerSpec spec;
  spec.kind = "exponential";
  EXPECT_THAT(MakeScheduler(spec, *optimizer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("none, step, cosine")));
  spec.kind = "step";
  spec.step_size = 0;
  EXPECT_THAT(MakeScheduler(spec, *optimizer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step_size must be > 0")));
  spec.kind = "cosine";
  spec.warmup_steps = 2000;
  EXPECT_THAT(MakeScheduler(spec, *optimizer), StatusIs(absl::StatusCode::kInvalidArgument,
                                                        HasSubstr("warmup_steps <= total_steps")));
}

TEST(NoneSchedulerTest, NeverChangesLearningRate) {
  auto optimizer = MakeSgd(0.25);
  ASSERT_OK_AND_ASSIGN(auto scheduler, MakeScheduler(SchedulerSpec(), *optimizer));
  for (int i = 0; i < 5; ++i) scheduler->Step();
  EXPECT_EQ(GroupLr(*optimizer), 0.25);
  EXPECT_EQ(scheduler->last_epoch(), 5);
  EXPECT_EQ(*scheduler->StateDict().Find("base_lrs"), Value::List({Value::Float(0.25)}));
}

}  // namespace
}  // namespace ckpt::train
