#include "libs/store/upload_split.h"

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt {

std::vector<std::vector<UploadRange>> SplitUpload(const v1::Manifest& header, int writers,
                                                  const std::vector<int>& first_writer_only,
                                                  const std::vector<int>& supplied_by_writers) {
  writers = std::max(writers, 1);
  std::vector<std::vector<UploadRange>> split(writers);
  const absl::flat_hash_set<int> pinned(first_writer_only.begin(), first_writer_only.end());
  const absl::flat_hash_set<int> supplied(supplied_by_writers.begin(), supplied_by_writers.end());
  const int model_tensors = header.tensors_size();
  const int tensors = model_tensors + header.state_tensors_size();
  auto length_of = [&](int index) {
    return index < model_tensors ? header.tensors(index).byte_length()
                                 : header.state_tensors(index - model_tensors).byte_length();
  };
  int64_t pinned_bytes = 0;
  int64_t shared_bytes = 0;
  for (int index = 0; index < tensors; ++index) {
    if (supplied.contains(index)) continue;
    (pinned.contains(index) ? pinned_bytes : shared_bytes) += length_of(index);
  }
  for (int index : first_writer_only) {
    if (index >= 0 && index < tensors && length_of(index) > 0 && !supplied.contains(index)) {
      split[0].push_back(UploadRange{index, 0, length_of(index)});
    }
  }
  // Writer w's stretch ends where the running total of shared bytes reaches its share of all
  // bytes (pinned ones count towards writer 0's share).
  const int64_t total = pinned_bytes + shared_bytes;
  auto quota_end = [&](int writer) {  // shared bytes handed out once writers 0..writer are done.
    const int64_t end = total * (writer + 1) / writers - pinned_bytes;
    return std::max<int64_t>(end, 0);
  };
  int writer = 0;
  int64_t handed_out = 0;  // shared bytes given to writers so far.
  for (int index = 0; index < tensors; ++index) {
    if (pinned.contains(index) || supplied.contains(index)) continue;
    const int64_t length = length_of(index);
    int64_t begin = 0;
    while (begin < length) {
      while (writer + 1 < writers && handed_out >= quota_end(writer)) ++writer;
      int64_t end = length;
      if (writer + 1 < writers && handed_out + (length - begin) > quota_end(writer) &&
          length > kChunkBytes) {
        // Cut on the chunk boundary nearest the quota, at least one chunk in.
        const int64_t want = quota_end(writer) - handed_out;
        int64_t cut = begin + (want + kChunkBytes / 2) / kChunkBytes * kChunkBytes;
        cut = std::clamp(cut, begin + kChunkBytes, length);
        end = cut;
      }
      split[writer].push_back(UploadRange{index, begin, end});
      handed_out += end - begin;
      // A cut is as near the writer's mark as the chunk grid allows: the next writer goes on.
      if (end < length && writer + 1 < writers) ++writer;
      begin = end;
    }
  }
  return split;
}

}  // namespace ckpt
