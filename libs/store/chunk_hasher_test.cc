#include "libs/store/chunk_hasher.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(ChunkHasherTest, Sha256MatchesKnownVectors) {
  EXPECT_EQ(HexEncode(Sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexEncode(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ChunkHasherTest, Xxh3MatchesReferenceForEmptyInput) {
  EXPECT_EQ(Xxh3(""), 0x2D06800538D394C2ull);
  EXPECT_NE(Xxh3("a"), Xxh3("b"));
}

TEST(ChunkHasherTest, HashChunkFillsAllFields) {
  const std::string bytes(1000, 'x');
  const ChunkDigest digest = HashChunk(bytes);
  EXPECT_EQ(digest.sha256, Sha256(bytes));
  EXPECT_EQ(digest.sha256.size(), kSha256Bytes);
  EXPECT_EQ(digest.xxh3_64, Xxh3(bytes));
  EXPECT_EQ(digest.length, 1000);
}

TEST(ChunkHasherTest, IncrementalSha256EqualsOneShotAndResetsAfterFinish) {
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes.push_back(static_cast<char>(i * 31));
  Sha256Hasher hasher;
  hasher.Update(absl::string_view(bytes).substr(0, 12345));
  hasher.Update("");
  hasher.Update(absl::string_view(bytes).substr(12345));
  EXPECT_EQ(hasher.Finish(), Sha256(bytes));
  hasher.Update("abc");
  EXPECT_EQ(hasher.Finish(), Sha256("abc"));

  Sha256Hasher moved = std::move(hasher);
  moved.Update("abc");
  EXPECT_EQ(moved.Finish(), Sha256("abc"));
}

TEST(ChunkHasherTest, ContentHashCoversEveryChunkAndItsLength) {
  const std::string bytes(kChunkBytes + 10, 'x');
  ContentHasher expected;
  expected.AddChunk(HashChunk(absl::string_view(bytes).substr(0, kChunkBytes)));
  expected.AddChunk(HashChunk(absl::string_view(bytes).substr(kChunkBytes)));
  const std::string hash = ContentHashOfBytes(bytes);
  EXPECT_EQ(hash, expected.Finish());
  EXPECT_EQ(hash.size(), kSha256Bytes);
  EXPECT_NE(hash, ContentHashOfBytes(bytes.substr(1)));
  std::string flipped = bytes;
  flipped[kChunkBytes + 3] = 'y';
  EXPECT_NE(hash, ContentHashOfBytes(flipped));
  EXPECT_EQ(ContentHashOfBytes(""), Sha256(""));
}

TEST(ChunkHasherTest, HexRoundTripsAndRejectsBadInput) {
  const std::string bytes("\x00\x01\xab\xff", 4);
  EXPECT_EQ(HexEncode(bytes), "0001abff");
  ASSERT_OK_AND_ASSIGN(std::string decoded, HexDecode("0001ABff"));
  EXPECT_EQ(decoded, bytes);
  EXPECT_THAT(HexDecode("abc"), StatusIs(absl::StatusCode::kInvalidArgument, "odd length"));
  EXPECT_THAT(HexDecode("zz"), StatusIs(absl::StatusCode::kInvalidArgument, "not a hex digit"));
  EXPECT_EQ(ShortHex(Sha256("abc")), "ba7816bf8f01");
}

TEST(ChunkHasherTest, ChunkSizeIsFourMebibytes) { EXPECT_EQ(kChunkBytes, 4 * 1024 * 1024); }

}  // namespace
}  // namespace ckpt
