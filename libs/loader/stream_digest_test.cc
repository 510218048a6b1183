#include "libs/loader/stream_digest.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/io/xxh3.h"
#include "libs/status/status_matchers.h"
#include "xxhash.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

std::string Bytes(size_t n) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 251);
  return bytes;
}

// `bytes` as a tensor cut into chunks of `chunk` bytes (none when chunk is 0).
v1::TensorMeta MetaOf(const std::string& bytes, size_t chunk) {
  v1::TensorMeta meta;
  meta.set_key("enc.weight");
  meta.set_byte_length(static_cast<int64_t>(bytes.size()));
  for (size_t at = 0; chunk > 0 && at < bytes.size(); at += chunk) {
    v1::ChunkRef& ref = *meta.add_chunks();
    const std::string piece = bytes.substr(at, chunk);
    ref.set_length(static_cast<int64_t>(piece.size()));
    ref.set_xxh3_64(XXH3_64bits(piece.data(), piece.size()));
  }
  return meta;
}

// Feeds `bytes` in pieces of `piece` bytes; the first error.
absl::Status Feed(ReceivedTensorCheck& check, const std::string& bytes, size_t piece) {
  for (size_t at = 0; at < bytes.size(); at += piece) {
    absl::Status status = check.Add(absl::string_view(bytes).substr(at, piece));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

TEST(ReceivedTensorCheckTest, ChunksVerifyInAnyPieceSize) {
  const std::string bytes = Bytes(10000);
  const v1::TensorMeta meta = MetaOf(bytes, 3000);
  for (size_t piece : {1, 999, 3000, 4096, 10000}) {
    ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck check, ReceivedTensorCheck::Create(meta, "m@1"));
    ASSERT_OK(Feed(check, bytes, piece));
    ASSERT_OK_AND_ASSIGN(const bool verified, check.Complete());
    EXPECT_TRUE(verified);
  }
}

TEST(ReceivedTensorCheckTest, EveryFlippedByteIsNamedByItsChunk) {
  const std::string bytes = Bytes(1000);
  const v1::TensorMeta meta = MetaOf(bytes, 300);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] ^= 0x10;
    ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck check, ReceivedTensorCheck::Create(meta, "m@1"));
    absl::Status status = Feed(check, damaged, 128);
    if (status.ok()) status = check.Complete().status();
    const size_t chunk = i / 300;
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss,
                                 HasSubstr(absl::StrCat("tensor 'enc.weight' of m@1: chunk ", chunk,
                                                        " of 4 "
                                                        "(bytes ",
                                                        chunk * 300, ".."))))
        << "byte " << i;
  }
}

TEST(ReceivedTensorCheckTest, DigestWithoutChunkRefs) {
  const std::string bytes = Bytes(5000);
  const v1::TensorMeta meta = MetaOf(bytes, 0);
  v1::TensorDigest digest;
  digest.set_byte_length(5000);
  digest.set_xxh3_64(Xxh3(bytes));

  ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck check, ReceivedTensorCheck::Create(meta, "m@1"));
  EXPECT_THAT(check.CheckDigest(digest), StatusIs(absl::StatusCode::kDataLoss));  // too early
  ASSERT_OK(Feed(check, bytes, 700));
  ASSERT_OK_AND_ASSIGN(const bool verified, check.Complete());
  EXPECT_FALSE(verified);
  EXPECT_OK(check.CheckDigest(digest));

  std::string damaged = bytes;
  damaged[4321] ^= 1;
  ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck bad, ReceivedTensorCheck::Create(meta, "m@1"));
  ASSERT_OK(Feed(bad, damaged, 700));
  ASSERT_OK(bad.Complete().status());
  EXPECT_THAT(bad.CheckDigest(digest),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'enc.weight' of m@1: its 5000 bytes arrived with")));
}

TEST(ReceivedTensorCheckTest, EmptyChunkAndBadRefs) {
  v1::TensorMeta empty;
  empty.set_key("e");
  empty.add_chunks()->set_xxh3_64(Xxh3(""));
  ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck check, ReceivedTensorCheck::Create(empty, "m@1"));
  ASSERT_OK_AND_ASSIGN(const bool verified, check.Complete());
  EXPECT_TRUE(verified);

  empty.mutable_chunks(0)->set_xxh3_64(1);
  ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck wrong, ReceivedTensorCheck::Create(empty, "m@1"));
  EXPECT_THAT(wrong.Complete(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("chunk 0 of 1")));

  v1::TensorMeta meta = MetaOf(Bytes(100), 30);
  meta.set_byte_length(99);
  EXPECT_THAT(ReceivedTensorCheck::Create(meta, "m@1"), StatusIs(absl::StatusCode::kDataLoss));
  meta.set_byte_length(101);
  EXPECT_THAT(ReceivedTensorCheck::Create(meta, "m@1"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("hold 100 bytes")));

  meta.set_byte_length(100);
  ASSERT_OK_AND_ASSIGN(ReceivedTensorCheck short_check, ReceivedTensorCheck::Create(meta, "m@1"));
  ASSERT_OK(short_check.Add(Bytes(100).substr(0, 50)));
  EXPECT_THAT(short_check.Complete(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("50 of")));
  EXPECT_THAT(short_check.Add(std::string(51, 'x')), StatusIs(absl::StatusCode::kDataLoss));
}

}  // namespace
}  // namespace ckpt
