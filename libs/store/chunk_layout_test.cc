#include "libs/store/chunk_layout.h"

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

}  // namespace
}  // namespace ckpt
