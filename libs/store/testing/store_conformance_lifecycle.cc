// The conformance suite's life-cycle cases (see store_conformance.h): what deleting versions,
// retention, dropping optimizer state and garbage collection free and keep, and that chunks shared
// between versions cost their bytes once.

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "gmock/gmock.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/testing/store_conformance.h"

namespace ckpt::testing {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST_P(StoreConformanceTest, FrozenBackboneCostsItsBytesOnce) {
  const at::Tensor backbone = Seeded({2 * kMiB}, 1);  // 8 MiB
  constexpr int64_t kHeadElements = 16 * 1024;        // 64 KiB
  int64_t logical = 0;
  for (int i = 0; i < 10; ++i) {
    const CommitResult committed =
        MustCommit("finetune", WeightsOnly({{"backbone.weight", backbone},
                                            {"head.weight", Seeded({kHeadElements}, 100 + i)}}));
    logical += committed.logical_bytes;
    EXPECT_EQ(committed.new_bytes, i == 0 ? 8 * kMiB + 4 * kHeadElements : 4 * kHeadElements);
  }
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  const double expected_physical = 8.0 * kMiB + 10.0 * 4 * kHeadElements;
  EXPECT_NEAR(static_cast<double>(stats.physical_bytes()), expected_physical,
              0.02 * expected_physical);
  EXPECT_EQ(stats.logical_bytes(), logical);
  EXPECT_EQ(stats.logical_bytes(), 10 * (8 * kMiB + 4 * kHeadElements));
  EXPECT_EQ(stats.chunks(), 2 + 10);
  EXPECT_EQ(stats.models(), 1);
  EXPECT_EQ(stats.versions(), 10);
  std::cout << "dedup: logical " << stats.logical_bytes() << " bytes, physical "
            << stats.physical_bytes() << " bytes, ratio "
            << static_cast<double>(stats.logical_bytes()) / stats.physical_bytes() << "\n";
}

TEST_P(StoreConformanceTest, DeleteAndGcFreeExactlyTheUnreferencedChunks) {
  const at::Tensor shared = Seeded({kMiB}, 1);  // 4 MiB, one chunk
  const at::Tensor only_v1 = Seeded({1000}, 2);
  const at::Tensor only_v2 = Seeded({2000}, 3);
  MustCommit("m", WeightsOnly({{"shared", shared}, {"mine", only_v1}}));
  MustCommit("m", WeightsOnly({{"shared", shared}, {"mine", only_v2}}));

  // Nothing is unreferenced yet.
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse nothing, store_->GarbageCollect(false));
  EXPECT_EQ(nothing.chunks_freed(), 0);

  ASSERT_OK_AND_ASSIGN(int64_t released, store_->DeleteVersion("m", 1, false));
  EXPECT_EQ(released, 4000);
  EXPECT_THAT(store_->GetManifest(Ref("m@1")), StatusIs(absl::StatusCode::kNotFound, "m@1"));

  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse dry, store_->GarbageCollect(true));
  EXPECT_EQ(dry.chunks_freed(), 1);
  EXPECT_EQ(dry.bytes_freed(), 4000);
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.chunks_freed(), 1);
  EXPECT_EQ(collected.bytes_freed(), 4000);
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse again, store_->GarbageCollect(false));
  EXPECT_EQ(again.chunks_freed(), 0);

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint v2, LoadCheckpoint(*store_, Ref("m@2")));
  ExpectSameTensor(*v2.contents.model.Find("shared"), shared, "shared");
  ExpectSameTensor(*v2.contents.model.Find("mine"), only_v2, "mine");
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(stats.chunks(), 2);
  EXPECT_EQ(stats.physical_bytes(), 4 * kMiB + 8000);
  EXPECT_EQ(stats.versions(), 1);
}

TEST_P(StoreConformanceTest, DeletingAnAliasedVersionNeedsForceAndLatestMovesBack) {
  MustCommit("m", WeightsOnly({{"w", at::full({2}, 1)}}));
  CommitOptions best;
  best.aliases = {"best"};
  MustCommit("m", WeightsOnly({{"w", at::full({2}, 2)}}), best);
  EXPECT_THAT(store_->DeleteVersion("m", 2, false),
              StatusIs(absl::StatusCode::kFailedPrecondition, "m@2 has aliases best"));
  ASSERT_OK(store_->DeleteVersion("m", 2, true).status());
  EXPECT_THAT(store_->GetManifest(Ref("m@best")), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store_->GetManifest(Ref("m")));
  EXPECT_EQ(latest.version(), 1);
  // Numbers are never reused.
  EXPECT_EQ(MustCommit("m", WeightsOnly({{"w", at::full({2}, 3)}})).version.version(), 3);
}

TEST_P(StoreConformanceTest, RetentionNeverDropsAliasedOrLatestVersions) {
  for (int i = 1; i <= 10; ++i) MustCommit("m", WeightsOnly({{"w", at::full({8}, 1.0 * i)}}));
  ASSERT_OK(store_->SetAlias("m", "best", 2, 0).status());
  v1::RetentionPolicy policy;
  policy.set_keep_last(3);
  policy.set_keep_every(4);

  ASSERT_OK_AND_ASSIGN(v1::ApplyRetentionResponse dry, store_->ApplyRetention("m", policy, true));
  EXPECT_THAT(dry.deleted_versions(), ElementsAre(1, 3, 5, 6, 7));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> before, store_->ListVersions("m"));
  EXPECT_EQ(before.size(), 10u);

  ASSERT_OK_AND_ASSIGN(v1::ApplyRetentionResponse applied,
                       store_->ApplyRetention("m", policy, false));
  EXPECT_THAT(applied.deleted_versions(), ElementsAre(1, 3, 5, 6, 7));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> after, store_->ListVersions("m"));
  std::vector<int64_t> kept;
  for (const v1::VersionInfo& info : after) kept.push_back(info.version());
  EXPECT_THAT(kept, ElementsAre(2, 4, 8, 9, 10));
  ASSERT_OK_AND_ASSIGN(at::Tensor best, ReadTensor(*store_, "m", 2, "w"));
  EXPECT_TRUE(at::equal(best, at::full({8}, 2.0)));

  // keep_last 1 still keeps the aliased version and the latest.
  policy.set_keep_last(1);
  policy.set_keep_every(0);
  ASSERT_OK_AND_ASSIGN(applied, store_->ApplyRetention("m", policy, false));
  EXPECT_THAT(applied.deleted_versions(), ElementsAre(4, 8, 9));
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.chunks_freed(), 8);
  EXPECT_EQ(collected.bytes_freed(), 8 * 32);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());

  v1::RetentionPolicy negative;
  negative.set_keep_last(-1);
  EXPECT_THAT(store_->ApplyRetention("m", negative, false),
              StatusIs(absl::StatusCode::kInvalidArgument, ">= 0"));
}

TEST_P(StoreConformanceTest, DroppingOptimizerStateKeepsWeightsAndSchedulers) {
  const at::Tensor weight = Seeded({256, 256}, 1);  // 256 KiB
  for (int i = 1; i <= 4; ++i) {
    CheckpointContents contents = WeightsOnly({{"w", weight}});
    contents.optimizer = AdamState({weight}, i, 10 * i);
    contents.scheduler = StepLrState(i);
    MustCommit("m", contents);
  }
  v1::RetentionPolicy policy;
  policy.set_drop_optimizer_state_older_than(2);
  ASSERT_OK_AND_ASSIGN(v1::ApplyRetentionResponse applied,
                       store_->ApplyRetention("m", policy, false));
  EXPECT_THAT(applied.deleted_versions(), IsEmpty());
  EXPECT_THAT(applied.optimizer_state_dropped(), ElementsAre(1, 2));

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint old, LoadCheckpoint(*store_, Ref("m@1")));
  EXPECT_FALSE(old.contents.optimizer.has_value());
  EXPECT_TRUE(old.contents.optimizer_param_names.empty());
  ASSERT_TRUE(old.contents.scheduler.has_value());
  EXPECT_EQ(*old.contents.scheduler, StepLrState(1));
  ExpectSameTensor(*old.contents.model.Find("w"), weight, "w");
  EXPECT_THAT(old.manifest.warnings(), ElementsAre(HasSubstr("optimizer state dropped")));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint recent, LoadCheckpoint(*store_, Ref("m@3")));
  ASSERT_TRUE(recent.contents.optimizer.has_value());
  EXPECT_EQ(*recent.contents.optimizer, AdamState({weight}, 3, 30));

  // Exp_avg / exp_avg_sq / step of versions 1 and 2 are now unreferenced.
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.chunks_freed(), 2 * 3);
  EXPECT_EQ(collected.bytes_freed(), 2 * (2 * 256 * 256 * 4 + 4));
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store_->ListVersions("m"));
  int64_t sum = 0;
  for (const v1::VersionInfo& info : versions) sum += info.logical_bytes();
  EXPECT_EQ(models[0].logical_bytes(), sum);
}

TEST_P(StoreConformanceTest, OpenReaderSurvivesDeleteAndGc) {
  const at::Tensor w = Seeded({kMiB / 2}, 1);
  MustCommit("m", WeightsOnly({{"w", w}}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@1")));
  ASSERT_OK(store_->DeleteVersion("m", 1, false).status());
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.chunks_freed(), 1);
  ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*reader, "w"));
  ExpectSameTensor(read, w, "w");
}

}  // namespace ckpt::testing
