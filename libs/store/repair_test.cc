#include "libs/store/repair.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_pack.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/store_records.pb.h"
#include "libs/store/testing/store_conformance.h"
#include "rocksdb/db.h"
#include "rocksdb/metadata.h"
#include "xxhash.h"

namespace ckpt {
namespace testing {
// Linked for its helpers (MakeStateDict, AdamState); this test runs no conformance suite.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
}  // namespace testing

namespace {

namespace fs = std::filesystem;

using ::ckpt::testing::AdamState;
using ::ckpt::testing::ExpectSameTensor;
using ::ckpt::testing::MakeStateDict;
using ::ckpt::testing::Ref;
using ::ckpt::testing::Seeded;
using ::ckpt::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The write-ahead logs of the store at `path` that hold records (*.log, not empty).
std::vector<fs::path> LiveLogs(const std::string& path) {
  std::vector<fs::path> logs;
  for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
    if (entry.path().extension() == ".log" && fs::file_size(entry.path()) > 0) {
      logs.push_back(entry.path());
    }
  }
  return logs;
}

// Flushes every column family into SST files; returns the newest SST of the `versions` column
// family (the one holding the manifests committed since the previous flush).
std::string FlushAll(const std::string& path) {
  absl::StatusOr<std::unique_ptr<StoreDb>> db = StoreDb::Open(path, false);
  EXPECT_OK(db.status());
  if (!db.ok()) return "";
  for (int i = 0; i < kColumnFamilyCount; ++i) {
    EXPECT_TRUE(
        (*db)->db()->Flush(rocksdb::FlushOptions(), (*db)->cf(static_cast<ColumnFamily>(i))).ok());
  }
  std::vector<rocksdb::LiveFileMetaData> files;
  (*db)->db()->GetLiveFilesMetaData(&files);
  std::string newest;
  uint64_t newest_number = 0;
  for (const rocksdb::LiveFileMetaData& file : files) {
    if (file.column_family_name != ColumnFamilyName(ColumnFamily::kVersions)) continue;
    if (file.file_number >= newest_number) {
      newest_number = file.file_number;
      newest = path + file.name;  // name starts with '/'
    }
  }
  return newest;
}

std::string ManifestFile(const std::string& path) {
  std::ifstream current(path + "/CURRENT");
  std::string name;
  std::getline(current, name);
  return path + "/" + name;
}

void FlipByte(const std::string& file, int64_t offset) {
  std::fstream stream(file, std::ios::binary | std::ios::in | std::ios::out);
  ASSERT_TRUE(stream.good()) << file;
  stream.seekg(offset);
  char byte = 0;
  stream.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x5a);
  stream.seekp(offset);
  stream.write(&byte, 1);
  ASSERT_TRUE(stream.good()) << file;
}

class RepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(path_);
    fs::remove_all(path_ + ".backup");
  }

  std::unique_ptr<RocksDbCheckpointStore> Open() {
    StoreOptions options;
    options.db_path = path_;
    options.keep_change_log = keep_change_log_;
    absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
        RocksDbCheckpointStore::Open(options);
    EXPECT_OK(store.status());
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Commits versions `first`..`last` of "m": a shared tensor (deduplicated: the same chunks in
  // every version), a tensor of its own and Adam state each; "best" points at the last.
  void Commit(int first, int last) {
    std::unique_ptr<RocksDbCheckpointStore> store = Open();
    ASSERT_NE(store, nullptr);
    for (int version = first; version <= last; ++version) {
      const at::Tensor shared = Seeded({64, 64}, 7);
      const at::Tensor own = Seeded({32, 16}, 100 + version);
      CheckpointContents contents;
      contents.model = MakeStateDict({{"shared", shared}, {"own", own}});
      contents.optimizer = AdamState({shared, own}, version, 1000 + version);
      CommitOptions options;
      options.aliases = {"best"};
      ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store, "m", contents, options));
      ASSERT_EQ(committed.version.version(), version);
      ASSERT_OK_AND_ASSIGN(v1::Manifest manifest,
                           store->GetManifest(Ref(absl::StrCat("m@", version))));
      committed_[version] = {shared, own, manifest};
    }
  }

  // Every version in `versions` loads (each chunk checked) and equals what was committed.
  void ExpectVersionsIntact(const std::vector<int>& versions) {
    std::unique_ptr<RocksDbCheckpointStore> store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> listed, store->ListVersions("m"));
    std::vector<int> numbers;
    for (const v1::VersionInfo& info : listed) numbers.push_back(static_cast<int>(info.version()));
    EXPECT_EQ(numbers, versions);
    for (int version : versions) {
      ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded,
                           LoadCheckpoint(*store, Ref(absl::StrCat("m@", version))));
      const Committed& expected = committed_.at(version);
      ExpectSameTensor(*loaded.contents.model.Find("shared"), expected.shared, "shared");
      ExpectSameTensor(*loaded.contents.model.Find("own"), expected.own, "own");
      ASSERT_EQ(loaded.manifest.state_tensors_size(), expected.manifest.state_tensors_size());
      for (int i = 0; i < loaded.manifest.state_tensors_size(); ++i) {
        EXPECT_EQ(loaded.manifest.state_tensors(i).SerializeAsString(),
                  expected.manifest.state_tensors(i).SerializeAsString());
      }
    }
    ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store->Verify("", 0));
    EXPECT_THAT(verified.problems(), IsEmpty());
  }

  absl::StatusOr<RepairReport> Repair() {
    RepairOptions options;
    options.db_path = path_;
    options.backup_dir = path_ + ".backup";
    return RepairStore(options);
  }

  static std::vector<std::string> Refs(const std::vector<RepairedVersion>& versions) {
    std::vector<std::string> refs;
    for (const RepairedVersion& version : versions) refs.push_back(version.ref);
    return refs;
  }

  struct Committed {
    at::Tensor shared;
    at::Tensor own;
    v1::Manifest manifest;
  };
  std::string path_;
  std::map<int, Committed> committed_;
  // Most tests here repair what RocksDB's RepairDB can recover: a store from before the change
  // log (#53), which keeps none. RepairWithChangeLogTest below keeps one.
  bool keep_change_log_ = false;
};

// A store that keeps a change log beside its packs (every store this build creates).
class RepairWithChangeLogTest : public RepairTest {
 protected:
  RepairWithChangeLogTest() { keep_change_log_ = true; }
};

TEST_F(RepairTest, StoreWithoutCurrentComesBackWithEveryVersion) {
  Commit(1, 3);
  FlushAll(path_);
  ASSERT_TRUE(fs::remove(path_ + "/CURRENT"));
  StoreOptions options;
  options.db_path = path_;
  options.keep_change_log = false;
  EXPECT_THAT(RocksDbCheckpointStore::Open(options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ckpt repair")));

  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2", "m@3"));
  EXPECT_THAT(report.dropped, IsEmpty());
  EXPECT_EQ(report.versions_unrecovered, 0);
  EXPECT_THAT(report.verify.problems(), IsEmpty());
  // The damaged files were kept: the backup holds the SSTs and the MANIFEST, not CURRENT.
  EXPECT_EQ(report.backup_dir, path_ + ".backup");
  EXPECT_TRUE(std::any_of(report.backed_up.begin(), report.backed_up.end(),
                          [](const std::string& name) { return name.rfind("MANIFEST-", 0) == 0; }));
  for (const std::string& name : report.backed_up) {
    EXPECT_TRUE(fs::exists(report.backup_dir + "/" + name)) << name;
  }
  ExpectVersionsIntact({1, 2, 3});
  std::unique_ptr<RocksDbCheckpointStore> store = Open();
  ASSERT_OK_AND_ASSIGN(v1::Manifest best, store->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 3);
}

TEST_F(RepairTest, CorruptManifestIsRebuiltFromTheTablesAndTheLog) {
  Commit(1, 2);
  FlushAll(path_);
  Commit(3, 3);  // left in the WAL: the repair must replay it too.
  const std::string manifest = ManifestFile(path_);
  const int64_t size = static_cast<int64_t>(fs::file_size(manifest));
  for (int64_t offset : {size / 3, size / 2, 2 * size / 3}) FlipByte(manifest, offset);
  StoreOptions options;
  options.db_path = path_;
  options.keep_change_log = false;
  EXPECT_THAT(RocksDbCheckpointStore::Open(options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ckpt repair")));

  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2", "m@3"));
  EXPECT_THAT(report.dropped, IsEmpty());
  EXPECT_THAT(report.verify.problems(), IsEmpty());
  ExpectVersionsIntact({1, 2, 3});
}

// RocksDB's RepairDB learns column families only from SST files and drops WAL batches that
// touch any other: version 3's commit is the first write to `aliases` and lives only in the WAL,
// yet it must come back whole.
TEST_F(RepairTest, CommitInTheLogToAFamilyWithoutTablesSurvives) {
  std::unique_ptr<RocksDbCheckpointStore> store = Open();
  ASSERT_NE(store, nullptr);
  for (int version = 1; version <= 3; ++version) {
    if (version == 3) FlushAll(path_);  // versions 1 and 2 in SSTs, which have no aliases.
    if (version == 3) store = Open();
    CheckpointContents contents;
    committed_[version] = {Seeded({64, 64}, 7), Seeded({32, 16}, 100 + version), {}};
    contents.model =
        MakeStateDict({{"shared", committed_[version].shared}, {"own", committed_[version].own}});
    CommitOptions options;
    if (version == 3) options.aliases = {"best"};
    ASSERT_OK(CommitCheckpoint(*store, "m", contents, options).status());
    if (version == 2) store.reset();
  }
  store.reset();
  {
    std::ofstream current(path_ + "/CURRENT", std::ios::trunc);
    current << "garbage\n";
  }
  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2", "m@3"));
  EXPECT_THAT(report.verify.problems(), IsEmpty());
  ExpectVersionsIntact({1, 2, 3});
  store = Open();
  ASSERT_OK_AND_ASSIGN(v1::Manifest best, store->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 3);
}

// Version 3's manifest lived only in the SST that is truncated: it is gone, and the records that
// named it (the model's count and latest, the alias, the chunk refcounts) are made to agree.
TEST_F(RepairTest, TruncatedSstLosesOnlyItsVersionAndTheRecordsAgreeAgain) {
  Commit(1, 2);
  FlushAll(path_);
  Commit(3, 3);
  const std::string sst = FlushAll(path_);
  ASSERT_FALSE(sst.empty());
  fs::resize_file(sst, fs::file_size(sst) / 2);
  StoreOptions options;
  options.db_path = path_;
  options.keep_change_log = false;
  EXPECT_THAT(RocksDbCheckpointStore::Open(options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ckpt repair")));

  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2"));
  EXPECT_EQ(report.versions_unrecovered, 1);
  EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("removed alias 'm@best'")));
  EXPECT_THAT(report.verify.problems(), IsEmpty());
  ExpectVersionsIntact({1, 2});

  std::unique_ptr<RocksDbCheckpointStore> store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store->ListModels());
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].latest_version(), 2);
  EXPECT_EQ(models[0].version_count(), 2);
  // Version numbers are never reused: the next commit is 4, not 3.
  CheckpointContents contents;
  contents.model = MakeStateDict({{"w", Seeded({8}, 9)}});
  ASSERT_OK_AND_ASSIGN(CommitResult next, CommitCheckpoint(*store, "m", contents));
  EXPECT_EQ(next.version.version(), 4);
  ASSERT_OK(store->GarbageCollect(false).status());
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
}

// Version 3's commit lived only in the live write-ahead log, which is then lost at a record
// boundary (emptied) or deleted. RocksDB opens either without an error; the acknowledged-write
// marker refuses it, and the repair keeps versions 1 and 2 and says how many writes were lost.
TEST_F(RepairTest, WriteAheadLogThatLostAcknowledgedCommitsIsRefusedThenRepaired) {
  for (const bool delete_log : {false, true}) {
    SCOPED_TRACE(delete_log ? "deleted" : "emptied");
    fs::remove_all(path_);
    fs::remove_all(path_ + ".backup");
    committed_.clear();
    Commit(1, 2);
    FlushAll(path_);
    Commit(3, 3);
    const std::vector<fs::path> logs = LiveLogs(path_);
    ASSERT_EQ(logs.size(), 1u) << "version 3 should be in one live WAL";
    if (delete_log) {
      ASSERT_TRUE(fs::remove(logs[0]));
    } else {
      fs::resize_file(logs[0], 0);
    }
    StoreOptions options;
    options.db_path = path_;
    EXPECT_THAT(RocksDbCheckpointStore::Open(options),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("write-ahead log"), HasSubstr("ckpt repair"))));

    ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
    EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2"));
    EXPECT_GE(report.acknowledged_writes_lost, 1u);
    EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("lost acknowledged writes")));
    EXPECT_THAT(report.backed_up, ::testing::Contains(std::string(kAcknowledgedMarkerFile)));
    ExpectVersionsIntact({1, 2});
    std::unique_ptr<RocksDbCheckpointStore> store = Open();
    ASSERT_NE(store, nullptr);
    CheckpointContents contents;
    contents.model = MakeStateDict({{"w", Seeded({8}, 9)}});
    ASSERT_OK(CommitCheckpoint(*store, "m", contents).status());
  }
}

// A damaged marker is DATA_LOSS at open (and so for `ckpt verify`), naming it and `ckpt repair`,
// which rebuilds it; an empty one (a power cut right after it was created: it is not synced) and
// a missing one (a store from before it) are not damage. A marker of the earlier one-line format
// still works.
TEST_F(RepairTest, DamagedAcknowledgedMarkerIsDataLossUntilRepairRebuildsIt) {
  Commit(1, 1);
  const std::string marker = path_ + "/" + std::string(kAcknowledgedMarkerFile);
  ASSERT_TRUE(fs::exists(marker));
  std::string intact;
  {
    std::ifstream in(marker);
    intact.assign(std::istreambuf_iterator<char>(in), {});
  }
  StoreOptions options;
  options.db_path = path_;
  for (const size_t flipped : {size_t{3}, intact.size() / 2 + 25, intact.size() - 2}) {
    std::string damaged = intact;
    damaged[flipped] ^= 0x01;
    {
      std::ofstream out(marker, std::ios::trunc | std::ios::binary);
      out << damaged;
    }
    EXPECT_THAT(RocksDbCheckpointStore::Open(options),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("CKPT-ACKNOWLEDGED is damaged"),
                               HasSubstr("1 of its 2 checksummed copies intact"),
                               HasSubstr("ckpt repair"))))
        << "byte " << flipped;
  }
  {
    std::ofstream torn(marker, std::ios::trunc);
    torn << "ckpt-acknowledged 0000000000000000009";
  }
  EXPECT_THAT(RocksDbCheckpointStore::Open(options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("0 of its 2 checksummed copies")));

  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("marker was damaged")));
  EXPECT_EQ(report.acknowledged_writes_lost, 0u);
  {
    std::ifstream in(marker);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), intact);
  }
  ExpectVersionsIntact({1});

  { std::ofstream empty(marker, std::ios::trunc); }
  ExpectVersionsIntact({1});
  ASSERT_TRUE(fs::remove(marker));
  ExpectVersionsIntact({1});
  {
    // The one-line format of stores written before the two copies: #1, checksummed digits.
    std::ofstream v1(marker, std::ios::trunc);
    v1 << "ckpt-acknowledged 00000000000000000001 "
       << absl::StrFormat("%016x", XXH3_64bits("00000000000000000001", 20)) << "\n";
  }
  ExpectVersionsIntact({1});
  Commit(2, 2);  // writes a new marker
  ExpectVersionsIntact({1, 2});
}

// A flipped marker together with a truncated write-ahead log: the marker's intact copy still
// tells the lost acknowledged commits apart, and says so before the damage.
TEST_F(RepairTest, LostWritesAreStillReportedWhenTheMarkerIsDamagedToo) {
  Commit(1, 2);
  FlushAll(path_);
  Commit(3, 3);
  const std::vector<fs::path> logs = LiveLogs(path_);
  ASSERT_EQ(logs.size(), 1u);
  fs::resize_file(logs[0], 0);
  const std::string marker = path_ + "/" + std::string(kAcknowledgedMarkerFile);
  std::string text;
  {
    std::ifstream in(marker);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text[text.size() / 2 + 25] ^= 0x01;  // the second copy
  {
    std::ofstream out(marker, std::ios::trunc | std::ios::binary);
    out << text;
  }
  StoreOptions options;
  options.db_path = path_;
  EXPECT_THAT(
      RocksDbCheckpointStore::Open(options),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("lost acknowledged commits"),
                                                  HasSubstr("CKPT-ACKNOWLEDGED is damaged"))));
  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_GE(report.acknowledged_writes_lost, 1u);
  EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("lost acknowledged writes")));
  ExpectVersionsIntact({1, 2});
}

// A chunk of version 2's own tensor is damaged in its pack file: version 2 must not survive the
// repair as if it were whole; the versions that do not use the chunk do.
TEST_F(RepairTest, VersionWithADamagedChunkIsDroppedOthersKept) {
  Commit(1, 3);
  FlushAll(path_);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path_, false));
    const v1::ChunkRef& chunk = committed_.at(2).manifest.tensors(1).chunks(0);
    ASSERT_EQ(committed_.at(2).manifest.tensors(1).key(), "own");
    std::string bytes;
    ASSERT_TRUE(db->db()
                    ->Get(rocksdb::ReadOptions(), db->cf(ColumnFamily::kPackedChunks),
                          chunk.sha256(), &bytes)
                    .ok());
    store::PackedChunk location;
    ASSERT_TRUE(location.ParseFromString(bytes));
    FlipByte(path_ + "/packs/" + PackFileName(location.pack_id()), location.offset() + 5);
  }
  ASSERT_TRUE(fs::remove(path_ + "/CURRENT"));

  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@3"));
  ASSERT_EQ(report.dropped.size(), 1u);
  EXPECT_EQ(report.dropped[0].ref, "m@2");
  EXPECT_THAT(report.dropped[0].reason, HasSubstr("mismatch"));
  EXPECT_THAT(report.verify.problems(), IsEmpty());
  ExpectVersionsIntact({1, 3});
}

TEST_F(RepairTest, RefusesAStoreThatIsOpenAndChangesNothing) {
  Commit(1, 1);
  std::unique_ptr<RocksDbCheckpointStore> store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Repair(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("in use")));
  EXPECT_FALSE(fs::exists(path_ + ".backup"));
}

TEST_F(RepairTest, DirectoryWithoutADatabaseIsNotFound) {
  fs::create_directories(path_);
  EXPECT_THAT(Repair(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(fs::exists(path_ + ".backup"));
}

// The same damage as TruncatedSstLosesOnlyItsVersionAndTheRecordsAgreeAgain, on a store that
// keeps a change log: the index is rebuilt from it and version 3 (only in the truncated SST) is
// back with its alias.
TEST_F(RepairWithChangeLogTest, TruncatedSstLosesNothing) {
  Commit(1, 2);
  FlushAll(path_);
  Commit(3, 3);
  const std::string sst = FlushAll(path_);
  ASSERT_FALSE(sst.empty());
  fs::resize_file(sst, fs::file_size(sst) / 2);
  StoreOptions options;
  options.db_path = path_;
  EXPECT_THAT(RocksDbCheckpointStore::Open(options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ckpt repair")));

  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2", "m@3"));
  EXPECT_THAT(report.dropped, IsEmpty());
  EXPECT_EQ(report.versions_unrecovered, 0);
  EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("rebuilt the index from its change log")));
  EXPECT_THAT(report.verify.problems(), IsEmpty());
  EXPECT_TRUE(fs::exists(report.backup_dir + "/" + fs::path(sst).filename().string()));
  ExpectVersionsIntact({1, 2, 3});
  std::unique_ptr<RocksDbCheckpointStore> store = Open();
  ASSERT_OK_AND_ASSIGN(v1::Manifest best, store->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 3);
  CheckpointContents contents;
  contents.model = MakeStateDict({{"w", Seeded({8}, 9)}});
  ASSERT_OK_AND_ASSIGN(CommitResult next, CommitCheckpoint(*store, "m", contents));
  EXPECT_EQ(next.version.version(), 4);
}

// A write-ahead log that lost acknowledged commits: RocksDB's repair cannot bring them back
// (WriteAheadLogThatLostAcknowledgedCommitsIsRefusedThenRepaired), the change log does.
TEST_F(RepairWithChangeLogTest, AWriteAheadLogThatLostCommitsLosesNothing) {
  Commit(1, 2);
  FlushAll(path_);
  Commit(3, 4);
  for (const fs::path& log : LiveLogs(path_)) fs::resize_file(log, 0);
  ASSERT_OK_AND_ASSIGN(RepairReport report, Repair());
  EXPECT_THAT(Refs(report.intact), ElementsAre("m@1", "m@2", "m@3", "m@4"));
  EXPECT_EQ(report.acknowledged_writes_lost, 0u);
  ExpectVersionsIntact({1, 2, 3, 4});
}

// The whole index deleted (every RocksDB file; the packs and the log stay): the store opens
// on the emptied directory and replays its log, with no repair at all.
TEST_F(RepairWithChangeLogTest, ADeletedIndexIsRebuiltAtOpen) {
  Commit(1, 3);
  {
    std::unique_ptr<RocksDbCheckpointStore> store = Open();
    ASSERT_OK(store->SetAlias("m", "production", 2).status());
    ASSERT_OK(store->DeleteVersion("m", 1, /*force=*/true).status());
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(path_)) {
    if (entry.is_regular_file()) fs::remove(entry.path());
  }
  ExpectVersionsIntact({2, 3});
  std::unique_ptr<RocksDbCheckpointStore> store = Open();
  ASSERT_OK_AND_ASSIGN(v1::Manifest production, store->GetManifest(Ref("m@production")));
  EXPECT_EQ(production.version(), 2);
  HistoryQuery query;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> history, store->ListHistory(query));
  EXPECT_GE(history.size(), 5u);  // 3 commits, the alias, the delete.
}

}  // namespace
}  // namespace ckpt
