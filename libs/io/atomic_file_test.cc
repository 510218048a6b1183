#include "libs/io/atomic_file.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

std::string TestDir(const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* handle = opendir(dir.c_str());
  while (dirent* entry = readdir(handle)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(handle);
  return names;
}

TEST(AtomicFileWriterTest, CommitReplacesTheFileWholeAndLeavesNoTemporaryFile) {
  const std::string dir = TestDir("commit");
  const std::string path = dir + "/model.safetensors";
  ASSERT_OK(WriteFileAtomically(path, "old contents"));
  ASSERT_OK_AND_ASSIGN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  ASSERT_OK(writer.Append("new "));
  ASSERT_OK(writer.Append(std::string(1 << 20, 'x')));
  // Until Commit, readers still see the old file.
  EXPECT_EQ(ReadFile(path), "old contents");
  EXPECT_EQ(writer.bytes_written(), 4u + (1 << 20));
  ASSERT_OK(writer.Commit());
  EXPECT_EQ(ReadFile(path), "new " + std::string(1 << 20, 'x'));
  EXPECT_THAT(ListDir(dir), ElementsAre("model.safetensors"));
  EXPECT_THAT(writer.Append("more"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(AtomicFileWriterTest, AnAbandonedWriteLeavesTheOldFileUntouched) {
  const std::string dir = TestDir("abandon");
  const std::string path = dir + "/model.pt";
  ASSERT_OK(WriteFileAtomically(path, "committed"));
  {
    ASSERT_OK_AND_ASSIGN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
    ASSERT_OK(writer.Append("half of a new fi"));
    // Destroyed without Commit: a crash or error mid-write.
  }
  EXPECT_EQ(ReadFile(path), "committed");
  EXPECT_THAT(ListDir(dir), ElementsAre("model.pt"));
}

TEST(AtomicFileWriterTest, ReportsMissingDirectoriesAndDirectoryTargets) {
  const std::string dir = TestDir("errors");
  EXPECT_THAT(AtomicFileWriter::Create(dir + "/no/such/dir/file"),
              StatusIs(absl::StatusCode::kNotFound, "no/such/dir/file"));
  EXPECT_THAT(AtomicFileWriter::Create(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, "is a directory"));
}

TEST(AtomicFileWriterTest, RunningOutOfSpaceMidWriteIsResourceExhaustedAndKeepsTheOldFile) {
  const std::string dir = TestDir("full");
  const std::string path = dir + "/model.pt";
  ASSERT_OK(WriteFileAtomically(path, "committed"));
  // A file-size limit makes write() fail part-way, as a full disk does (EFBIG, not ENOSPC).
  signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status appended;
  {
    ASSERT_OK_AND_ASSIGN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
    appended = writer.Append(std::string(1 << 20, 'y'));
    EXPECT_THAT(writer.Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  EXPECT_THAT(appended, StatusIs(absl::StatusCode::kResourceExhausted, "model.pt"));
  EXPECT_EQ(ReadFile(path), "committed");
  EXPECT_THAT(ListDir(dir), ElementsAre("model.pt"));
}

TEST(ErrnoToStatusTest, MapsErrnoToCanonicalCodes) {
  EXPECT_THAT(ErrnoToStatus(ENOSPC, "writing", "/data/x"),
              StatusIs(absl::StatusCode::kResourceExhausted, "writing /data/x"));
  EXPECT_THAT(ErrnoToStatus(EACCES, "creating", "/x"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(ErrnoToStatus(ENOENT, "opening", "/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ErrnoToStatus(EIO, "reading", "/x"), StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace ckpt
