#include "libs/io/parallel_copy.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "libs/io/prefault.h"

namespace ckpt {
namespace {

// Copies bytes [begin, end) of the concatenation of `ranges`.
void CopyShare(absl::Span<const CopyRange> ranges, size_t begin, size_t end) {
  size_t range_start = 0;  // offset of the current range in the concatenation.
  for (const CopyRange& range : ranges) {
    const size_t range_end = range_start + range.bytes;
    const size_t from = std::max(begin, range_start);
    const size_t to = std::min(end, range_end);
    if (from < to) {
      char* destination = static_cast<char*>(range.destination) + (from - range_start);
      const char* source = static_cast<const char*>(range.source) + (from - range_start);
      if (range.prefault_destination) PrefaultForWrite(destination, to - from);
      std::memcpy(destination, source, to - from);
    }
    range_start = range_end;
    if (range_start >= end) break;
  }
}

}  // namespace

void ParallelCopy(absl::Span<const CopyRange> ranges, int max_threads,
                  size_t min_bytes_per_thread) {
  size_t total = 0;
  for (const CopyRange& range : ranges) total += range.bytes;
  if (total == 0) return;
  const size_t by_size = std::max<size_t>(1, total / std::max<size_t>(1, min_bytes_per_thread));
  const size_t threads = std::min<size_t>(std::max(1, max_threads), by_size);
  // Share i is [total * i / threads, total * (i + 1) / threads): equal to within a byte.
  auto share_begin = [&](size_t i) {
    return static_cast<size_t>(static_cast<unsigned __int128>(total) * i / threads);
  };
  std::vector<std::thread> helpers;
  size_t first_share_without_thread = threads;
  try {
    helpers.reserve(threads - 1);
    for (size_t i = 1; i < threads; ++i) {
      helpers.emplace_back(CopyShare, ranges, share_begin(i), share_begin(i + 1));
    }
  } catch (...) {
    // No thread to be had (EAGAIN, memory): the shares that got none are copied here. The
    // threads that did start must still be joined, or their destructors would terminate.
    first_share_without_thread = 1 + helpers.size();
  }
  CopyShare(ranges, 0, share_begin(1));
  if (first_share_without_thread < threads) {
    CopyShare(ranges, share_begin(first_share_without_thread), total);
  }
  for (std::thread& helper : helpers) helper.join();
}

int DefaultCopyThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
}

}  // namespace ckpt
