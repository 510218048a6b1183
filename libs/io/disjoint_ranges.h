#ifndef CKPT_LIBS_IO_DISJOINT_RANGES_H_
#define CKPT_LIBS_IO_DISJOINT_RANGES_H_

// Byte ranges of one file handed out so far, none overlapping. A reader that lends a file's
// regions to several tensors (the store's mapped loads, the shared-memory loader's pack-file
// descriptors) must never give two tensors the same bytes, or a write to one would show in the
// other; deduplicated chunks make such overlaps possible, so each hand-out is claimed first and a
// refused claim falls back to a copy.
//
// Example:
//   DisjointRanges handed_out;
//   if (handed_out.Claim(offset, offset + length)) { /* lend the region */ } else { /* copy */ }

#include <cstdint>
#include <map>

namespace ckpt {

class DisjointRanges {
 public:
  // Claims [start, end) and returns true; returns false, claiming nothing, when it overlaps a
  // range claimed before. Empty ranges never overlap anything. Not thread-safe.
  bool Claim(int64_t start, int64_t end);

 private:
  std::map<int64_t, int64_t> ranges_;  // start -> end, disjoint.
};

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_DISJOINT_RANGES_H_
