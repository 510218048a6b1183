#include "libs/io/backoff.h"

#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(BackoffTest, DoublesUpToTheCapWithoutJitter) {
  const BackoffPolicy policy{absl::Milliseconds(100), absl::Milliseconds(1000), 2.0, 0.0};
  EXPECT_EQ(Backoff::Delay(policy, 0, 0.5), absl::Milliseconds(100));
  EXPECT_EQ(Backoff::Delay(policy, 1, 0.5), absl::Milliseconds(200));
  EXPECT_EQ(Backoff::Delay(policy, 3, 0.5), absl::Milliseconds(800));
  EXPECT_EQ(Backoff::Delay(policy, 4, 0.5), absl::Milliseconds(1000));
  // A long outage neither overflows nor grows past the cap.
  EXPECT_EQ(Backoff::Delay(policy, 1000000, 0.5), absl::Milliseconds(1000));
}

TEST(BackoffTest, JitterTakesAFractionOffTheCap) {
  const BackoffPolicy full{absl::Milliseconds(100), absl::Seconds(10), 2.0, 1.0};
  EXPECT_EQ(Backoff::Delay(full, 3, 0.0), absl::Milliseconds(800));
  EXPECT_EQ(Backoff::Delay(full, 3, 0.5), absl::Milliseconds(400));
  EXPECT_EQ(Backoff::Delay(full, 3, 1.0), absl::ZeroDuration());
  const BackoffPolicy fifth{absl::Milliseconds(100), absl::Seconds(10), 2.0, 0.2};
  EXPECT_EQ(Backoff::Delay(fifth, 0, 1.0), absl::Milliseconds(80));
  EXPECT_EQ(Backoff::Delay(fifth, 0, 0.0), absl::Milliseconds(100));
}

TEST(BackoffTest, NonsensePoliciesStillWaitSanely) {
  // A negative initial waits nothing; a multiplier below 1 does not shrink the waits; a max
  // below initial is lifted to it.
  EXPECT_EQ(Backoff::Delay({absl::Milliseconds(-5), absl::Seconds(1), 2.0, 0.0}, 3, 0.0),
            absl::ZeroDuration());
  EXPECT_EQ(Backoff::Delay({absl::Milliseconds(100), absl::Seconds(1), 0.5, 0.0}, 3, 0.0),
            absl::Milliseconds(100));
  EXPECT_EQ(Backoff::Delay({absl::Milliseconds(100), absl::Milliseconds(10), 2.0, 0.0}, 3, 0.0),
            absl::Milliseconds(100));
}

TEST(BackoffTest, NextAdvancesAndResetStartsOver) {
  Backoff backoff({absl::Milliseconds(10), absl::Milliseconds(40), 2.0, 0.0},
                  absl::InfiniteFuture(), [] { return 0.0; });
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 4; ++i) waits.push_back(*backoff.Next());
  EXPECT_EQ(waits, (std::vector<absl::Duration>{absl::Milliseconds(10), absl::Milliseconds(20),
                                                absl::Milliseconds(40), absl::Milliseconds(40)}));
  EXPECT_EQ(backoff.retries(), 4);
  backoff.Reset();
  EXPECT_EQ(backoff.retries(), 0);
  EXPECT_EQ(*backoff.Next(), absl::Milliseconds(10));
}

TEST(BackoffTest, AWaitThatWouldReachTheDeadlineIsRefusedWithoutSleeping) {
  Backoff backoff({absl::Seconds(30), absl::Seconds(60), 2.0, 0.0}, absl::Now() + absl::Seconds(1),
                  [] { return 0.0; });
  const absl::Time before = absl::Now();
  EXPECT_FALSE(backoff.Wait());
  EXPECT_LT(absl::Now() - before, absl::Seconds(1));
  EXPECT_EQ(backoff.retries(), 0);

  Backoff soon({absl::Milliseconds(1), absl::Milliseconds(1), 2.0, 0.0},
               absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(soon.Wait());
  EXPECT_EQ(soon.retries(), 1);
}

}  // namespace
}  // namespace ckpt
