// AuditedStore over a real RocksDB store: what it records for each change, the producer of a
// commit, refusing a change whose audit record cannot be written, and the whole CheckpointStore
// contract (the conformance suite) through it.

#include "libs/store/audited_store.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

using ::ckpt::testing::OneTensorHeader;
using ::ckpt::testing::Ref;
using ::ckpt::testing::Seeded;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::WeightsOnly;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// What a full disk or a broken store would do to the audit log alone.
struct FlakyAuditStore {
  explicit FlakyAuditStore(CheckpointStore& base) : store(&base) {
    store.set_audit_fault([this](absl::string_view method) {
      if (method == "BeginAudit" && fail_begin) {
        return absl::ResourceExhaustedError("no space left for the audit record");
      }
      if (method == "FinishAudit" && fail_finish) {
        return absl::UnavailableError("the audit log went away");
      }
      return absl::OkStatus();
    });
  }
  operator CheckpointStore&() { return store; }  // NOLINT: stands in for the store in tests.
  InstrumentedStore store;
  bool fail_begin = false;
  bool fail_finish = false;
};

class AuditedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    StoreOptions options;
    options.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options.abandoned_upload_grace = absl::ZeroDuration();
    ASSERT_OK_AND_ASSIGN(rocksdb_, RocksDbCheckpointStore::Open(options));
  }

  std::vector<v1::AuditRecord> Records() {
    absl::StatusOr<std::vector<v1::AuditRecord>> records = rocksdb_->ListAudit({});
    EXPECT_OK(records.status());
    return records.value_or(std::vector<v1::AuditRecord>());
  }

  std::unique_ptr<RocksDbCheckpointStore> rocksdb_;
  const AuditedStore::Actor alice_{"alice", "ipv4:10.0.0.1:5000"};
  const AuditedStore::Actor bob_{"bob", "local"};
};

// One line per record: everything but the time, which the next test checks.
std::string Summary(const v1::AuditRecord& record) {
  return absl::StrCat(record.sequence(), " ", record.identity(), " ", record.peer(), " ",
                      record.action(), " ", record.model(), "@", record.version(), " [",
                      record.alias(), "] ", v1::AuditRecord::Outcome_Name(record.outcome()), " ",
                      record.error_code(), " '", record.error_message(), "' ", record.detail());
}

std::vector<std::string> Summaries(const std::vector<v1::AuditRecord>& records) {
  std::vector<std::string> lines;
  for (const v1::AuditRecord& record : records) lines.push_back(Summary(record));
  return lines;
}

TEST_F(AuditedStoreTest, EveryChangeIsRecordedWithWhoWhatAndHowItEnded) {
  AuditedStore alice(*rocksdb_, alice_);
  AuditedStore bob(*rocksdb_, bob_);
  CommitOptions with_best;
  with_best.aliases = {"best"};
  ASSERT_OK(CommitCheckpoint(alice, "m", WeightsOnly({{"w", Seeded({4}, 1)}}), with_best).status());
  ASSERT_OK(CommitCheckpoint(bob, "m", WeightsOnly({{"w", Seeded({4}, 2)}})).status());
  ASSERT_OK(CommitCheckpoint(bob, "m", WeightsOnly({{"w", Seeded({4}, 3)}})).status());
  ASSERT_OK_AND_ASSIGN(int64_t previous, bob.SetAlias("m", "best", 2));
  EXPECT_EQ(previous, 1);
  EXPECT_THAT(alice.SetAlias("m", "best", 9), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(alice.SetAlias("m", "prod", 3).status());
  ASSERT_OK(alice.DeleteAlias("m", "prod"));
  ASSERT_OK(bob.DeleteVersion("m", 1, /*force=*/false).status());
  v1::RetentionPolicy keep_one;
  keep_one.set_keep_last(1);
  // Dry runs and reads change nothing and are not recorded.
  ASSERT_OK(alice.ApplyRetention("m", keep_one, /*dry_run=*/true).status());
  ASSERT_OK(alice.GarbageCollect(/*dry_run=*/true).status());
  ASSERT_OK(alice.ListVersions("m").status());
  ASSERT_OK(alice.GetStats().status());
  ASSERT_OK(alice.Verify("m", 0).status());
  ASSERT_OK(alice.ApplyRetention("m", keep_one, /*dry_run=*/false).status());
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, bob.GarbageCollect(false));

  const std::string w16 = "committed m@1: 16 bytes, 16 new";
  EXPECT_THAT(
      Summaries(Records()),
      ElementsAre(
          "1 alice ipv4:10.0.0.1:5000 commit m@1 [best] OK 0 '' " + w16 + "; aliases best",
          "2 bob local commit m@2 [] OK 0 '' committed m@2: 16 bytes, 16 new",
          "3 bob local commit m@3 [] OK 0 '' committed m@3: 16 bytes, 16 new",
          "4 bob local set_alias m@2 [best] OK 0 '' alias best: 1 -> 2",
          "5 alice ipv4:10.0.0.1:5000 set_alias m@9 [best] FAILED 5 'm@9 not found' alias best "
          "-> 9",
          "6 alice ipv4:10.0.0.1:5000 set_alias m@3 [prod] OK 0 '' alias prod: (new) -> 3",
          "7 alice ipv4:10.0.0.1:5000 delete_alias m@0 [prod] OK 0 '' alias prod deleted",
          "8 bob local delete_version m@1 [] OK 0 '' deleted m@1; 16 bytes no longer referenced",
          // Version 2 is aliased, 3 the latest: retention keeps both.
          "9 alice ipv4:10.0.0.1:5000 apply_retention m@0 [] OK 0 '' keep_last 1, keep_every 0, "
          "drop_optimizer_state_older_than 0: nothing to do",
          absl::StrCat("10 bob local garbage_collect @0 [] OK 0 '' reclaimed ",
                       collected.bytes_freed(), " bytes in ", collected.chunks_freed(),
                       " chunks, 0 abandoned uploads")));
  EXPECT_EQ(collected.bytes_freed(), 16);
}

TEST_F(AuditedStoreTest, RecordsAreTimedInOrder) {
  AuditedStore alice(*rocksdb_, alice_);
  const absl::Time before = absl::Now();
  ASSERT_OK(CommitCheckpoint(alice, "m", WeightsOnly({{"w", Seeded({4}, 1)}})).status());
  ASSERT_OK(alice.SetAlias("m", "best", 1).status());
  const absl::Time after = absl::Now();
  const std::vector<v1::AuditRecord> records = Records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_GE(records[0].unix_micros(), absl::ToUnixMicros(before));
  EXPECT_LE(records[0].unix_micros(), records[1].unix_micros());
  EXPECT_LE(records[1].unix_micros(), absl::ToUnixMicros(after));
}

TEST_F(AuditedStoreTest, TheCommitterIsTheProducerAndTheClientsClaimIsKeptAsALabel) {
  AuditedStore alice(*rocksdb_, alice_);
  CheckpointContents claimed = WeightsOnly({{"w", Seeded({4}, 1)}});
  claimed.metadata.set_producer("train.py on gpu-7");
  ASSERT_OK(CommitCheckpoint(alice, "m", claimed).status());
  ASSERT_OK(CommitCheckpoint(alice, "m", WeightsOnly({{"w", Seeded({4}, 2)}})).status());

  ASSERT_OK_AND_ASSIGN(v1::Manifest first, rocksdb_->GetManifest(Ref("m@1")));
  EXPECT_EQ(first.metadata().producer(), "alice");
  EXPECT_EQ(first.metadata().labels().at("client_producer"), "train.py on gpu-7");
  ASSERT_OK_AND_ASSIGN(v1::Manifest second, rocksdb_->GetManifest(Ref("m@2")));
  EXPECT_EQ(second.metadata().producer(), "alice");
  EXPECT_EQ(second.metadata().labels().count("client_producer"), 0u);
}

TEST_F(AuditedStoreTest, AChangeWhoseAuditRecordCannotBeWrittenIsNotMade) {
  ASSERT_OK(CommitCheckpoint(*rocksdb_, "m", WeightsOnly({{"w", Seeded({4}, 1)}})).status());
  ASSERT_OK(CommitCheckpoint(*rocksdb_, "m", WeightsOnly({{"w", Seeded({4}, 2)}})).status());
  ASSERT_OK(rocksdb_->SetAlias("m", "best", 1, 0).status());
  {
    // An abandoned upload, for GarbageCollect to reclaim.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         rocksdb_->BeginUpload("m", OneTensorHeader("x", 8), {}));
    ASSERT_OK(session->AddTensorData(0, 0, "abcdefgh"));
  }
  FlakyAuditStore flaky(*rocksdb_);
  flaky.fail_begin = true;
  AuditedStore alice(flaky, alice_);
  const auto refused = StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("was not done: its audit record could not be written"));

  EXPECT_THAT(CommitCheckpoint(alice, "m", WeightsOnly({{"w", Seeded({4}, 3)}})), refused);
  EXPECT_THAT(alice.SetAlias("m", "best", 2), refused);
  EXPECT_THAT(alice.DeleteAlias("m", "best"), refused);
  EXPECT_THAT(alice.DeleteVersion("m", 2, /*force=*/true), refused);
  v1::RetentionPolicy keep_one;
  keep_one.set_keep_last(1);
  EXPECT_THAT(alice.ApplyRetention("m", keep_one, /*dry_run=*/false), refused);
  EXPECT_THAT(alice.GarbageCollect(/*dry_run=*/false), refused);

  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, rocksdb_->ListVersions("m"));
  ASSERT_EQ(versions.size(), 2u);                           // no version 3, version 2 not deleted
  EXPECT_THAT(versions[0].aliases(), ElementsAre("best"));  // not moved, not deleted
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, rocksdb_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 2);  // the one above and the refused commit
  EXPECT_THAT(Records(), IsEmpty());
}

TEST_F(AuditedStoreTest, ASessionWhoseCommitWasRefusedStaysFailed) {
  FlakyAuditStore flaky(*rocksdb_);
  flaky.fail_begin = true;
  AuditedStore alice(flaky, alice_);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       alice.BeginUpload("m", OneTensorHeader("x", 4), {}));
  ASSERT_OK(session->AddTensorData(0, 0, "abcd"));
  EXPECT_THAT(session->Commit(), StatusIs(absl::StatusCode::kResourceExhausted));
  flaky.fail_begin = false;
  EXPECT_THAT(session->Commit(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "the upload failed earlier"));
  EXPECT_THAT(rocksdb_->ListVersions("m"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(AuditedStoreTest, WhenFinishingTheRecordFailsTheChangeStandsAndItsRecordStaysPending) {
  ASSERT_OK(CommitCheckpoint(*rocksdb_, "m", WeightsOnly({{"w", Seeded({4}, 1)}})).status());
  FlakyAuditStore flaky(*rocksdb_);
  flaky.fail_finish = true;
  AuditedStore alice(flaky, alice_);
  // The alias did move: an error here would invite a retry of a change that was made.
  ASSERT_OK_AND_ASSIGN(int64_t previous, alice.SetAlias("m", "best", 1));
  EXPECT_EQ(previous, 0);
  ASSERT_OK_AND_ASSIGN(v1::Manifest best, rocksdb_->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 1);
  const std::vector<v1::AuditRecord> records = Records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::PENDING);
  EXPECT_EQ(records[0].detail(), "alias best -> 1");
}

TEST_F(AuditedStoreTest, AnUploadOutlivesTheAuditedStoreThatBeganIt) {
  std::unique_ptr<UploadSession> session;
  {
    AuditedStore per_call(*rocksdb_, alice_);  // what the store service makes for one call
    ASSERT_OK_AND_ASSIGN(session, per_call.BeginUpload("m", OneTensorHeader("x", 4), {}));
  }
  ASSERT_OK(session->AddTensorData(0, 0, "abcd"));
  ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());
  EXPECT_EQ(committed.version.version(), 1);
  const std::vector<v1::AuditRecord> records = Records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].identity(), "alice");
  EXPECT_EQ(records[0].version(), 1);
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::OK);
}

TEST_F(AuditedStoreTest, AnOwningAuditedStoreKeepsItsStore) {
  ASSERT_OK(CommitCheckpoint(*rocksdb_, "m", WeightsOnly({{"w", Seeded({4}, 1)}})).status());
  AuditedStore owner(std::move(rocksdb_), bob_);
  ASSERT_OK(owner.SetAlias("m", "best", 1).status());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, owner.ListAudit({}));
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].identity(), "bob");
}

TEST(ProcessUserNameTest, NamesTheEffectiveUserFromThePasswordDatabase) {
  const struct passwd* entry = getpwuid(geteuid());
  EXPECT_EQ(ProcessUserName(),
            entry != nullptr ? std::string(entry->pw_name) : absl::StrCat("uid:", geteuid()));
}

// The embedded store, audited, as the conformance suite sees it.
class AuditedHarness final : public ::ckpt::testing::StoreHarness {
 public:
  explicit AuditedHarness(std::unique_ptr<RocksDbCheckpointStore> store)
      : audited_(std::move(store), {"conformance", "local"}) {}
  CheckpointStore& store() override { return audited_; }

 private:
  AuditedStore audited_;
};

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(AuditedRocksDb, StoreConformanceTest,
                         ::testing::Values(StoreConformanceParam{
                             "audited_rocksdb",
                             [](const std::string& dir) -> std::unique_ptr<StoreHarness> {
                               StoreOptions options;
                               options.db_path = dir + "/db";
                               options.abandoned_upload_grace = absl::ZeroDuration();
                               absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
                                   RocksDbCheckpointStore::Open(options);
                               EXPECT_OK(store.status());
                               if (!store.ok()) return nullptr;
                               return std::make_unique<AuditedHarness>(*std::move(store));
                             }}),
                         [](const ::testing::TestParamInfo<StoreConformanceParam>& info) {
                           return info.param.name;
                         });
}  // namespace testing
}  // namespace ckpt
