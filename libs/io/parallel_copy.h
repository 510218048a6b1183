#ifndef CKPT_LIBS_IO_PARALLEL_COPY_H_
#define CKPT_LIBS_IO_PARALLEL_COPY_H_

// Bulk memory copies spread over several threads.
//
// One core does not saturate memory bandwidth: on the benchmark machine one thread copies
// 15-18 GiB/s and two copy 20-30 GiB/s (tools/bench R7). LibTorch's own copy runs on its
// intra-op pool, which training processes often size to one thread (torchrun sets
// OMP_NUM_THREADS=1; Debian's torch defaults to 1 on that machine), so a snapshot taken while
// the trainer waits would use one core of several. ParallelCopy brings its own threads.

#include <cstddef>

#include "absl/types/span.h"

namespace ckpt {

struct CopyRange {
  void* destination = nullptr;
  const void* source = nullptr;
  size_t bytes = 0;
  // Map the destination's pages in one call first (libs/io/prefault.h): for memory the process
  // has not touched yet, where a page fault per 4 KiB would cost more than the copy.
  bool prefault_destination = false;
};

// Copies every range (memcpy; ranges must not overlap). The bytes of all ranges together are cut
// into equal contiguous shares, one per thread, with at most `max_threads` threads (the calling
// thread is one of them) and none with less than `min_bytes_per_thread`, so a small total is
// copied on the calling thread alone. Returns when every byte is copied.
void ParallelCopy(absl::Span<const CopyRange> ranges, int max_threads,
                  size_t min_bytes_per_thread = size_t{8} << 20);

// The threads a bulk copy should use here: the hardware threads, at most 8 (more measured no
// faster on memory-bound copies).
int DefaultCopyThreads();

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_PARALLEL_COPY_H_
