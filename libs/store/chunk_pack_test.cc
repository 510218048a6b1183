#include "libs/store/chunk_pack.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

std::string TestDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base != nullptr ? base : "/tmp") + "/" + name;
}

TEST(ChunkPackTest, AppendsReadsAndMapsWithAlignment) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PackDirectory> packs,
                       PackDirectory::Open(TestDir("packs_basic")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, packs->NewPack(7));
  ASSERT_OK_AND_ASSIGN(int64_t first, writer->Append("abc", /*alignment=*/1));
  ASSERT_OK_AND_ASSIGN(int64_t second, writer->Append(std::string(5000, 'z'), 4096));
  ASSERT_OK_AND_ASSIGN(int64_t third, writer->Append("tail", 1));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 4096);
  EXPECT_EQ(third, 4096 + 5000);
  EXPECT_THAT(writer->Sync(), IsOk());

  std::string read(3, '\0');
  ASSERT_THAT(packs->Read({7, first, 3}, read.data()), IsOk());
  EXPECT_EQ(read, "abc");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<MappedPackRegion> whole, packs->MapWhole(7));
  EXPECT_EQ(whole->size(), 4096 + 5000 + 4);
  EXPECT_EQ(std::string(whole->data() + second, 3), "zzz");
  EXPECT_EQ(std::string(whole->data() + third, 4), "tail");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(whole->data() + second) % 4096, 0u);
  // Writes to a mapping stay private: the file keeps its bytes.
  whole->data()[third] = 'X';
  read.resize(4);
  ASSERT_THAT(packs->Read({7, third, 4}, read.data()), IsOk());
  EXPECT_EQ(read, "tail");

  ASSERT_OK_AND_ASSIGN(auto listed, packs->List());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].pack_id, 7u);
  EXPECT_EQ(listed[0].size, 4096 + 5000 + 4);
  EXPECT_THAT(packs->NewPack(7), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST(ChunkPackTest, ShortOrMissingPacksAreDataLoss) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PackDirectory> packs,
                       PackDirectory::Open(TestDir("packs_short")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, packs->NewPack(1));
  ASSERT_THAT(writer->Append("0123456789", 1).status(), IsOk());
  std::string buffer(20, '\0');
  EXPECT_THAT(packs->Read({1, 5, 10}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss, "the file ends after 10 bytes"));
  // A mapping reports the file's size, so that callers never touch bytes past its end (SIGBUS).
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<MappedPackRegion> whole, packs->MapWhole(1));
  EXPECT_EQ(whole->size(), 10);
  EXPECT_THAT(packs->Read({2, 0, 1}, buffer.data()),
              StatusIs(absl::StatusCode::kDataLoss, "is missing"));
}

TEST(ChunkPackTest, RemovedPackStaysReadableUntilReleased) {
  const std::string dir = TestDir("packs_remove");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PackDirectory> packs, PackDirectory::Open(dir));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChunkWriter> writer, packs->NewPack(3));
  ASSERT_THAT(writer->Append("kept", 1).status(), IsOk());
  ASSERT_THAT(packs->Remove(3, /*generation=*/10), IsOk());
  EXPECT_NE(::access((dir + "/" + PackFileName(3)).c_str(), F_OK), 0);
  std::string buffer(4, '\0');
  ASSERT_THAT(packs->Read({3, 0, 4}, buffer.data()), IsOk());
  EXPECT_EQ(buffer, "kept");
  packs->ReleaseRemoved(9);  // an older generation: still open
  ASSERT_THAT(packs->Read({3, 0, 4}, buffer.data()), IsOk());
  packs->ReleaseRemoved(10);
  EXPECT_THAT(packs->Read({3, 0, 4}, buffer.data()), StatusIs(absl::StatusCode::kDataLoss));
  ASSERT_OK_AND_ASSIGN(auto listed, packs->List());
  EXPECT_TRUE(listed.empty());
}

TEST(ChunkPackTest, FullDiskIsResourceExhausted) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PackDirectory> packs,
                       PackDirectory::Open(TestDir("packs_full")));
  const int fd = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(fd, 0);
  PackWriter writer("/dev/full", TestDir("packs_full"), 9, fd);
  EXPECT_THAT(writer.Append("x", 1).status(), StatusIs(absl::StatusCode::kResourceExhausted));
  // A failed pack stays failed.
  EXPECT_THAT(writer.Sync(), StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace ckpt
