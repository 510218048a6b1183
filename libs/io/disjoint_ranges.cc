#include "libs/io/disjoint_ranges.h"

#include <iterator>

namespace ckpt {

bool DisjointRanges::Claim(int64_t start, int64_t end) {
  if (end <= start) return true;
  auto next = ranges_.lower_bound(start);
  if (next != ranges_.end() && next->first < end) return false;
  if (next != ranges_.begin() && std::prev(next)->second > start) return false;
  ranges_.emplace(start, end);
  return true;
}

}  // namespace ckpt
