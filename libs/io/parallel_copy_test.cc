#include "libs/io/parallel_copy.h"

#include <sys/mman.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Ranges of the given sizes laid out one after another in `source` and `destination`, with a
// gap of one guard byte after each, which no copy may touch.
struct Layout {
  std::vector<uint8_t> source;
  std::vector<uint8_t> destination;
  std::vector<CopyRange> ranges;
};

Layout MakeLayout(const std::vector<size_t>& sizes, uint32_t seed) {
  size_t total = 0;
  for (size_t size : sizes) total += size + 1;
  Layout layout;
  layout.source.resize(total);
  layout.destination.assign(total, 0xEE);
  std::mt19937 random(seed);
  for (uint8_t& byte : layout.source) byte = static_cast<uint8_t>(random());
  size_t offset = 0;
  for (size_t size : sizes) {
    layout.ranges.push_back(
        {layout.destination.data() + offset, layout.source.data() + offset, size});
    offset += size + 1;
  }
  return layout;
}

void ExpectCopied(const Layout& layout) {
  size_t offset = 0;
  for (const CopyRange& range : layout.ranges) {
    for (size_t i = 0; i < range.bytes; ++i) {
      ASSERT_EQ(layout.destination[offset + i], layout.source[offset + i])
          << "range at " << offset << ", byte " << i;
    }
    offset += range.bytes;
    ASSERT_EQ(layout.destination[offset], 0xEE) << "guard byte after the range was written";
    ++offset;
  }
}

TEST(ParallelCopyTest, CopiesEveryRangeWhateverTheSplit) {
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 0, 100000, 3, 65536, 12345, 1, 0, 250000};
  // Small minimum shares force splits inside ranges, at range boundaries and inside empty ones.
  for (int threads : {1, 2, 3, 5, 8, 64}) {
    for (size_t min_share : {size_t{1}, size_t{1000}, size_t{65536}, size_t{1} << 30}) {
      SCOPED_TRACE(testing::Message() << threads << " threads, min share " << min_share);
      Layout layout = MakeLayout(sizes, threads * 31 + static_cast<uint32_t>(min_share));
      ParallelCopy(layout.ranges, threads, min_share);
      ExpectCopied(layout);
    }
  }
}

TEST(ParallelCopyTest, RandomSizesAndThreadCounts) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<size_t> sizes(1 + random() % 20);
    for (size_t& size : sizes) size = random() % 3 == 0 ? 0 : random() % 50000;
    Layout layout = MakeLayout(sizes, trial);
    ParallelCopy(layout.ranges, 1 + random() % 6, 1 + random() % 20000);
    ExpectCopied(layout);
  }
}

TEST(ParallelCopyTest, NothingToCopyIsFine) {
  ParallelCopy({}, 4);
  Layout layout = MakeLayout({0, 0}, 1);
  ParallelCopy(layout.ranges, 4, 1);
  ExpectCopied(layout);
}

TEST(ParallelCopyTest, PrefaultedDestinationInFreshMemoryIsCopiedExactly) {
  constexpr size_t kBytes = size_t{4} << 20;
  void* fresh = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  std::vector<uint8_t> source(kBytes - 100);
  std::mt19937 random(3);
  for (uint8_t& byte : source) byte = static_cast<uint8_t>(random());
  // Starts mid-page, so the prefault of each share has partial pages at its ends.
  uint8_t* destination = static_cast<uint8_t*>(fresh) + 50;
  const CopyRange range{destination, source.data(), source.size(), /*prefault=*/true};
  ParallelCopy({&range, 1}, 3, 1 << 20);
  EXPECT_EQ(std::vector<uint8_t>(destination, destination + source.size()), source);
  ::munmap(fresh, kBytes);
}

TEST(ParallelCopyTest, DefaultThreadsIsBetweenOneAndEight) {
  EXPECT_GE(DefaultCopyThreads(), 1);
  EXPECT_LE(DefaultCopyThreads(), 8);
}

}  // namespace
}  // namespace ckpt
