#include "libs/store/scoped_store.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_macros.h"
#include "libs/status/status_matchers.h"
#include "libs/store/audited_store.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/store_conformance.h"

namespace ckpt {
namespace testing {
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
}  // namespace testing

namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::Ref;
using ::ckpt::testing::Seeded;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::WeightsOnly;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr int64_t kMiB = 1 << 20;

// A store holding team-a's and team-b's models, where team-b's "b-net@1" holds the very backbone
// team-a commits later (the case where store-wide deduplication would tell team-a about it).
class ScopedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = ::testing::TempDir() + "/scoped_store_test_" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(options.db_path);
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    AuditedStore team_b(*store_, {"team-b", "ipv4:10.0.0.2:1"});
    ASSERT_OK(CommitCheckpoint(team_b, "team-b-net", WeightsOnly({{"backbone", backbone_},
                                                               {"head", Seeded({1000}, 2)}}))
                  .status());
    ASSERT_OK(team_b.SetAlias("team-b-net", "production", 1).status());
    AuditedStore team_a(*store_, {"team-a", "ipv4:10.0.0.1:1"});
    ASSERT_OK(CommitCheckpoint(team_a, "team-a-net", WeightsOnly({{"own", Seeded({kMiB / 4}, 3)}}))
                  .status());
  }

  // What team-a's calls go through in the store service: audited, over its scope.
  std::unique_ptr<AuditedStore> TeamA() {
    return std::make_unique<AuditedStore>(
        std::make_unique<ScopedStore>(*store_, ModelScope({"team-a-*"}), "identity 'team-a'"),
        AuditedStore::Actor{"team-a", "ipv4:10.0.0.1:1"});
  }

  const at::Tensor backbone_ = Seeded({kMiB}, 1);  // 4 MiB: one chunk
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(ScopedStoreTest, ListsOnlyItsModelsAndIsRefusedOthersByName) {
  ScopedStore scoped(*store_, ModelScope({"team-a-*"}), "identity 'team-a'");
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, scoped.ListModels());
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name(), "team-a-net");
  EXPECT_THAT(scoped.GetManifest(Ref("team-b-net@1")),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "identity 'team-a' may not read model 'team-b-net': it may see only "
                       "models matching team-a-*"));
  EXPECT_THAT(scoped.OpenVersion(Ref("team-b-net@production")).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(scoped.ListVersions("team-b-net").status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(scoped.SetAlias("team-b-net", "production", 1).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(scoped.RenameModel("team-a-net", "team-b-stolen", {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("team-b-stolen")));
  EXPECT_THAT(scoped.RenameModel("team-b-net", "team-a-stolen", {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("'team-b-net'")));
  EXPECT_THAT(scoped.GarbageCollect(/*dry_run=*/true).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("every model's chunks")));
  HistoryQuery everything;
  EXPECT_THAT(scoped.ListHistory(everything).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("name the model")));
  v1::WatchRequest watch_all;
  EXPECT_THAT(scoped.Watch(watch_all).status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(scoped.GetRegistryState({}).status(), StatusIs(absl::StatusCode::kPermissionDenied));
  ASSERT_OK_AND_ASSIGN(RegistryState state, scoped.GetRegistryState({"team-a-net"}));
  EXPECT_EQ(state.models.size(), 1u);
}

TEST_F(ScopedStoreTest, AnUnrestrictedScopeSeesTheWholeStore) {
  ScopedStore everything(*store_, ModelScope(), "identity 'ops'");
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, everything.ListModels());
  EXPECT_EQ(models.size(), 2u);
  ASSERT_OK_AND_ASSIGN(v1::StoreStats scoped_stats, everything.GetStats());
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(scoped_stats.SerializeAsString(), stats.SerializeAsString());
  EXPECT_OK(everything.GarbageCollect(/*dry_run=*/true).status());
}

TEST_F(ScopedStoreTest, ContentOfOtherTeamsIsNeverReportedPresentNorDeduplicated) {
  ASSERT_OK_AND_ASSIGN(v1::Manifest theirs, store_->GetManifest(Ref("team-b-net@1")));
  const std::string their_backbone = theirs.tensors(0).chunks(0).sha256();
  ASSERT_OK_AND_ASSIGN(v1::Manifest mine, store_->GetManifest(Ref("team-a-net@1")));
  const std::string my_chunk = mine.tensors(0).chunks(0).sha256();
  // The store holds both; team-a is told only of its own.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> store_missing,
                       store_->FindMissingChunks({their_backbone, my_chunk}));
  EXPECT_THAT(store_missing, IsEmpty());
  std::unique_ptr<AuditedStore> team_a = TeamA();
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> missing,
                       team_a->FindMissingChunks({their_backbone, my_chunk}));
  EXPECT_THAT(missing, ElementsAre(their_backbone));

  // Team-a commits team-b's backbone: to team-a every byte is new, in the answer and the audit
  // record, though the store keeps the chunk once.
  ASSERT_OK_AND_ASSIGN(v1::StoreStats before, store_->GetStats());
  ASSERT_OK_AND_ASSIGN(
      CommitResult first,
      CommitCheckpoint(*team_a, "team-a-copy", WeightsOnly({{"backbone", backbone_}})));
  EXPECT_EQ(first.new_bytes, 4 * kMiB);
  ASSERT_OK_AND_ASSIGN(v1::StoreStats after, store_->GetStats());
  EXPECT_EQ(after.physical_bytes(), before.physical_bytes());
  // A second copy in its own scope is deduplicated, and says so.
  ASSERT_OK_AND_ASSIGN(
      CommitResult second,
      CommitCheckpoint(*team_a, "team-a-copy", WeightsOnly({{"backbone", backbone_}})));
  EXPECT_EQ(second.new_bytes, 0);
  AuditQuery copies;
  copies.model = "team-a-copy";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store_->ListAudit(copies));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_THAT(records[0].detail(), HasSubstr("4194304 bytes, 4194304 new"));
  EXPECT_THAT(records[1].detail(), HasSubstr("4194304 bytes, 0 new"));
  // Now the backbone is referenced in scope, it is present for team-a.
  ASSERT_OK_AND_ASSIGN(missing, team_a->FindMissingChunks({their_backbone}));
  EXPECT_THAT(missing, IsEmpty());
}

TEST_F(ScopedStoreTest, ReferencesOnlyChunksItsVersionsReference) {
  ASSERT_OK_AND_ASSIGN(v1::Manifest theirs, store_->GetManifest(Ref("team-b-net@1")));
  ASSERT_OK_AND_ASSIGN(v1::Manifest mine, store_->GetManifest(Ref("team-a-net@1")));
  const v1::TensorMeta& their_meta = theirs.tensors(0);
  const v1::TensorMeta& my_meta = mine.tensors(0);
  std::unique_ptr<AuditedStore> team_a = TeamA();
  auto reference = [&](const v1::TensorMeta& meta) -> absl::Status {
    v1::Manifest header;
    v1::TensorMeta* copy = header.add_tensors();
    *copy = meta;
    copy->clear_chunks();
    copy->clear_content_hash();
    ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                     team_a->BeginUpload("team-a-copy", header, {}));
    int64_t offset = 0;
    for (const v1::ChunkRef& chunk : meta.chunks()) {
      RETURN_IF_ERROR(session->AddStoredChunk(0, offset, chunk.sha256(), chunk.length()));
      offset += chunk.length();
    }
    return session->Commit().status();
  };
  // Holding team-b's chunk address is not enough to copy its bytes, and the answer is the one a
  // chunk the store lacks gets.
  EXPECT_THAT(reference(their_meta),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no version of models matching team-a-* references chunk")));
  ASSERT_OK(reference(my_meta));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> copies, store_->ListVersions("team-a-copy"));
  EXPECT_EQ(copies.size(), 1u);
}

TEST_F(ScopedStoreTest, ReadsChunksOnlyItsVersionsReference) {
  ASSERT_OK_AND_ASSIGN(v1::Manifest theirs, store_->GetManifest(Ref("team-b-net@1")));
  ScopedStore scoped(*store_, ModelScope({"team-a-*"}), "identity 'team-a'");
  // A forged TensorMeta naming team-b's chunk reads nothing.
  EXPECT_THAT(scoped.ReadTensorChunks(theirs.tensors(0),
                                      [](int64_t, absl::string_view) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no version of")));
  ASSERT_OK_AND_ASSIGN(v1::Manifest mine, store_->GetManifest(Ref("team-a-net@1")));
  int64_t read = 0;
  ASSERT_OK(scoped.ReadTensorChunks(mine.tensors(0), [&](int64_t, absl::string_view bytes) {
    read += bytes.size();
    return absl::OkStatus();
  }));
  EXPECT_EQ(read, mine.tensors(0).byte_length());
}

TEST_F(ScopedStoreTest, StatsVerifyAndAuditCoverOnlyTheScope) {
  std::unique_ptr<AuditedStore> team_a = TeamA();
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, team_a->GetStats());
  ASSERT_OK_AND_ASSIGN(v1::Manifest mine, store_->GetManifest(Ref("team-a-net@1")));
  EXPECT_EQ(stats.models(), 1);
  EXPECT_EQ(stats.versions(), 1);
  EXPECT_EQ(stats.logical_bytes(), kMiB);
  EXPECT_EQ(stats.chunks(), mine.tensors(0).chunks_size());
  EXPECT_EQ(stats.physical_bytes(), kMiB);
  EXPECT_EQ(stats.uploads_in_progress(), 0);

  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, team_a->Verify("", 0));
  EXPECT_EQ(verified.bytes_checked(), kMiB);
  EXPECT_THAT(verified.problems(), IsEmpty());
  // It says what it covered: team-a's model, not the whole store.
  EXPECT_FALSE(verified.whole_store());
  EXPECT_THAT(verified.models(), ::testing::ElementsAre("team-a-net"));
  EXPECT_EQ(verified.versions_checked(), 1);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse whole, store_->Verify("", 0));
  EXPECT_TRUE(whole.whole_store());
  EXPECT_EQ(whole.models_size(), 2);
  EXPECT_EQ(whole.versions_checked(), 2);
  EXPECT_THAT(team_a->Verify("team-b-net", 0).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));

  // The whole log holds both teams' records (and a garbage collection naming no model); team-a
  // reads only its own, in pages that still fill up.
  AuditedStore ops(*store_, {"ops", "local"});
  ASSERT_OK(ops.GarbageCollect(/*dry_run=*/false).status());
  for (int i = 0; i < 5; ++i) {
    AuditedStore team_b(*store_, {"team-b", "ipv4:10.0.0.2:1"});
    ASSERT_OK(team_b.SetAlias("team-b-net", "candidate", 1).status());
    ASSERT_OK(team_a->SetAlias("team-a-net", "candidate", 1).status());
  }
  AuditQuery all;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> everything, store_->ListAudit(all));
  EXPECT_EQ(everything.size(), 1u + 1u + 1u + 1u + 10u);  // 2 commits, alias, GC, 10 aliases
  AuditQuery page;
  page.limit = 4;
  std::vector<std::string> seen;
  while (true) {
    ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, team_a->ListAudit(page));
    for (const v1::AuditRecord& record : records) {
      EXPECT_EQ(record.model(), "team-a-net") << record.ShortDebugString();
      seen.push_back(record.action());
    }
    if (static_cast<int64_t>(records.size()) < page.limit) break;
    page.after_sequence = records.back().sequence();
  }
  EXPECT_EQ(seen.size(), 6u);  // its commit and five alias moves
  AuditQuery theirs;
  theirs.model = "team-b-net";
  EXPECT_THAT(team_a->ListAudit(theirs).status(), StatusIs(absl::StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace ckpt
