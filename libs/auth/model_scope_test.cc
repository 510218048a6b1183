#include "libs/auth/model_scope.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(ModelPatternTest, GlobsMatchWholeNames) {
  EXPECT_TRUE(ModelPatternMatches("team-a/*", "team-a/resnet"));
  EXPECT_TRUE(ModelPatternMatches("team-a/*", "team-a/"));
  EXPECT_FALSE(ModelPatternMatches("team-a/*", "team-b/resnet"));
  EXPECT_FALSE(ModelPatternMatches("team-a/*", "xteam-a/resnet"));
  EXPECT_TRUE(ModelPatternMatches("*-prod", "ranker-prod"));
  EXPECT_FALSE(ModelPatternMatches("*-prod", "ranker-prod2"));
  EXPECT_TRUE(ModelPatternMatches("m?", "m1"));
  EXPECT_FALSE(ModelPatternMatches("m?", "m12"));
  EXPECT_TRUE(ModelPatternMatches("*a*b*", "xxaxxbxx"));
  EXPECT_TRUE(ModelPatternMatches("exact", "exact"));
  EXPECT_FALSE(ModelPatternMatches("exact", "exactly"));
}

TEST(ModelScopeTest, AnEmptyScopeIsTheWholeStoreAndOthersCoverTheirPatterns) {
  EXPECT_TRUE(ModelScope().unrestricted());
  EXPECT_TRUE(ModelScope().Covers("anything"));
  EXPECT_EQ(ModelScope().Describe(), "every model");
  const ModelScope scope({"team-a-*", "shared"});
  EXPECT_FALSE(scope.unrestricted());
  EXPECT_TRUE(scope.Covers("team-a-net"));
  EXPECT_TRUE(scope.Covers("shared"));
  EXPECT_FALSE(scope.Covers("shared2"));
  EXPECT_FALSE(scope.Covers("team-b-net"));
  EXPECT_EQ(scope.Describe(), "models matching team-a-*, shared");
}

}  // namespace
}  // namespace ckpt
