#include "libs/format/crc32.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Bit-at-a-time CRC-32, the definition the table-driven version must match.
uint32_t ReferenceCrc32(absl::string_view data) {
  uint32_t crc = ~0u;
  for (unsigned char c : data) {
    crc ^= c;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(Crc32Test, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32(0, "123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(0, ""), 0u);
}

TEST(Crc32Test, MatchesTheBitwiseDefinitionAtEveryLengthAndAlignment) {
  std::mt19937 random(3);
  std::string data(300, '\0');
  for (char& c : data) c = static_cast<char>(random());
  for (size_t start = 0; start < 8; ++start) {
    for (size_t length = 0; start + length <= data.size(); length += 7) {
      const absl::string_view piece = absl::string_view(data).substr(start, length);
      ASSERT_EQ(Crc32(0, piece), ReferenceCrc32(piece)) << start << "+" << length;
    }
  }
}

TEST(Crc32Test, ExtendsIncrementally) {
  const std::string text(1000, 'x');
  EXPECT_EQ(Crc32(Crc32(0, text.substr(0, 333)), text.substr(333)), Crc32(0, text));
}

}  // namespace
}  // namespace ckpt
