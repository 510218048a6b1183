// The RocksDB store's audit log (rocksdb_checkpoint_store_audit.cc): records written PENDING and
// finished, queried, kept across reopening, and a store from before the log.

#include <cstdlib>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/ones.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/testing/legacy_store.h"
#include "rocksdb/db.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class RocksDbAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    options_.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    Reopen();
  }

  void Reopen() {
    store_.reset();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options_));
  }

  static v1::AuditRecord Record(const std::string& identity, absl::string_view action,
                                const std::string& model) {
    v1::AuditRecord record;
    record.set_identity(identity);
    record.set_peer("local");
    record.set_action(std::string(action));
    record.set_model(model);
    return record;
  }

  std::vector<int64_t> Sequences(const AuditQuery& query) {
    std::vector<int64_t> sequences;
    absl::StatusOr<std::vector<v1::AuditRecord>> records = store_->ListAudit(query);
    EXPECT_OK(records.status());
    for (const v1::AuditRecord& record : records.value_or(std::vector<v1::AuditRecord>())) {
      sequences.push_back(record.sequence());
    }
    return sequences;
  }

  StoreOptions options_;
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(RocksDbAuditTest, RecordIsPendingUntilFinishedWithItsOutcome) {
  const absl::Time before = absl::Now();
  v1::AuditRecord asked = Record("alice", kAuditSetAlias, "m");
  asked.set_alias("best");
  asked.set_version(3);
  asked.set_detail("alias best -> 3");
  // What only the store may say is overwritten.
  asked.set_sequence(77);
  asked.set_outcome(v1::AuditRecord::OK);
  asked.set_error_code(5);
  ASSERT_OK_AND_ASSIGN(const int64_t first, store_->BeginAudit(asked));
  ASSERT_OK_AND_ASSIGN(const int64_t second,
                       store_->BeginAudit(Record("bob", kAuditDeleteVersion, "m")));
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 2);

  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store_->ListAudit({}));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].sequence(), 1);
  EXPECT_EQ(records[0].identity(), "alice");
  EXPECT_EQ(records[0].peer(), "local");
  EXPECT_EQ(records[0].action(), "set_alias");
  EXPECT_EQ(records[0].model(), "m");
  EXPECT_EQ(records[0].alias(), "best");
  EXPECT_EQ(records[0].version(), 3);
  EXPECT_EQ(records[0].detail(), "alias best -> 3");
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::PENDING);
  EXPECT_EQ(records[0].error_code(), 0);
  EXPECT_GE(records[0].unix_micros(), absl::ToUnixMicros(before));
  EXPECT_LE(records[0].unix_micros(), records[1].unix_micros());
  EXPECT_EQ(records[1].outcome(), v1::AuditRecord::PENDING);

  ASSERT_OK(store_->FinishAudit(first, absl::OkStatus(), "alias best: 1 -> 3", 0));
  ASSERT_OK(store_->FinishAudit(second, absl::NotFoundError("m@9 not found"), "", 9));
  ASSERT_OK_AND_ASSIGN(records, store_->ListAudit({}));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::OK);
  EXPECT_EQ(records[0].detail(), "alias best: 1 -> 3");
  EXPECT_EQ(records[0].version(), 3);  // 0 keeps what was begun
  EXPECT_EQ(records[1].outcome(), v1::AuditRecord::FAILED);
  EXPECT_EQ(records[1].error_code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(records[1].error_message(), "m@9 not found");
  EXPECT_EQ(records[1].version(), 9);

  EXPECT_THAT(store_->FinishAudit(first, absl::OkStatus(), "", 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already finished: OK"));
  EXPECT_THAT(store_->FinishAudit(3, absl::OkStatus(), "", 0),
              StatusIs(absl::StatusCode::kNotFound, "no audit record 3"));
  EXPECT_THAT(store_->FinishAudit(0, absl::OkStatus(), "", 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(RocksDbAuditTest, RefusesRecordsWithoutIdentityOrWithUnknownActions) {
  EXPECT_THAT(store_->BeginAudit(Record("", kAuditCommit, "m")),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs the identity"));
  EXPECT_THAT(store_->BeginAudit(Record("alice", "rename", "m")),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown audit action 'rename'"));
  EXPECT_THAT(Sequences({}), IsEmpty());
}

TEST_F(RocksDbAuditTest, QueriesSelectByModelTimeAndPage) {
  ASSERT_OK(store_->BeginAudit(Record("alice", kAuditCommit, "a")).status());
  ASSERT_OK(store_->BeginAudit(Record("alice", kAuditCommit, "b")).status());
  ASSERT_OK(store_->BeginAudit(Record("alice", kAuditGarbageCollect, "")).status());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> so_far, store_->ListAudit({}));
  const absl::Time middle = absl::FromUnixMicros(so_far.back().unix_micros() + 1);
  // Waiting for the clock: `since` compares the store's times, which must pass `middle`.
  while (absl::Now() <= middle) absl::SleepFor(absl::Microseconds(10));
  ASSERT_OK(store_->BeginAudit(Record("bob", kAuditDeleteAlias, "a")).status());
  ASSERT_OK(store_->BeginAudit(Record("bob", kAuditCommit, "ab")).status());

  EXPECT_THAT(Sequences({}), ElementsAre(1, 2, 3, 4, 5));
  AuditQuery model_a;
  model_a.model = "a";  // not "ab": the whole name
  EXPECT_THAT(Sequences(model_a), ElementsAre(1, 4));
  AuditQuery recent;
  recent.since = middle;
  EXPECT_THAT(Sequences(recent), ElementsAre(4, 5));
  AuditQuery page;
  page.after_sequence = 1;
  page.limit = 2;
  EXPECT_THAT(Sequences(page), ElementsAre(2, 3));
  page.after_sequence = 3;
  EXPECT_THAT(Sequences(page), ElementsAre(4, 5));
  page.after_sequence = 5;
  EXPECT_THAT(Sequences(page), IsEmpty());
  model_a.since = middle;
  EXPECT_THAT(Sequences(model_a), ElementsAre(4));

  AuditQuery bad;
  bad.limit = -1;
  EXPECT_THAT(store_->ListAudit(bad), StatusIs(absl::StatusCode::kInvalidArgument, "limit"));
  bad = AuditQuery();
  bad.model = "no/slashes";
  EXPECT_THAT(store_->ListAudit(bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(RocksDbAuditTest, RecordsAndSequenceNumbersSurviveReopening) {
  ASSERT_OK_AND_ASSIGN(const int64_t finished,
                       store_->BeginAudit(Record("alice", kAuditCommit, "m")));
  ASSERT_OK(store_->FinishAudit(finished, absl::OkStatus(), "committed m@1", 1));
  ASSERT_OK(store_->BeginAudit(Record("bob", kAuditDeleteVersion, "m")).status());
  Reopen();
  // Never reused: a sequence names one call for good.
  ASSERT_OK_AND_ASSIGN(const int64_t next, store_->BeginAudit(Record("carol", kAuditCommit, "m")));
  EXPECT_EQ(next, 3);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store_->ListAudit({}));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::OK);
  EXPECT_EQ(records[0].detail(), "committed m@1");
  EXPECT_EQ(records[1].identity(), "bob");
  // The process stopped during it, and the history holds no deletion by bob: reconciled at the
  // reopening as not applied (never left "outcome unknown").
  EXPECT_EQ(records[1].outcome(), v1::AuditRecord::FAILED);
  EXPECT_EQ(records[1].error_code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(records[1].error_message(), ::testing::HasSubstr("not applied"));
  EXPECT_EQ(records[2].identity(), "carol");
  EXPECT_EQ(records[2].outcome(), v1::AuditRecord::PENDING);  // in progress now
}

// Calls whose outcome was never written (the process stopped, or a full disk refused the
// finishing write) get it at the next open from the registry history: a change that is there was
// applied, one that is not was not. The check of a refused `ckpt rm` on a full disk is the
// delete_version case below (refused, so no VERSION_DELETED event).
TEST_F(RocksDbAuditTest, PendingRecordsAreReconciledAtOpenAgainstTheHistory) {
  const ChangeAttribution alice{"alice", ""};
  CommitOptions by_alice;
  by_alice.attribution = alice;
  ASSERT_OK(store_->BeginAudit(Record("alice", kAuditCommit, "m")).status());
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("w", at::ones({4})));
  ASSERT_OK(CommitCheckpoint(*store_, "m", contents, by_alice).status());
  v1::AuditRecord moved = Record("alice", kAuditSetAlias, "m");
  moved.set_alias("best");
  moved.set_version(1);
  ASSERT_OK(store_->BeginAudit(moved).status());
  ASSERT_OK(store_->SetAlias("m", "best", 1, 0, alice).status());
  // Refused (the alias points at it), as `ckpt rm` without --force is.
  v1::AuditRecord removed = Record("alice", kAuditDeleteVersion, "m");
  removed.set_version(1);
  ASSERT_OK(store_->BeginAudit(removed).status());
  EXPECT_THAT(store_->DeleteVersion("m", 1, /*force=*/false, alice),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // The same alias move by someone else is not alice's.
  v1::AuditRecord bobs = Record("bob", kAuditSetAlias, "m");
  bobs.set_alias("best");
  bobs.set_version(1);
  ASSERT_OK(store_->BeginAudit(bobs).status());
  ASSERT_OK(store_->BeginAudit(Record("alice", kAuditGarbageCollect, "")).status());

  Reopen();
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store_->ListAudit({}));
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::OK);
  EXPECT_EQ(records[0].version(), 1);
  EXPECT_THAT(records[0].detail(), ::testing::HasSubstr("applied (the store stopped"));
  EXPECT_THAT(records[0].detail(), ::testing::HasSubstr("reconciled at open with history event #"));
  EXPECT_EQ(records[1].outcome(), v1::AuditRecord::OK);
  for (int i : {2, 3}) {
    SCOPED_TRACE(records[i].ShortDebugString());
    EXPECT_EQ(records[i].outcome(), v1::AuditRecord::FAILED);
    EXPECT_EQ(records[i].error_code(), static_cast<int>(absl::StatusCode::kAborted));
    EXPECT_THAT(records[i].error_message(),
                ::testing::HasSubstr("not applied: the store stopped, or could not record the "
                                     "outcome, before the call finished; reconciled at open"));
  }
  EXPECT_EQ(records[4].outcome(), v1::AuditRecord::FAILED);
  EXPECT_THAT(records[4].error_message(), ::testing::HasSubstr("interrupted"));

  // Reconciled once: a later open changes nothing, and new calls are theirs to finish.
  ASSERT_OK_AND_ASSIGN(const int64_t next, store_->BeginAudit(Record("carol", kAuditCommit, "m")));
  ASSERT_OK(store_->FinishAudit(next, absl::OkStatus(), "", 0));
  Reopen();
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> again, store_->ListAudit({}));
  ASSERT_EQ(again.size(), 6u);
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(again[i].SerializeAsString(), records[i].SerializeAsString()) << i;
  }
  EXPECT_EQ(again[5].outcome(), v1::AuditRecord::OK);
}

TEST_F(RocksDbAuditTest, StoreFromBeforeTheAuditLogOpensWithAnEmptyOne) {
  store_.reset();
  const std::string path = options_.db_path + "_old";
  // The column families a store had before `audit` existed.
  ASSERT_OK(testing::CreateLegacyStore(path, ColumnFamily::kPackedChunks));
  options_.db_path = path;
  options_.create_if_missing = false;
  Reopen();
  EXPECT_THAT(Sequences({}), IsEmpty());
  ASSERT_OK_AND_ASSIGN(const int64_t sequence,
                       store_->BeginAudit(Record("alice", kAuditCommit, "m")));
  EXPECT_EQ(sequence, 1);
}

}  // namespace
}  // namespace ckpt
