#include "libs/io/prefault.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kPages = 64;

long MinorFaults() {
  struct rusage usage;
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Which pages of [base, base + pages * kPage) are mapped in this process (mincore).
std::vector<bool> Resident(void* base, size_t pages) {
  std::vector<unsigned char> flags(pages);
  EXPECT_EQ(::mincore(base, pages * kPage, flags.data()), 0);
  std::vector<bool> resident;
  for (unsigned char flag : flags) resident.push_back((flag & 1) != 0);
  return resident;
}

TEST(PrefaultTest, WriteMapsTheWholePagesInsideTheRangeOnly) {
  void* base =
      ::mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  char* bytes = static_cast<char*>(base);
  ASSERT_EQ(Resident(base, kPages), std::vector<bool>(kPages, false));
  // Starts 100 bytes into page 0 and ends 100 bytes before the end: pages 1..62 are whole.
  if (!PrefaultForWrite(bytes + 100, kPages * kPage - 200)) {
    ::munmap(base, kPages * kPage);
    GTEST_SKIP() << "MADV_POPULATE_WRITE is not supported by this kernel";
  }
  const std::vector<bool> resident = Resident(base, kPages);
  EXPECT_FALSE(resident.front());
  EXPECT_FALSE(resident.back());
  for (size_t page = 1; page + 1 < kPages; ++page) EXPECT_TRUE(resident[page]) << page;
  // Still ordinary zeroed, writable memory.
  EXPECT_EQ(bytes[kPage * 5], 0);
  bytes[kPage * 5] = 7;
  EXPECT_EQ(bytes[kPage * 5], 7);
  ::munmap(base, kPages * kPage);
}

TEST(PrefaultTest, ReadMapsFilePagesWithoutChangingThem) {
  char path[] = "/tmp/prefault_test_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string contents(kPages * kPage, 'x');
  ASSERT_EQ(::write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
  void* base = ::mmap(nullptr, kPages * kPage, PROT_READ, MAP_PRIVATE, fd, 0);
  ASSERT_NE(base, MAP_FAILED);
  if (!PrefaultForRead(base, kPages * kPage)) {
    GTEST_SKIP() << "MADV_POPULATE_READ is not supported by this kernel";
  }
  // The pages are mapped already: reading every one of them takes (next to) no page faults,
  // where without the prefault it takes at least one per 16 pages (fault-around).
  const long faults_before = MinorFaults();
  long sum = 0;
  for (size_t page = 0; page < kPages; ++page) sum += static_cast<const char*>(base)[page * kPage];
  EXPECT_LT(MinorFaults() - faults_before, 2);
  EXPECT_EQ(sum, static_cast<long>('x') * kPages);
  ::munmap(base, kPages * kPage);
  ::close(fd);
  ::unlink(path);
}

TEST(PrefaultTest, RangesWithoutAWholePageAreLeftAlone) {
  alignas(4096) static char buffer[2 * 4096];
  EXPECT_FALSE(PrefaultForWrite(buffer + 1, 4096));  // straddles two pages, holds neither
  EXPECT_FALSE(PrefaultForRead(buffer, 0));
}

}  // namespace
}  // namespace ckpt
