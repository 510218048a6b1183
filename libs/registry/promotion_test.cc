#include "libs/registry/promotion.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/full.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_filter.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Flips one byte in the middle of the first occurrence of `bytes` in the store's pack files (where
// the RocksDB store keeps chunk bytes, libs/store/chunk_pack.h): real damage on disk, found by
// Verify. False when the bytes are in no pack.
bool FlipStoredByte(const std::string& db_path, const std::string& bytes) {
  for (const auto& entry : std::filesystem::directory_iterator(db_path + "/packs")) {
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::string contents((std::istreambuf_iterator<char>(file)),
                               std::istreambuf_iterator<char>());
    const size_t at = contents.find(bytes);
    if (at == std::string::npos) continue;
    const size_t offset = at + bytes.size() / 2;
    file.clear();
    file.seekp(static_cast<std::streamoff>(offset));
    const char flipped = static_cast<char>(contents[offset] ^ 0x40);
    file.write(&flipped, 1);
    return static_cast<bool>(file);
  }
  return false;
}

class PromotionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    options_.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options_));
  }

  // Commits a version of "m" with a commit-time metric loss=`loss`; returns its number.
  int64_t Commit(float value, double loss, std::vector<std::string> aliases = {}) {
    CommitOptions options;
    options.aliases = std::move(aliases);
    CheckpointContents contents;
    EXPECT_OK(contents.model.Insert("w", at::full({8}, value)));
    (*contents.metadata.mutable_metrics())["loss"] = loss;
    absl::StatusOr<CommitResult> committed = CommitCheckpoint(*store_, "m", contents, options);
    EXPECT_OK(committed.status());
    return committed.ok() ? committed->version.version() : 0;
  }

  void Annotate(int64_t version, const std::string& metric, double value) {
    v1::AnnotationChange change;
    (*change.mutable_set_metrics())[metric] = value;
    ASSERT_OK(store_->AnnotateVersion("m", version, change, {"eval-job", "evaluation"}).status());
  }

  static PromotionRules Rules(std::vector<std::string> conditions, bool verified = false) {
    PromotionRules rules;
    for (const std::string& condition : conditions) {
      absl::StatusOr<v1::VersionFilter::MetricRange> range = ParseMetricCondition(condition);
      EXPECT_OK(range.status());
      if (range.ok()) rules.requirements.push_back(*range);
    }
    rules.require_verified = verified;
    return rules;
  }

  int64_t AliasVersion(const std::string& alias) {
    v1::VersionRef ref;
    ref.set_model("m");
    ref.set_alias(alias);
    absl::StatusOr<v1::Manifest> manifest = store_->GetManifest(ref);
    return manifest.ok() ? manifest->version() : 0;
  }

  std::vector<v1::RegistryEvent> AliasHistory(const std::string& alias) {
    HistoryQuery query;
    query.model = "m";
    query.alias = alias;
    absl::StatusOr<std::vector<v1::RegistryEvent>> history = store_->ListHistory(query);
    EXPECT_OK(history.status());
    return history.ok() ? *history : std::vector<v1::RegistryEvent>{};
  }

  StoreOptions options_;
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(PromotionTest, RefusesWithAReasonPerFailedRuleThenPromotesOnceTheMetricsAreThere) {
  const int64_t one = Commit(1, 0.5, {"production"});
  const int64_t two = Commit(2, 0.2);
  Annotate(two, "val_acc", 0.87);

  EXPECT_THAT(Promote(*store_, "m", two, "production",
                      Rules({"val_acc>=0.9", "f1>=0.5", "loss<=0.3"}), "release"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cannot promote m@2 to production"),
                             HasSubstr("val_acc is 0.87, below 0.9"),
                             HasSubstr("it has no metric 'f1'"), Not(HasSubstr("loss")))));
  EXPECT_EQ(AliasVersion("production"), one);

  // Evaluation improves the annotation; the commit-time loss still counts.
  Annotate(two, "val_acc", 0.93);
  Annotate(two, "f1", 0.7);
  ASSERT_OK_AND_ASSIGN(PromotionResult promoted,
                       Promote(*store_, "m", two, "production",
                               Rules({"val_acc>=0.9", "f1>=0.5", "loss<=0.3"}, true), "release"));
  EXPECT_EQ(promoted.previous_version, one);
  EXPECT_EQ(promoted.reason,
            "promoted m@2: val_acc 0.93 >= 0.9, f1 0.7 >= 0.5, loss 0.2 <= 0.3, verified; release");
  EXPECT_EQ(AliasVersion("production"), two);

  const std::vector<v1::RegistryEvent> history = AliasHistory("production");
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[1].kind(), v1::RegistryEvent::ALIAS_SET);
  EXPECT_EQ(history[1].previous_version(), one);
  EXPECT_EQ(history[1].version(), two);
  EXPECT_EQ(history[1].reason(), promoted.reason);
}

TEST_F(PromotionTest, AnnotationMetricsOverrideCommitTimeOnes) {
  const int64_t one = Commit(1, 0.5);
  EXPECT_THAT(Promote(*store_, "m", one, "production", Rules({"loss<=0.3"}), ""),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("loss is 0.5, above 0.3")));
  Annotate(one, "loss", 0.25);  // re-measured on the evaluation set
  ASSERT_OK_AND_ASSIGN(PromotionResult promoted,
                       Promote(*store_, "m", one, "production", Rules({"loss<=0.3"}), ""));
  EXPECT_EQ(promoted.previous_version, 0);
  EXPECT_EQ(promoted.reason, "promoted m@1: loss 0.25 <= 0.3");
}

TEST_F(PromotionTest, RequireVerifiedRefusesAVersionWhoseStoredBytesAreDamaged) {
  CheckpointContents contents;
  const at::Tensor w = at::arange(1024, at::kFloat);  // a byte pattern found once on disk
  ASSERT_OK(contents.model.Insert("w", w));
  ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "m", contents));
  const int64_t one = committed.version.version();
  store_.reset();
  ASSERT_TRUE(FlipStoredByte(options_.db_path, std::string(static_cast<const char*>(w.data_ptr()),
                                                           static_cast<size_t>(w.nbytes()))));
  ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options_));

  EXPECT_THAT(Promote(*store_, "m", one, "production", Rules({}, true), ""),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("verification found 1 problem(s)"), HasSubstr("w: "))));
  EXPECT_EQ(AliasVersion("production"), 0);
  // Without the rule the damaged version could be promoted: the rule is what refused it.
  EXPECT_OK(Promote(*store_, "m", one, "production", Rules({}), "").status());
}

TEST_F(PromotionTest, MissingVersionsAndReservedAliasesAreRefused) {
  Commit(1, 0.1);
  EXPECT_THAT(Promote(*store_, "m", 9, "production", Rules({}), ""),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("m@9")));
  EXPECT_THAT(Promote(*store_, "m", 1, "latest", Rules({}), ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("latest")));
  EXPECT_THAT(Promote(*store_, "nope", 1, "production", Rules({}), ""),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PromotionTest, RollbackReturnsToThePreviousVersionAndASecondRollbackUndoesIt) {
  const int64_t one = Commit(1, 0.1, {"production"});
  const int64_t two = Commit(2, 0.1);
  const int64_t three = Commit(3, 0.1);
  ASSERT_OK(Promote(*store_, "m", two, "production", Rules({}), "").status());
  ASSERT_OK(Promote(*store_, "m", three, "production", Rules({}), "").status());
  // An unrelated alias's moves do not confuse it.
  ASSERT_OK(store_->SetAlias("m", "canary", one).status());

  ASSERT_OK_AND_ASSIGN(AliasMove back, Rollback(*store_, "m", "production", "bad canary"));
  EXPECT_EQ(back.from_version, three);
  EXPECT_EQ(back.to_version, two);
  EXPECT_EQ(back.reason, "rollback of production from 3 to 2; bad canary");
  EXPECT_EQ(AliasVersion("production"), two);
  const std::vector<v1::RegistryEvent> history = AliasHistory("production");
  ASSERT_EQ(history.size(), 4u);
  EXPECT_EQ(history.back().previous_version(), three);
  EXPECT_EQ(history.back().version(), two);
  EXPECT_EQ(history.back().reason(), back.reason);

  // The rollback is the newest move to 2: rolling back again undoes it.
  ASSERT_OK_AND_ASSIGN(AliasMove again, Rollback(*store_, "m", "production", ""));
  EXPECT_EQ(again.to_version, three);
  EXPECT_EQ(again.reason, "rollback of production from 2 to 3");
}

TEST_F(PromotionTest, RollbackRefusesWhenThereIsNothingToGoBackTo) {
  const int64_t one = Commit(1, 0.1, {"production"});
  EXPECT_THAT(Rollback(*store_, "m", "production", ""),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("it was created at m@1; there is no earlier version")));
  const int64_t two = Commit(2, 0.1);
  ASSERT_OK(store_->SetAlias("m", "production", two, one).status());
  ASSERT_OK(store_->DeleteVersion("m", one, false).status());
  EXPECT_THAT(
      Rollback(*store_, "m", "production", ""),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("m@1 no longer exists (deleted)")));
  EXPECT_EQ(AliasVersion("production"), two);
  EXPECT_THAT(Rollback(*store_, "m", "staging", ""), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt
