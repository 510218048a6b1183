#include "libs/store/change_log.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(ChangeFrameTest, RoundTripsAnyPayload) {
  for (const std::string& payload : {std::string(), std::string("x"), std::string(5000, '\0')}) {
    const std::string frame = EncodeChangeFrame(payload);
    ASSERT_OK_AND_ASSIGN(absl::string_view decoded, DecodeChangeFrame(frame, "change 1"));
    EXPECT_EQ(decoded, payload);
  }
}

TEST(ChangeFrameTest, EveryFlippedByteIsDataLossNamingTheRecord) {
  const std::string frame = EncodeChangeFrame("a change of the registry");
  for (size_t i = 0; i < frame.size(); ++i) {
    std::string damaged = frame;
    damaged[i] ^= 0x20;
    EXPECT_THAT(DecodeChangeFrame(damaged, "change 7 in the log"),
                StatusIs(absl::StatusCode::kDataLoss, "change 7 in the log"))
        << "byte " << i;
  }
  EXPECT_THAT(DecodeChangeFrame(frame.substr(0, 6), "change 7"),
              StatusIs(absl::StatusCode::kDataLoss, "CKCL"));
}

TEST(ChangeNameTest, SortsInNumberOrderAndParsesBack) {
  EXPECT_EQ(ChangeName(42), "00000000000000000042");
  EXPECT_LT(ChangeName(9), ChangeName(10));
  EXPECT_EQ(ChangeNumberFromName(ChangeName(123456789)), 123456789);
  EXPECT_EQ(ChangeNumberFromName("42"), -1);
  EXPECT_EQ(ChangeNumberFromName("0000000000000000004x"), -1);
  EXPECT_EQ(ChangeNumberFromName(ChangeName(0)), -1);
}

}  // namespace
}  // namespace ckpt
