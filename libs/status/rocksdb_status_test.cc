#include "libs/status/rocksdb_status.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(FromRocksDbStatusTest, MapsEachKindOfFailureToItsCanonicalCode) {
  EXPECT_OK(FromRocksDbStatus(rocksdb::Status::OK()));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::NotFound("key")),
              StatusIs(absl::StatusCode::kNotFound, "key"));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::Corruption("bad block")),
              StatusIs(absl::StatusCode::kDataLoss, "bad block"));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::NoSpace("disk full")),
              StatusIs(absl::StatusCode::kResourceExhausted, "disk full"));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::IOError("read failed")),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::Busy()), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::TimedOut()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::ShutdownInProgress()),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::InvalidArgument("bad option")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::NotSupported("feature")),
              StatusIs(absl::StatusCode::kUnimplemented));
}

TEST(FromRocksDbStatusTest, PrefixesTheContext) {
  EXPECT_THAT(FromRocksDbStatus(rocksdb::Status::Corruption("bad block"), "reading manifest"),
              StatusIs(absl::StatusCode::kDataLoss, "reading manifest: Corruption: bad block"));
}

TEST(FromRocksDbStatusTest, TranslatesARealFailureFromOpeningAMissingDatabase) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  rocksdb::Options options;
  options.create_if_missing = false;
  rocksdb::DB* raw_db = nullptr;
  const std::string path = std::string(tmp) + "/does-not-exist";
  const rocksdb::Status opened = rocksdb::DB::Open(options, path, &raw_db);
  std::unique_ptr<rocksdb::DB> db(raw_db);
  ASSERT_FALSE(opened.ok());
  const absl::Status status = FromRocksDbStatus(opened, "opening " + path);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), ::testing::HasSubstr("does-not-exist"));
}

TEST(ToRocksDbStatusTest, RoundTripsTheCodesRocksDbHas) {
  for (const absl::Status& status :
       {absl::NotFoundError("a"), absl::DataLossError("b"), absl::ResourceExhaustedError("c"),
        absl::AbortedError("d"), absl::DeadlineExceededError("e"),
        absl::InvalidArgumentError("f")}) {
    EXPECT_EQ(FromRocksDbStatus(ToRocksDbStatus(status)).code(), status.code()) << status;
  }
  EXPECT_TRUE(ToRocksDbStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace ckpt
