#include "libs/store/chunk_layout.h"

#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

v1::TensorMeta Tensor(int64_t byte_length, std::initializer_list<int64_t> chunk_lengths) {
  v1::TensorMeta meta;
  meta.set_key("fc.weight");
  meta.set_byte_length(byte_length);
  for (int64_t length : chunk_lengths) meta.add_chunks()->set_length(length);
  return meta;
}

TEST(ChunkLayoutTest, ChunksThatAddUpToTheTensorPass) {
  EXPECT_OK(CheckChunkLayout(Tensor(0, {})));
  EXPECT_OK(CheckChunkLayout(Tensor(kChunkBytes + 5, {kChunkBytes, 5}), "mlp@3"));
}

TEST(ChunkLayoutTest, AChunkLongerThanTheStoreWritesIsRefusedBeforeAnythingIsSizedByIt) {
  EXPECT_THAT(CheckChunkLayout(Tensor(kChunkBytes + 1, {kChunkBytes + 1}), "mlp@3"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'fc.weight' of mlp@3 names a chunk of 4194305 bytes")));
  EXPECT_THAT(CheckChunkLayout(Tensor(0, {-1})),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor 'fc.weight' names a chunk")));
}

TEST(ChunkLayoutTest, ChunksThatDoNotAddUpAreDataLoss) {
  EXPECT_THAT(CheckChunkLayout(Tensor(10, {4}), "mlp@3"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("its chunks hold 4 bytes, its byte_length is 10")));
}

// A range is served in whole chunks, each checkable on its own: the span starts at the chunk
// holding `begin` and ends with the one holding byte end - 1.
TEST(ChunkLayoutTest, ChunksCoveringARangeAreTheWholeChunksHoldingIt) {
  const int64_t c = kChunkBytes;
  const v1::TensorMeta meta = Tensor(3 * c + 10, {c, c, c, 10});
  auto span = [&](int64_t begin, int64_t end) {
    absl::StatusOr<ChunkSpan> covering = ChunksCovering(meta, begin, end);
    EXPECT_OK(covering.status());
    return covering.ok() ? std::vector<int64_t>{covering->first_chunk, covering->end_chunk,
                                                covering->first_offset, covering->end_offset}
                         : std::vector<int64_t>{};
  };
  EXPECT_EQ(span(0, 3 * c + 10), (std::vector<int64_t>{0, 4, 0, 3 * c + 10}));  // all of it
  EXPECT_EQ(span(0, 1), (std::vector<int64_t>{0, 1, 0, c}));
  EXPECT_EQ(span(c - 1, c + 1), (std::vector<int64_t>{0, 2, 0, 2 * c}));  // across a boundary
  EXPECT_EQ(span(c, 2 * c), (std::vector<int64_t>{1, 2, c, 2 * c}));      // exactly one chunk
  EXPECT_EQ(span(2 * c + 5, 3 * c + 3), (std::vector<int64_t>{2, 4, 2 * c, 3 * c + 10}));
  EXPECT_EQ(span(3 * c + 9, 3 * c + 10), (std::vector<int64_t>{3, 4, 3 * c, 3 * c + 10}));
  // Empty: no chunk, wherever it is.
  EXPECT_EQ(span(c + 7, c + 7), (std::vector<int64_t>{0, 0, c + 7, c + 7}));
  EXPECT_EQ(span(3 * c + 10, 3 * c + 10), (std::vector<int64_t>{0, 0, 3 * c + 10, 3 * c + 10}));
}

TEST(ChunkLayoutTest, ARangeOutsideTheTensorIsOutOfRange) {
  const v1::TensorMeta meta = Tensor(10, {10});
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{-1, 3}, {4, 3}, {0, 11}}) {
    EXPECT_THAT(ChunksCovering(meta, begin, end, "mlp@3"),
                StatusIs(absl::StatusCode::kOutOfRange,
                         HasSubstr("of tensor 'fc.weight' of mlp@3: it holds 10 bytes")));
  }
}

}  // namespace
}  // namespace ckpt
