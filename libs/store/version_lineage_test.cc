#include "libs/store/version_lineage.h"

#include <memory>
#include <string>

#include "ATen/core/Tensor.h"
#include "ATen/ops/randn.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

class VersionLineageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    // base@1 <- ft@1 (fine-tuned) <- ft@2 (resumed); base@1 <- small@1 (distilled);
    // orphan@1's parent was deleted.
    Commit("base", "", "", "run-base");
    Commit("ft", "base@1", "fine_tuned_from", "run-ft");
    Commit("ft", "ft@1", "resumed_from", "run-ft-2");
    Commit("small", "base@1", "distilled_from", "run-small");
    Commit("gone", "", "", "run-gone");
    Commit("orphan", "gone@1", "fine_tuned_from", "run-orphan");
    ASSERT_OK(store_->DeleteVersion("gone", 1, /*force=*/true).status());
  }

  void Commit(const std::string& model, const std::string& parent, const std::string& relation,
              const std::string& run_id) {
    CheckpointContents contents;
    contents.model.InsertOrAssign("w", at::randn({4}));
    v1::Lineage& lineage = *contents.metadata.mutable_lineage();
    lineage.set_parent(parent);
    lineage.set_parent_relation(relation);
    lineage.set_run_id(run_id);
    ASSERT_OK(CommitCheckpoint(*store_, model, contents).status());
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(VersionLineageTest, AncestorsNearestFirstAcrossModels) {
  ASSERT_OK_AND_ASSIGN(VersionLineage lineage, LineageOf(*store_, *ParseVersionRef("ft@latest")));
  EXPECT_EQ(lineage.version, "ft@2");
  EXPECT_EQ(lineage.lineage.run_id(), "run-ft-2");
  ASSERT_EQ(lineage.ancestors.size(), 2u);
  EXPECT_EQ(lineage.ancestors[0].version, "ft@1");
  EXPECT_EQ(lineage.ancestors[0].relation, "resumed_from");
  EXPECT_EQ(lineage.ancestors[0].run_id, "run-ft");
  EXPECT_EQ(lineage.ancestors[1].version, "base@1");
  EXPECT_EQ(lineage.ancestors[1].relation, "fine_tuned_from");
  EXPECT_EQ(lineage.ancestors[1].state, "ok");
  EXPECT_TRUE(lineage.children.empty());
}

TEST_F(VersionLineageTest, ChildrenAreEveryVersionNamingItAsParent) {
  ASSERT_OK_AND_ASSIGN(VersionLineage lineage, LineageOf(*store_, *ParseVersionRef("base@1")));
  EXPECT_TRUE(lineage.ancestors.empty());
  ASSERT_EQ(lineage.children.size(), 2u);
  EXPECT_EQ(lineage.children[0].version, "ft@1");
  EXPECT_EQ(lineage.children[0].relation, "fine_tuned_from");
  EXPECT_EQ(lineage.children[1].version, "small@1");
  EXPECT_EQ(lineage.children[1].relation, "distilled_from");
}

TEST_F(VersionLineageTest, ADeletedParentIsMissingAndAnUnknownVersionAnError) {
  ASSERT_OK_AND_ASSIGN(VersionLineage lineage, LineageOf(*store_, *ParseVersionRef("orphan@1")));
  ASSERT_EQ(lineage.ancestors.size(), 1u);
  EXPECT_EQ(lineage.ancestors[0].version, "gone@1");
  EXPECT_EQ(lineage.ancestors[0].state, "missing");
  EXPECT_THAT(LineageOf(*store_, *ParseVersionRef("ft@9")).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt
