#include "libs/store/change_log_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::StatusIs;

std::string TestDir() {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir + "/changes";
}

std::string Record(int64_t n) { return EncodeChangeFrame(absl::StrCat("change number ", n)); }

TEST(DirectoryChangeLogTest, AppendsReadsBackInPagesAndSurvivesReopen) {
  const std::string dir = TestDir();
  {
    ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
    EXPECT_EQ(log->last_sequence(), 0);
    ASSERT_OK_AND_ASSIGN(auto none, log->ReadAfter(0, 10));
    EXPECT_TRUE(none.empty());
    for (int64_t n = 1; n <= 25; ++n) ASSERT_OK(log->Append(n, Record(n)));
    int64_t after = 0;
    while (true) {
      ASSERT_OK_AND_ASSIGN(auto page, log->ReadAfter(after, 7));
      if (page.empty()) break;
      for (const LoggedChange& change : page) {
        EXPECT_EQ(change.sequence, after + 1);
        EXPECT_EQ(change.bytes, Record(change.sequence));
        after = change.sequence;
      }
    }
    EXPECT_EQ(after, 25);
  }
  ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
  EXPECT_EQ(log->last_sequence(), 25);
  ASSERT_OK_AND_ASSIGN(auto tail, log->ReadAfter(20, 100));
  ASSERT_EQ(tail.size(), 5u);
  EXPECT_EQ(tail[0].sequence, 21);
  ASSERT_OK(log->Append(26, Record(26)));
}

TEST(DirectoryChangeLogTest, SnapshotsAreKeptTwoNewestBesideTheSegments) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
  for (int64_t n = 1; n <= 5; ++n) ASSERT_OK(log->Append(n, Record(n)));
  ASSERT_OK_AND_ASSIGN(int64_t latest, log->LatestSnapshot());
  EXPECT_EQ(latest, 0);
  for (int64_t n : {2, 4, 5}) ASSERT_OK(log->PutSnapshot(n, Record(100 + n)));
  ASSERT_OK_AND_ASSIGN(latest, log->LatestSnapshot());
  EXPECT_EQ(latest, 5);
  ASSERT_OK_AND_ASSIGN(std::string bytes, log->ReadSnapshot(5));
  EXPECT_EQ(bytes, Record(105));
  EXPECT_THAT(log->ReadSnapshot(2), StatusIs(absl::StatusCode::kNotFound));
  // A reopened log still finds its records (the snapshots' directory is not a segment) and them.
  log.reset();
  ASSERT_OK_AND_ASSIGN(log, DirectoryChangeLog::Open(dir));
  EXPECT_EQ(log->last_sequence(), 5);
  ASSERT_OK_AND_ASSIGN(latest, log->LatestSnapshot());
  EXPECT_EQ(latest, 5);
}

TEST(DirectoryChangeLogTest, ATakenNumberIsFencedUnlessItHoldsTheSameBytes) {
  ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(TestDir()));
  ASSERT_OK(log->Append(1, Record(1)));
  ASSERT_OK(log->Append(2, Record(2)));
  EXPECT_OK(log->Append(2, Record(2)));  // a retry of the same append.
  EXPECT_THAT(log->Append(2, Record(99)), StatusIs(absl::StatusCode::kAlreadyExists, "change 2"));
  EXPECT_THAT(log->Append(5, Record(5)), StatusIs(absl::StatusCode::kInvalidArgument, "follow"));
}

TEST(DirectoryChangeLogTest, SegmentsRollOverAndReadAcrossThem) {
  const std::string dir = TestDir();
  const std::string big(3 << 20, 'b');
  {
    ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
    for (int64_t n = 1; n <= 7; ++n) ASSERT_OK(log->Append(n, EncodeChangeFrame(big + char('0' + n))));
  }
  int segments = 0;
  for (const auto& entry : fs::directory_iterator(dir)) segments += entry.path().extension() == ".changes";
  EXPECT_GE(segments, 2);
  ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
  EXPECT_EQ(log->last_sequence(), 7);
  ASSERT_OK_AND_ASSIGN(auto all, log->ReadAfter(0, 100));
  ASSERT_EQ(all.size(), 7u);
  for (int64_t n = 1; n <= 7; ++n) {
    ASSERT_OK_AND_ASSIGN(absl::string_view payload, DecodeChangeFrame(all[n - 1].bytes, ""));
    EXPECT_EQ(payload.back(), char('0' + n));
  }
  ASSERT_OK_AND_ASSIGN(auto from_five, log->ReadAfter(4, 100));
  ASSERT_EQ(from_five.size(), 3u);
  EXPECT_EQ(from_five[0].sequence, 5);
}

// A crash inside an append leaves a cut-short entry (or one whose bytes never all reached the
// disk): never acknowledged, so Open drops it and the number is written again.
TEST(DirectoryChangeLogTest, ATornLastEntryIsTruncatedAtOpen) {
  const std::string dir = TestDir();
  {
    ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
    for (int64_t n = 1; n <= 3; ++n) ASSERT_OK(log->Append(n, Record(n)));
  }
  const std::string segment = dir + "/" + ChangeName(1) + ".changes";
  const auto size = fs::file_size(segment);
  for (const uintmax_t cut : {uintmax_t{5}, uintmax_t{1}}) {
    fs::resize_file(segment, size - cut);
    ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
    EXPECT_EQ(log->last_sequence(), 2) << "cut " << cut;
    ASSERT_OK(log->Append(3, Record(3)));
  }
  // A flipped byte in the last frame: torn the same way.
  {
    const int fd = ::open(segment.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, size - 2), 1);
    byte ^= 1;
    ASSERT_EQ(::pwrite(fd, &byte, 1, size - 2), 1);
    ::close(fd);
  }
  ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
  EXPECT_EQ(log->last_sequence(), 2);
}

// Damage before the last entry is never taken for a torn append: a broken entry header is
// DATA_LOSS at open, and a damaged record's frame fails its checksum where it is read.
TEST(DirectoryChangeLogTest, DamageBeforeTheEndIsDataLoss) {
  const std::string dir = TestDir();
  {
    ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
    for (int64_t n = 1; n <= 3; ++n) ASSERT_OK(log->Append(n, Record(n)));
  }
  const std::string segment = dir + "/" + ChangeName(1) + ".changes";
  const int64_t entry_bytes = 12 + static_cast<int64_t>(Record(1).size());
  const int fd = ::open(segment.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, entry_bytes + 20), 1);  // inside change 2's frame.
  byte ^= 1;
  ASSERT_EQ(::pwrite(fd, &byte, 1, entry_bytes + 20), 1);
  {
    ASSERT_OK_AND_ASSIGN(auto log, DirectoryChangeLog::Open(dir));
    EXPECT_EQ(log->last_sequence(), 3);
    ASSERT_OK_AND_ASSIGN(auto all, log->ReadAfter(0, 10));
    ASSERT_EQ(all.size(), 3u);
    EXPECT_THAT(DecodeChangeFrame(all[1].bytes, "change 2"),
                StatusIs(absl::StatusCode::kDataLoss, "checksum"));
  }
  const char garbage[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  ASSERT_EQ(::pwrite(fd, garbage, 8, 0), 8);  // change 1's number.
  ::close(fd);
  EXPECT_THAT(DirectoryChangeLog::Open(dir), StatusIs(absl::StatusCode::kDataLoss, "damaged"));
}

}  // namespace
}  // namespace ckpt
