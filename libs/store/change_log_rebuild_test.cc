// The store's change log (change_log.h) end to end, on both of its homes: beside pack files, and
// in the packs' bucket (libs/s3's fake server; s3_chunk_backend_ceph_test does it on radosgw).
// An index deleted, rolled back or never logged comes back exactly; a second writer fences the
// first; a log that cannot be written refuses the change.

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/s3/s3_client.h"
#include "libs/s3/testing/fake_s3_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/change_log_directory.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_change_log.h"
#include "libs/store/s3_chunk_backend.h"
#include "libs/store/testing/registry_workload.h"
#include "libs/store/testing/seeded_checkpoints.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CommitSeeded;
using ::ckpt::testing::DumpRegistry;
using ::ckpt::testing::MakeEveryKindOfChange;
using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

std::string FreshDir() {
  const std::string dir = testing::TestCaseDir();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Removes the RocksDB index of the store at `db_path`, keeping its packs/ and changes/.
void DeleteIndexFiles(const std::string& db_path) {
  for (const fs::directory_entry& entry : fs::directory_iterator(db_path)) {
    if (entry.is_regular_file()) fs::remove(entry.path());
  }
}

std::unique_ptr<RocksDbCheckpointStore> OpenLocal(const std::string& db_path,
                                                  bool keep_change_log = true,
                                                  int64_t snapshot_every = 10000) {
  StoreOptions options;
  options.db_path = db_path;
  options.keep_change_log = keep_change_log;
  options.change_log_snapshot_every = snapshot_every;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_OK(store.status());
  return store.ok() ? *std::move(store) : nullptr;
}

// `store`, rebuilt, dumps as `before` did, its versions verify, and it carries on: the next
// version is 5, after MakeEveryKindOfChange's four (event and audit numbers likewise).
void ExpectTheSameStoreCarryingOn(RocksDbCheckpointStore& store, const std::string& before) {
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(store));
  EXPECT_EQ(after, before);
  ASSERT_OK(testing::CheckSeeded(store, "resnet-1", 3, 103));
  ASSERT_OK(testing::CheckSeeded(store, "resnet-1", 4, 104));
  ASSERT_OK_AND_ASSIGN(int64_t next, CommitSeeded(store, "resnet-1", 105));
  EXPECT_EQ(next, 5);
}

class Bucket {
 public:
  Bucket() : server_({}, false, testing::TestCaseDir() + "-s3") {}

  std::shared_ptr<s3::S3Client> Client(int max_attempts = 3) const {
    s3::S3ClientOptions options = server_.ClientOptions();
    options.max_attempts = max_attempts;
    absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(options);
    EXPECT_OK(client.status());
    return client.ok() ? std::shared_ptr<s3::S3Client>(*std::move(client)) : nullptr;
  }

  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> Open(
      const std::string& db_path, int max_attempts = 3, int64_t snapshot_every = 10000) const {
    S3ChunkBackendOptions backend_options;
    backend_options.prefix = "team/";
    ASSIGN_OR_RETURN(std::unique_ptr<S3ChunkBackend> backend,
                     S3ChunkBackend::Create(Client(max_attempts), backend_options));
    StoreOptions options;
    options.db_path = db_path;
    options.chunk_backend = std::move(backend);
    options.change_log_snapshot_every = snapshot_every;
    return RocksDbCheckpointStore::Open(options);
  }

  testing::FakeS3Server& server() { return server_; }

 private:
  testing::FakeS3Server server_;
};

TEST(ChangeLogRebuildTest, ADeletedIndexBesidePackFilesComesBackExactly) {
  const std::string db = FreshDir() + "/store";
  std::string before;
  {
    std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db);
    ASSERT_OK(MakeEveryKindOfChange(*store));
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }
  DeleteIndexFiles(db);
  std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db);
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(*store));
  EXPECT_EQ(after, before);
  EXPECT_THAT(before, HasSubstr("val_acc"));
  EXPECT_THAT(before, HasSubstr("\"production\""));
  ASSERT_OK(testing::CheckSeeded(*store, "resnet-1", 4, 104));
}

// The bucket alone: the whole store directory is gone (a lost host), and a store started on an
// empty directory against the same bucket is the same store, which then carries on.
TEST(ChangeLogRebuildTest, AStoreDirectoryLostWithItsHostComesBackFromTheBucket) {
  Bucket bucket;
  const std::string dir = FreshDir();
  std::string before;
  {
    ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/host-a"));
    ASSERT_OK(MakeEveryKindOfChange(*store));
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }
  fs::remove_all(dir + "/host-a");
  {
    ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/host-b"));
    ExpectTheSameStoreCarryingOn(*store, before);
    ASSERT_OK(MakeEveryKindOfChange(*store, /*round=*/2));
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }
  fs::remove_all(dir + "/host-b");
  ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/host-c"));
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(*store));
  EXPECT_EQ(after, before);
}

// A store that put snapshots of its index comes back from the newest one and the records after
// it: shown by deleting from the bucket every record the snapshot covers (but the first and the
// one it names), which a replay from the first record could not do without.
TEST(ChangeLogRebuildTest, ARebuildLoadsTheNewestSnapshotAndReplaysOnlyTheChangesAfterIt) {
  Bucket bucket;
  const std::string dir = FreshDir();
  std::string before;
  {
    ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/host-a", 3, /*snapshot_every=*/5));
    ASSERT_OK(MakeEveryKindOfChange(*store));
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }  // Closing waits for a snapshot being written.
  S3ChangeLog log(bucket.Client(), "team/");
  ASSERT_OK_AND_ASSIGN(const int64_t snapshot, log.LatestSnapshot());
  ASSERT_GE(snapshot, 5);
  ASSERT_OK_AND_ASSIGN(std::vector<s3::ListedObject> kept,
                       bucket.Client()->ListAllObjects("team/snapshots/"));
  EXPECT_LE(kept.size(), 2u);  // the two newest.
  for (int64_t sequence = 2; sequence < snapshot; ++sequence) {
    ASSERT_OK(bucket.Client()->DeleteObject(log.ObjectKey(sequence)));
  }
  ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/host-b"));
  ExpectTheSameStoreCarryingOn(*store, before);
}

TEST(ChangeLogRebuildTest, ADeletedIndexBesidePackFilesComesBackFromItsSnapshot) {
  const std::string db = FreshDir() + "/store";
  std::string before;
  {
    std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db, true, /*snapshot_every=*/5);
    ASSERT_OK(MakeEveryKindOfChange(*store));
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }
  ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(db + "/changes"));
  ASSERT_OK_AND_ASSIGN(const int64_t snapshot, log->LatestSnapshot());
  EXPECT_GE(snapshot, 5);
  log.reset();
  DeleteIndexFiles(db);
  std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db);
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(*store));
  EXPECT_EQ(after, before);
}

// An index restored from an old backup (or a disk that lost its recent writes) is behind its
// log: the records it lacks are applied at open.
TEST(ChangeLogRebuildTest, AnIndexBehindItsLogCatchesUpAtOpen) {
  Bucket bucket;
  const std::string dir = FreshDir();
  {
    ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/db"));
    ASSERT_OK(CommitSeeded(*store, "m", 1).status());
  }
  fs::copy(dir + "/db", dir + "/old", fs::copy_options::recursive);
  std::string before;
  {
    ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/db"));
    ASSERT_OK(CommitSeeded(*store, "m", 2).status());
    ASSERT_OK(store->SetAlias("m", "best", 2).status());
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }
  ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/old"));
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(*store));
  EXPECT_EQ(after, before);
}

// Two stores on one bucket, the second started while the first still runs (a standby that took
// over while the old writer was paused): the old writer's next change finds its number taken,
// is refused, and nothing of it is in the log; it stays refused.
TEST(ChangeLogRebuildTest, AWriterWhoseNextNumberIsTakenIsFencedAndLeavesNoTrace) {
  Bucket bucket;
  const std::string dir = FreshDir();
  ASSERT_OK_AND_ASSIGN(auto old_writer, bucket.Open(dir + "/a"));
  ASSERT_OK(CommitSeeded(*old_writer, "m", 1).status());
  ASSERT_OK_AND_ASSIGN(auto successor, bucket.Open(dir + "/b"));
  ASSERT_OK_AND_ASSIGN(int64_t taken_over, CommitSeeded(*successor, "m", 2));
  EXPECT_EQ(taken_over, 2);

  EXPECT_THAT(CommitSeeded(*old_writer, "m", 3),
              StatusIs(absl::StatusCode::kUnavailable, "no longer the writer"));
  // Fenced once, it stays a follower: every later change is refused the same way.
  EXPECT_THAT(old_writer->SetAlias("m", "best", 1),
              StatusIs(absl::StatusCode::kUnavailable, "takes no changes"));
  EXPECT_TRUE(old_writer->is_follower());
  ASSERT_OK_AND_ASSIGN(std::set<int64_t> old_view, testing::ListedVersions(*old_writer, "m"));
  EXPECT_EQ(old_view, (std::set<int64_t>{1}));  // its refused commit is not visible there either.

  ASSERT_OK(successor->SetAlias("m", "best", 2).status());
  ASSERT_OK_AND_ASSIGN(std::string successor_view, DumpRegistry(*successor));
  old_writer.reset();
  ASSERT_OK_AND_ASSIGN(auto rebuilt, bucket.Open(dir + "/c"));
  ASSERT_OK_AND_ASSIGN(std::string from_bucket, DumpRegistry(*rebuilt));
  EXPECT_EQ(from_bucket, successor_view);
  ASSERT_OK_AND_ASSIGN(std::set<int64_t> versions, testing::ListedVersions(*rebuilt, "m"));
  EXPECT_EQ(versions, (std::set<int64_t>{1, 2}));
}

// A change the bucket cannot take is not made: refused with the bucket's error, nothing visible,
// and the store goes on once the bucket answers again. An append whose answer was lost (the
// object created, the response dropped) is recognised as this store's own and succeeds.
TEST(ChangeLogRebuildTest, AChangeTheBucketRefusesIsNotMadeAndALostAnswerIsRecognised) {
  Bucket bucket;
  const std::string dir = FreshDir();
  ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/db", /*max_attempts=*/2));
  ASSERT_OK(CommitSeeded(*store, "m", 1).status());
  bucket.server().Fault({{"method", "PUT"}, {"status", 503}, {"count", 2}});
  EXPECT_THAT(store->SetAlias("m", "best", 1),
              StatusIs(absl::StatusCode::kUnavailable, "could not be recorded"));
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store->GetManifest(ParseVersionRef("m@latest").value()));
  EXPECT_EQ(latest.aliases_size(), 0);
  ASSERT_OK(store->SetAlias("m", "best", 1).status());
  bucket.server().Fault({{"method", "PUT"}, {"lose_response", true}, {"count", 1}});
  ASSERT_OK(store->SetAlias("m", "production", 1).status());
  ASSERT_OK_AND_ASSIGN(std::string before, DumpRegistry(*store));
  store.reset();
  ASSERT_OK_AND_ASSIGN(auto rebuilt, bucket.Open(dir + "/elsewhere"));
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(*rebuilt));
  EXPECT_EQ(after, before);
}

// A store from before the change log: its first open with one records the whole index as
// change 1, from which a lost index comes back.
TEST(ChangeLogRebuildTest, AStoreThatKeptNoLogIsRecordedWholeAtItsFirstOpen) {
  const std::string db = FreshDir() + "/store";
  {
    std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db, /*keep_change_log=*/false);
    ASSERT_OK(MakeEveryKindOfChange(*store));
  }
  EXPECT_FALSE(fs::exists(db + "/changes"));
  std::string before;
  {
    std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db);
    ASSERT_OK(store->SetAlias("resnet-1", "best", 4).status());  // change 2.
    ASSERT_OK_AND_ASSIGN(before, DumpRegistry(*store));
  }
  DeleteIndexFiles(db);
  std::unique_ptr<RocksDbCheckpointStore> store = OpenLocal(db);
  ASSERT_OK_AND_ASSIGN(std::string after, DumpRegistry(*store));
  EXPECT_EQ(after, before);
}

// The index of one store meeting the log of another is refused, not merged.
TEST(ChangeLogRebuildTest, AnUnloggedIndexMeetingAnotherStoresLogIsRefused) {
  Bucket bucket;
  const std::string dir = FreshDir();
  {
    ASSERT_OK_AND_ASSIGN(auto store, bucket.Open(dir + "/a"));
    ASSERT_OK(CommitSeeded(*store, "m", 1).status());
  }
  {
    std::unique_ptr<RocksDbCheckpointStore> local = OpenLocal(dir + "/b", false);
    ASSERT_OK(CommitSeeded(*local, "other", 1).status());
  }
  EXPECT_THAT(bucket.Open(dir + "/b"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "another store"));
}

}  // namespace
}  // namespace ckpt
