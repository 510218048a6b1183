#include "libs/store/rocksdb_schema.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

TEST(RocksDbSchemaTest, VersionKeysSortNumericallyAndModelsDoNotInterleave) {
  EXPECT_LT(VersionKey("m", 2), VersionKey("m", 10));
  EXPECT_LT(VersionKey("m", 255), VersionKey("m", 256));
  // Every key of "a" sorts before every key of "ab": '\0' ends the model name.
  EXPECT_LT(VersionKey("a", 1u << 30), VersionKey("ab", 1));
  EXPECT_EQ(VersionKey("m", 1).substr(0, 2), ModelPrefix("m"));
}

TEST(RocksDbSchemaTest, VersionKeyRoundTripsAndRejectsOtherModels) {
  ASSERT_OK_AND_ASSIGN(int64_t version, VersionFromKey(VersionKey("model", 123456789), "model"));
  EXPECT_EQ(version, 123456789);
  EXPECT_THAT(VersionFromKey(VersionKey("other", 1), "model"),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(AliasFromKey(AliasKey("model", "best"), "model"), "best");
}

TEST(RocksDbSchemaTest, BigEndianRoundTrips) {
  for (uint64_t value : {uint64_t{0}, uint64_t{1}, uint64_t{0x0102030405060708}, ~uint64_t{0}}) {
    ASSERT_OK_AND_ASSIGN(uint64_t decoded, DecodeBigEndian64(EncodeBigEndian64(value)));
    EXPECT_EQ(decoded, value);
  }
  EXPECT_EQ(EncodeBigEndian64(1), std::string("\0\0\0\0\0\0\0\x01", 8));
  EXPECT_THAT(DecodeBigEndian64("abc"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(RocksDbSchemaTest, ChunksLiveInBlobFilesUncompressed) {
  const rocksdb::ColumnFamilyOptions chunks = MakeColumnFamilyOptions(ColumnFamily::kChunks);
  EXPECT_TRUE(chunks.enable_blob_files);
  EXPECT_TRUE(chunks.enable_blob_garbage_collection);
  EXPECT_EQ(chunks.min_blob_size, 64u * 1024);
  EXPECT_EQ(chunks.blob_compression_type, rocksdb::kNoCompression);
  EXPECT_FALSE(MakeColumnFamilyOptions(ColumnFamily::kRefs).enable_blob_files);
  EXPECT_EQ(MakeDbOptions(true).max_background_jobs, 2);
}

TEST(RocksDbSchemaTest, OpensEveryColumnFamilyAndReopens) {
  const std::string path = TestDir("schema_reopen");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, true));
    for (int i = 0; i < kColumnFamilyCount; ++i) {
      const ColumnFamily cf = static_cast<ColumnFamily>(i);
      ASSERT_NE(db->cf(cf), nullptr);
      EXPECT_EQ(db->cf(cf)->GetName(), ColumnFamilyName(cf));
    }
    ASSERT_TRUE(
        db->db()->Put(rocksdb::WriteOptions(), db->cf(ColumnFamily::kModels), "m", "x").ok());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, false));
  std::string value;
  ASSERT_TRUE(
      db->db()->Get(rocksdb::ReadOptions(), db->cf(ColumnFamily::kModels), "m", &value).ok());
  EXPECT_EQ(value, "x");
}

TEST(RocksDbSchemaTest, MissingStoreIsNotFoundWithoutCreate) {
  EXPECT_THAT(StoreDb::Open(TestDir("schema_missing"), false),
              StatusIs(absl::StatusCode::kNotFound, "schema_missing"));
}

TEST(RocksDbSchemaTest, RefusesAnotherSchemaVersion) {
  const std::string path = TestDir("schema_version");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, true));
    ASSERT_TRUE(db->db()
                    ->Put(rocksdb::WriteOptions(), db->cf(ColumnFamily::kDefault),
                          std::string(kSchemaVersionKey), "99")
                    .ok());
  }
  EXPECT_THAT(StoreDb::Open(path, false),
              StatusIs(absl::StatusCode::kFailedPrecondition, "schema version 99"));
}

TEST(RocksDbSchemaTest, UpgradesSchemaOneInPlace) {
  const std::string path = TestDir("schema_upgrade");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, true));
    ASSERT_TRUE(db->db()
                    ->Put(rocksdb::WriteOptions(), db->cf(ColumnFamily::kDefault),
                          std::string(kSchemaVersionKey), std::string(kSchemaVersionInlineChunks))
                    .ok());
    ASSERT_TRUE(
        db->db()->Put(rocksdb::WriteOptions(), db->cf(ColumnFamily::kChunks), "k", "v").ok());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, false));
  std::string value;
  ASSERT_TRUE(db->db()
                  ->Get(rocksdb::ReadOptions(), db->cf(ColumnFamily::kDefault),
                        std::string(kSchemaVersionKey), &value)
                  .ok());
  EXPECT_EQ(value, kSchemaVersion);
  ASSERT_TRUE(
      db->db()->Get(rocksdb::ReadOptions(), db->cf(ColumnFamily::kChunks), "k", &value).ok());
  EXPECT_EQ(value, "v");
}

// The store at `name` with one record written, closed; returns its path and MANIFEST file name.
std::string ClosedStore(const std::string& name, std::string* manifest) {
  const std::string path = TestDir(name);
  {
    absl::StatusOr<std::unique_ptr<StoreDb>> db = StoreDb::Open(path, true);
    EXPECT_TRUE(db.ok()) << db.status();
    if (!db.ok()) return path;
    EXPECT_TRUE(
        (*db)->db()->Put(rocksdb::WriteOptions(), (*db)->cf(ColumnFamily::kModels), "m", "x").ok());
  }
  std::ifstream current(path + "/CURRENT");
  std::getline(current, *manifest);
  return path;
}

// A MANIFEST that CURRENT names but that is gone is damage, not an absent store: the message must
// not send the user to import a checkpoint, and must say what to do.
TEST(RocksDbSchemaTest, MissingManifestIsDataLossNotAnAbsentStore) {
  std::string manifest;
  const std::string path = ClosedStore("schema_no_manifest", &manifest);
  ASSERT_FALSE(manifest.empty());
  ASSERT_EQ(std::remove((path + "/" + manifest).c_str()), 0);
  for (bool create : {false, true}) {
    const absl::Status status = StoreDb::Open(path, create).status();
    EXPECT_THAT(
        status,
        StatusIs(absl::StatusCode::kDataLoss,
                 ::testing::AllOf(::testing::HasSubstr(path), ::testing::HasSubstr("damaged"),
                                  ::testing::HasSubstr(manifest), ::testing::HasSubstr("backup"))));
  }
}

TEST(RocksDbSchemaTest, CorruptManifestNamesTheDamageAndTheRemedy) {
  std::string manifest;
  const std::string path = ClosedStore("schema_bad_manifest", &manifest);
  ASSERT_FALSE(manifest.empty());
  {
    std::ofstream out(path + "/" + manifest, std::ios::binary | std::ios::trunc);
    out << std::string(600, '\x5a');
  }
  EXPECT_THAT(StoreDb::Open(path, false),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::AllOf(::testing::HasSubstr(path), ::testing::HasSubstr("damaged"),
                                        ::testing::HasSubstr("Corruption"),
                                        ::testing::HasSubstr("backup"))));
}

// Without CURRENT the database's other files are still there: opening must not create a new
// database over them (RocksDB would then purge the SSTs as obsolete), and must name the repair.
TEST(RocksDbSchemaTest, MissingCurrentIsDataLossAndNothingIsCreatedOverTheFiles) {
  std::string manifest;
  const std::string path = ClosedStore("schema_no_current", &manifest);
  ASSERT_EQ(std::remove((path + "/CURRENT").c_str()), 0);
  for (bool create : {false, true}) {
    EXPECT_THAT(StoreDb::Open(path, create),
                StatusIs(absl::StatusCode::kDataLoss,
                         ::testing::AllOf(::testing::HasSubstr("CURRENT is missing"),
                                          ::testing::HasSubstr("ckpt repair --store_dir=" + path),
                                          ::testing::HasSubstr("backup"))));
    EXPECT_FALSE(std::ifstream(path + "/CURRENT").good()) << "a database was created over it";
    EXPECT_TRUE(std::ifstream(path + "/" + manifest).good());
  }
}

// Commits are synced, so a WAL record that fails its checksum before the end of the log is
// damage. RocksDB's default (point-in-time recovery) would open and silently drop every record
// from there on: acknowledged commits lost with nothing said.
TEST(RocksDbSchemaTest, WalRecordCorruptBeforeTheEndRefusesToOpen) {
  const std::string path = TestDir("schema_bad_wal");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, true));
    rocksdb::WriteOptions sync;
    sync.sync = true;
    for (const char* key : {"a", "b", "c"}) {
      ASSERT_TRUE(db->db()->Put(sync, db->cf(ColumnFamily::kModels), key, "record").ok());
    }
  }
  std::string wal;
  for (int number = 1; number < 100 && wal.empty(); ++number) {
    char name[32];
    std::snprintf(name, sizeof(name), "/%06d.log", number);
    std::ifstream in(path + name, std::ios::binary);
    if (in.good() && in.seekg(0, std::ios::end).tellg() > 100) wal = path + name;
  }
  ASSERT_FALSE(wal.empty()) << "no WAL with the records in " << path;
  {
    // The first record (the schema version) spans bytes [0, 7 + its payload); 10 is in it.
    std::fstream file(wal, std::ios::binary | std::ios::in | std::ios::out);
    file.seekg(10);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x40);
    file.seekp(10);
    file.write(&byte, 1);
  }
  EXPECT_THAT(StoreDb::Open(path, false),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("ckpt repair")));
}

TEST(RocksDbSchemaTest, SecondOpenOfOneStoreFails) {
  const std::string path = TestDir("schema_locked");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreDb> db, StoreDb::Open(path, true));
  EXPECT_FALSE(StoreDb::Open(path, true).ok());
}

}  // namespace
}  // namespace ckpt
