// The conformance suite's ranged reads (see store_conformance.h): VersionReader::ReadTensorRange,
// which a rank of a resharded resume uses to read only its slices, gives the same bytes as the
// whole tensor on every backend, across chunk boundaries, for state tensors too, and refuses a
// range outside its tensor.

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "gmock/gmock.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/testing/store_conformance.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

// The model tensor or, failing that, the state tensor stored under `key`.
const v1::TensorMeta* FindMeta(const v1::Manifest& manifest, const std::string& key) {
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    if (meta.key() == key) return &meta;
  }
  for (const v1::TensorMeta& meta : manifest.state_tensors()) {
    if (meta.key() == key) return &meta;
  }
  return nullptr;
}

}  // namespace

TEST_P(StoreConformanceTest, ByteRangesReadTheSameBytesAsTheWholeTensor) {
  // 2.5 chunks of float32, and an Adam state whose exp_avg has the same shape.
  const at::Tensor big = Seeded({kChunkBytes * 5 / 2 / 4}, 7);
  const at::Tensor small = Seeded({10}, 8);
  CheckpointContents contents = WeightsOnly({{"big", big}, {"small", small}});
  contents.optimizer = AdamState({big, small}, 3, 9);
  MustCommit("m", contents);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@1")));
  const v1::Manifest& manifest = reader->manifest();
  const int64_t c = kChunkBytes;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 0},
                                                           {0, 4},
                                                           {c - 4, c + 4},
                                                           {c, 2 * c},
                                                           {c / 2, 2 * c + c / 4},
                                                           {7, 5 * c / 2},
                                                           {5 * c / 2 - 1, 5 * c / 2},
                                                           {0, 5 * c / 2}};
  for (const std::string key : {"big", "optimizer/state/0/exp_avg"}) {
    const v1::TensorMeta* meta = FindMeta(manifest, key);
    ASSERT_NE(meta, nullptr) << key;
    ASSERT_EQ(meta->byte_length(), 5 * c / 2) << key;
    std::string whole(static_cast<size_t>(meta->byte_length()), '\0');
    ASSERT_OK(reader->ReadTensorInto(*meta, whole.data()));
    for (const auto& [begin, end] : ranges) {
      // Guard bytes on both sides catch a write outside the range.
      std::string buffer(static_cast<size_t>(end - begin) + 2, '\x5a');
      ASSERT_OK(reader->ReadTensorRange(*meta, begin, end, buffer.data() + 1))
          << key << " " << begin << ".." << end;
      EXPECT_EQ(buffer.front(), '\x5a');
      EXPECT_EQ(buffer.back(), '\x5a');
      EXPECT_EQ(buffer.substr(1, static_cast<size_t>(end - begin)),
                whole.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin)))
          << key << " " << begin << ".." << end;
    }
  }
  // A tensor of one short chunk, and the reads after the ranges still work in any order.
  const v1::TensorMeta* small_meta = FindMeta(manifest, "small");
  ASSERT_NE(small_meta, nullptr);
  float middle[3];
  ASSERT_OK(reader->ReadTensorRange(*small_meta, 12, 24, reinterpret_cast<char*>(middle)));
  EXPECT_EQ(std::memcmp(middle, small.data_ptr<float>() + 3, sizeof(middle)), 0);
  ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*reader, "big"));
  ExpectSameTensor(read, big, "big");
}

TEST_P(StoreConformanceTest, AByteRangeOutsideItsTensorIsOutOfRange) {
  MustCommit("m", WeightsOnly({{"w", Seeded({10}, 1)}}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@1")));
  const v1::TensorMeta& meta = reader->manifest().tensors(0);
  char buffer[64];
  EXPECT_THAT(reader->ReadTensorRange(meta, 0, 41, buffer),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("it holds 40 bytes")));
  EXPECT_THAT(reader->ReadTensorRange(meta, 8, 4, buffer),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("bytes 8..4 of tensor 'w'")));
  EXPECT_THAT(reader->ReadTensorRange(meta, -1, 4, buffer),
              StatusIs(absl::StatusCode::kOutOfRange));
}

}  // namespace ckpt::testing
