#include "libs/tensor/state_dict.h"

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

TEST(StateDictTest, KeepsInsertionOrder) {
  StateDict dict;
  ASSERT_OK(dict.Insert("z.weight", at::zeros({2})));
  ASSERT_OK(dict.Insert("a.weight", at::ones({3}), "cuda:1"));
  ASSERT_OK(dict.Insert("m.bias", at::zeros({1}, at::kLong)));
  EXPECT_THAT(dict.keys(), ElementsAre("z.weight", "a.weight", "m.bias"));
  EXPECT_EQ(dict.entry(1).original_device, "cuda:1");
  EXPECT_EQ(dict.size(), 3u);
  EXPECT_EQ(dict.TotalBytes(), 2 * 4 + 3 * 4 + 8);
}

TEST(StateDictTest, RejectsDuplicateEmptyAndUndefined) {
  StateDict dict;
  ASSERT_OK(dict.Insert("w", at::zeros({2})));
  EXPECT_THAT(dict.Insert("w", at::zeros({2})), StatusIs(absl::StatusCode::kAlreadyExists, "'w'"));
  EXPECT_THAT(dict.Insert("", at::zeros({2})), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(dict.Insert("u", at::Tensor()), StatusIs(absl::StatusCode::kInvalidArgument, "'u'"));
}

TEST(StateDictTest, FindAndInsertOrAssign) {
  StateDict dict;
  dict.InsertOrAssign("w", at::zeros({2}));
  dict.InsertOrAssign("w", at::ones({4}));
  ASSERT_NE(dict.Find("w"), nullptr);
  EXPECT_EQ(dict.Find("w")->numel(), 4);
  EXPECT_EQ(dict.Find("missing"), nullptr);
  EXPECT_EQ(dict.size(), 1u);
}

TEST(StateDictTest, WithKeysRenamesAndKeepsSharedStorage) {
  const at::Tensor shared = at::arange(4, at::kFloat);
  StateDict dict;
  ASSERT_OK(dict.Insert("module.embed.weight", shared));
  ASSERT_OK(dict.Insert("module.head.weight", shared));  // Tied weights.
  ASSERT_OK_AND_ASSIGN(StateDict renamed, dict.WithKeys({"embed.weight", "head.weight"}));
  EXPECT_THAT(renamed.keys(), ElementsAre("embed.weight", "head.weight"));
  EXPECT_TRUE(renamed.Find("embed.weight")->is_same(*renamed.Find("head.weight")));
  EXPECT_THAT(dict.WithKeys({"x", "x"}), StatusIs(absl::StatusCode::kInvalidArgument, "duplicate"));
  EXPECT_THAT(dict.WithKeys({"x"}), StatusIs(absl::StatusCode::kInvalidArgument, "1 keys"));
}

}  // namespace
}  // namespace ckpt
