#include "libs/io/xxh3.h"

#include <string>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

std::string Bytes(size_t size) {
  std::string bytes(size, '\0');
  uint64_t state = 12345;
  for (char& byte : bytes) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    byte = static_cast<char>(state >> 56);
  }
  return bytes;
}

// The dispatched entry points must give the digests every stored chunk already carries: the
// plain XXH3_64bits of the same bytes, for sizes on each of XXH3's code paths (0-16, 17-128,
// 129-240 bytes, and long inputs with and without a partial stripe or block).
TEST(Xxh3Test, SameDigestAsThePlainEntryPoint) {
  for (size_t size :
       {0, 1, 3, 16, 17, 100, 128, 129, 240, 241, 1000, 1024, 4096, 65536, 100003, (4 << 20) + 7}) {
    const std::string bytes = Bytes(size);
    EXPECT_EQ(Xxh3(bytes), XXH3_64bits(bytes.data(), bytes.size())) << size << " bytes";
  }
}

TEST(Xxh3Test, StreamingInPiecesGivesTheWholeDigest) {
  const std::string bytes = Bytes((1 << 20) + 12345);
  for (size_t piece : {1, 63, 64, 4096, 65536, 300000}) {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (size_t at = 0; at < bytes.size(); at += piece) {
      Xxh3Update(state, absl::string_view(bytes).substr(at, piece));
    }
    EXPECT_EQ(XXH3_64bits_digest(state), XXH3_64bits(bytes.data(), bytes.size())) << piece;
    XXH3_freeState(state);
  }
}

TEST(Xxh3Test, DifferentBytesDifferentDigest) {
  std::string bytes = Bytes(4096);
  const uint64_t before = Xxh3(bytes);
  bytes[2048] ^= 1;
  EXPECT_NE(Xxh3(bytes), before);
}

TEST(Xxh3StreamTest, IncrementalEqualsOneShot) {
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  Xxh3Stream stream;
  EXPECT_EQ(stream.Digest(), Xxh3(""));
  stream.Update(absl::string_view(bytes).substr(0, 777));
  stream.Update(absl::string_view(bytes).substr(777));
  EXPECT_EQ(stream.Digest(), Xxh3(bytes));
  stream.Reset();
  stream.Update("abc");
  EXPECT_EQ(stream.Digest(), Xxh3("abc"));
}

}  // namespace
}  // namespace ckpt
