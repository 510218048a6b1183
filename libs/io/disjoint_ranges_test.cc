#include "libs/io/disjoint_ranges.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(DisjointRangesTest, TouchingRangesAreFineOverlapsAreRefusedAndClaimNothing) {
  DisjointRanges ranges;
  EXPECT_TRUE(ranges.Claim(100, 200));
  EXPECT_TRUE(ranges.Claim(200, 300));  // touches, does not overlap.
  EXPECT_TRUE(ranges.Claim(0, 100));
  EXPECT_FALSE(ranges.Claim(150, 160));  // inside a claim.
  EXPECT_FALSE(ranges.Claim(50, 150));   // across the start of one.
  EXPECT_FALSE(ranges.Claim(290, 400));  // across the end of one.
  EXPECT_FALSE(ranges.Claim(0, 1000));   // over several.
  // The refused claims left nothing behind.
  EXPECT_TRUE(ranges.Claim(300, 400));
  EXPECT_TRUE(ranges.Claim(250, 250));  // empty.
}

}  // namespace
}  // namespace ckpt
