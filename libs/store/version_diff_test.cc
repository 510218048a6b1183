#include "libs/store/version_diff.h"

#include <cstdlib>
#include <string>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

TEST(DiffVersionsTest, ReportsAddedRemovedChangedAndUnchanged) {
  StoreOptions options;
  options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/diff";
  ASSERT_OK_AND_ASSIGN(auto store, RocksDbCheckpointStore::Open(options));

  CheckpointContents first;
  ASSERT_OK(first.model.Insert("backbone.weight", at::arange(12, at::kFloat).reshape({3, 4})));
  ASSERT_OK(first.model.Insert("head.weight", at::zeros({2, 4})));
  ASSERT_OK(first.model.Insert("head.bias", at::zeros({2})));
  ASSERT_OK(first.model.Insert("old.buffer", at::ones({1}, at::kLong)));
  ASSERT_OK(CommitCheckpoint(*store, "m", first).status());

  CheckpointContents second;
  ASSERT_OK(second.model.Insert("backbone.weight", at::arange(12, at::kFloat).reshape({3, 4})));
  at::Tensor head = at::zeros({2, 4});
  head[1][2] = -0.75;
  ASSERT_OK(second.model.Insert("head.weight", head));
  ASSERT_OK(second.model.Insert("head.bias", at::zeros({3})));
  ASSERT_OK(second.model.Insert("new.mask", at::ones({2}, at::kBool)));
  ASSERT_OK(CommitCheckpoint(*store, "m", second).status());

  ASSERT_OK_AND_ASSIGN(VersionDiff diff, DiffVersions(*store, ParseVersionRef("m@1").value(),
                                                      ParseVersionRef("m@2").value()));
  EXPECT_EQ(diff.a, "m@1");
  EXPECT_EQ(diff.b, "m@2");
  EXPECT_THAT(diff.added, ElementsAre("new.mask"));
  EXPECT_THAT(diff.removed, ElementsAre("old.buffer"));
  EXPECT_EQ(diff.unchanged, 1);
  ASSERT_EQ(diff.changed.size(), 2u);
  EXPECT_EQ(diff.changed[0].key, "head.weight");
  ASSERT_TRUE(diff.changed[0].max_abs_difference.has_value());
  EXPECT_DOUBLE_EQ(*diff.changed[0].max_abs_difference, 0.75);
  EXPECT_EQ(diff.changed[1].key, "head.bias");
  EXPECT_THAT(diff.changed[1].shape_a, ElementsAre(2));
  EXPECT_THAT(diff.changed[1].shape_b, ElementsAre(3));
  EXPECT_FALSE(diff.changed[1].max_abs_difference.has_value());

  EXPECT_THAT(DiffVersions(*store, ParseVersionRef("m@1").value(), ParseVersionRef("m@9").value()),
              StatusIs(absl::StatusCode::kNotFound, "m@9"));
}

}  // namespace
}  // namespace ckpt
