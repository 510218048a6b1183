#include "tools/bench/stats.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt::bench {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::DoubleEq;
using ::testing::ElementsAre;

TEST(SummarizeTest, OddCountTakesTheMiddleValue) {
  const Summary summary = Summarize({3.0, 1.0, 2.0});
  EXPECT_EQ(summary.runs, 3);
  EXPECT_DOUBLE_EQ(summary.median, 2.0);
  EXPECT_DOUBLE_EQ(summary.min, 1.0);
  EXPECT_DOUBLE_EQ(summary.max, 3.0);
}

TEST(SummarizeTest, EvenCountAveragesTheMiddleTwo) {
  const Summary summary = Summarize({4.0, 1.0, 2.0, 10.0});
  EXPECT_DOUBLE_EQ(summary.median, 3.0);
  EXPECT_DOUBLE_EQ(summary.min, 1.0);
  EXPECT_DOUBLE_EQ(summary.max, 10.0);
}

TEST(SummarizeTest, EmptyInputHasNoRuns) { EXPECT_EQ(Summarize({}).runs, 0); }

TEST(FormatSummaryTest, ShowsMedianThenRange) {
  EXPECT_EQ(FormatSummary(Summarize({1.0, 1.25, 2.0}), 2), "1.25 [1.00, 2.00]");
  EXPECT_EQ(FormatSummary(Summarize({0.5}), 3), "0.500");
  EXPECT_EQ(FormatSummary(Summarize({}), 3), "-");
}

TEST(PairedRatiosTest, DividesRunByRun) {
  ASSERT_OK_AND_ASSIGN(std::vector<double> ratios, PairedRatios({2.0, 9.0}, {4.0, 3.0}));
  EXPECT_THAT(ratios, ElementsAre(DoubleEq(0.5), DoubleEq(3.0)));
}

TEST(PairedRatiosTest, RejectsMismatchedCountsAndZeroDenominators) {
  EXPECT_THAT(PairedRatios({1.0}, {1.0, 2.0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "as many numerators"));
  EXPECT_THAT(PairedRatios({1.0}, {0.0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not positive"));
}

}  // namespace
}  // namespace ckpt::bench
