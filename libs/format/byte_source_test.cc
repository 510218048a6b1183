#include "libs/format/byte_source.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(FileSourceTest, ReadsTheRangesAsked) {
  const std::string path = TempPath("bytes.bin");
  std::ofstream(path, std::ios::binary) << "0123456789";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ByteSource> source, OpenFileSource(path));
  EXPECT_EQ(source->size(), 10u);
  EXPECT_EQ(source->name(), path);
  std::string middle(4, '\0');
  ASSERT_OK(source->ReadAt(3, absl::MakeSpan(middle)));
  EXPECT_EQ(middle, "3456");
  ASSERT_OK_AND_ASSIGN(std::string tail, source->ReadString(7, 3));
  EXPECT_EQ(tail, "789");
  ASSERT_OK_AND_ASSIGN(std::string empty, source->ReadString(10, 0));
  EXPECT_EQ(empty, "");
}

TEST(FileSourceTest, RangesPastTheEndAreDataLoss) {
  const std::string path = TempPath("short.bin");
  std::ofstream(path, std::ios::binary) << "abc";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ByteSource> source, OpenFileSource(path));
  EXPECT_THAT(source->ReadString(2, 2), StatusIs(absl::StatusCode::kDataLoss, "has 3 bytes"));
  EXPECT_THAT(source->ReadString(~uint64_t{0}, 2), StatusIs(absl::StatusCode::kDataLoss));
  // A huge claimed length fails before anything is allocated.
  EXPECT_THAT(source->ReadString(0, uint64_t{1} << 60), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(FileSourceTest, MissingFilesAndDirectoriesAreClearErrors) {
  EXPECT_THAT(OpenFileSource(TempPath("no-such-file.pt")),
              StatusIs(absl::StatusCode::kNotFound, "no-such-file.pt"));
  EXPECT_THAT(OpenFileSource(TempPath("")),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a regular file"));
}

TEST(MemorySourceTest, ReadsAndBoundsChecks) {
  const std::string bytes = "hello";
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "mem");
  EXPECT_EQ(source->size(), 5u);
  ASSERT_OK_AND_ASSIGN(std::string ell, source->ReadString(1, 3));
  EXPECT_EQ(ell, "ell");
  EXPECT_THAT(source->ReadString(4, 2), StatusIs(absl::StatusCode::kDataLoss, "mem"));
}

}  // namespace
}  // namespace ckpt
