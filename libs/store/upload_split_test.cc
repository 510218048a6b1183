#include "libs/store/upload_split.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kChunk = kChunkBytes;

v1::Manifest Header(const std::vector<int64_t>& model, const std::vector<int64_t>& state = {}) {
  v1::Manifest header;
  for (size_t i = 0; i < model.size(); ++i) {
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key("w" + std::to_string(i));
    meta->set_byte_length(model[i]);
  }
  for (size_t i = 0; i < state.size(); ++i) {
    v1::TensorMeta* meta = header.add_state_tensors();
    meta->set_key("optimizer/state/" + std::to_string(i));
    meta->set_byte_length(state[i]);
  }
  return header;
}

int64_t LengthOf(const v1::Manifest& header, int index) {
  return index < header.tensors_size()
             ? header.tensors(index).byte_length()
             : header.state_tensors(index - header.tensors_size()).byte_length();
}

// Every part valid for JoinUpload, every non-empty tensor covered exactly once; the bytes per
// writer.
std::vector<int64_t> CheckSplit(const v1::Manifest& header,
                                const std::vector<std::vector<UploadRange>>& split) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> covered;
  std::vector<int64_t> bytes;
  for (const std::vector<UploadRange>& part : split) {
    int64_t sum = 0;
    if (!part.empty()) EXPECT_OK(CheckUploadRanges(header, part));
    for (const UploadRange& range : part) {
      covered[range.tensor_index].emplace_back(range.begin, range.end);
      sum += range.end - range.begin;
    }
    bytes.push_back(sum);
  }
  const int tensors = header.tensors_size() + header.state_tensors_size();
  for (int index = 0; index < tensors; ++index) {
    std::vector<std::pair<int64_t, int64_t>>& ranges = covered[index];
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0;
    for (const auto& [begin, end] : ranges) {
      EXPECT_EQ(begin, at) << "tensor " << index;
      at = end;
    }
    EXPECT_EQ(at, LengthOf(header, index)) << "tensor " << index;
  }
  return bytes;
}

TEST(UploadSplitTest, OneWriterTakesEveryNonEmptyTensorWhole) {
  const v1::Manifest header = Header({3 * kChunk + 5, 0, 40}, {8});
  const auto split = SplitUpload(header, 1);
  ASSERT_EQ(split.size(), 1u);
  EXPECT_THAT(CheckSplit(header, split), ElementsAre(3 * kChunk + 53));
  EXPECT_EQ(split[0].size(), 3u);  // the empty tensor needs no range.
}

TEST(UploadSplitTest, TwoWritersShareOneLargeTensorOnAChunkBoundary) {
  const v1::Manifest header = Header({10 * kChunk + 100});
  const auto split = SplitUpload(header, 2);
  const std::vector<int64_t> bytes = CheckSplit(header, split);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes[0], 5 * kChunk);
  EXPECT_EQ(bytes[1], 5 * kChunk + 100);
}

// A checkpoint shaped like a model's: large weights, many small tensors, optimizer state twice the
// weights. Each of 2, 3 and 8 writers gets its share within about a chunk.
TEST(UploadSplitTest, ManyTensorsAreBalancedWithinAChunk) {
  std::vector<int64_t> model, state;
  for (int i = 0; i < 24; ++i) model.push_back(i % 3 == 0 ? 9 * kChunk + 4096 : 12 * 1024);
  for (int64_t length : model) {
    state.push_back(8);
    state.push_back(length);
    state.push_back(length);
  }
  const v1::Manifest header = Header(model, state);
  for (int writers : {2, 3, 8}) {
    const std::vector<int64_t> bytes = CheckSplit(header, SplitUpload(header, writers));
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    // Each writer's two ends are within half a chunk of their marks, or past one by a small
    // tensor, which is never cut.
    for (int64_t b : bytes) {
      EXPECT_LE(std::abs(b - total / writers), kChunk + 12 * 1024) << writers << " writers";
    }
  }
}

TEST(UploadSplitTest, TensorsOnlyTheFirstWriterHasGoWholeToIt) {
  const v1::Manifest header = Header({8 * kChunk}, {5000, 8});
  const auto split = SplitUpload(header, 2, /*first_writer_only=*/{1, 2});
  const std::vector<int64_t> bytes = CheckSplit(header, split);
  EXPECT_EQ(bytes[0] + bytes[1], 8 * kChunk + 5008);
  for (const UploadRange& range : split[1]) EXPECT_EQ(range.tensor_index, 0);
  // Writer 0 took the pinned bytes, so it takes correspondingly less of the shared tensor.
  EXPECT_LE(std::abs(bytes[0] - bytes[1]), kChunk);
}

// What a ZeRO-1 save leaves to the split: the tensors the writers supply by their own ranges get
// no range and do not weigh on the balance of the rest.
TEST(UploadSplitTest, TensorsTheWritersSupplyAreLeftOut) {
  const v1::Manifest header = Header({8 * kChunk, 20 * kChunk}, {20 * kChunk, 600});
  const auto split =
      SplitUpload(header, 2, /*first_writer_only=*/{3}, /*supplied_by_writers=*/{1, 2});
  int64_t total = 0;
  for (const std::vector<UploadRange>& part : split) {
    if (!part.empty()) EXPECT_OK(CheckUploadRanges(header, part));
    for (const UploadRange& range : part) {
      EXPECT_NE(range.tensor_index, 1);
      EXPECT_NE(range.tensor_index, 2);
      total += range.end - range.begin;
    }
  }
  EXPECT_EQ(total, 8 * kChunk + 600);
  // Writer 0 takes the pinned 600 bytes and about half of tensor 0; writer 1 the rest of it.
  ASSERT_FALSE(split[1].empty());
  EXPECT_EQ(split[1].front().tensor_index, 0);
  EXPECT_EQ(split[1].front().end, 8 * kChunk);
  EXPECT_EQ(split[1].front().begin, 4 * kChunk);
}

TEST(UploadSplitTest, MoreWritersThanChunksLeavesSomeWithNothing) {
  const v1::Manifest header = Header({100, 200});
  const auto split = SplitUpload(header, 4);
  const std::vector<int64_t> bytes = CheckSplit(header, split);
  EXPECT_EQ(bytes[0] + bytes[1] + bytes[2] + bytes[3], 300);
}

}  // namespace
}  // namespace ckpt
