#include "libs/status/status_matchers.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(StatusIsTest, MatchesCodeAndMessageOfStatus) {
  const absl::Status status = absl::NotFoundError("model resnet@9 not found");
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound, "resnet@9"));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound, StartsWith("model")));
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kInternal)));
  EXPECT_THAT(status, Not(StatusIs(absl::StatusCode::kNotFound, "resnet@8")));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound, std::string("resnet@9")));
}

TEST(StatusIsTest, MatchesStatusOr) {
  absl::StatusOr<int> error = absl::DataLossError("chunk ab12 checksum mismatch");
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ab12")));
  absl::StatusOr<int> value = 3;
  EXPECT_THAT(value, IsOk());
  EXPECT_THAT(error, Not(IsOk()));
}

TEST(StatusIsTest, DescribesWhatItExpected) {
  ::testing::Matcher<const absl::Status&> matcher =
      StatusIs(absl::StatusCode::kAborted, "conflict");
  std::stringstream description;
  matcher.DescribeTo(&description);
  EXPECT_THAT(description.str(), HasSubstr("ABORTED"));
  EXPECT_THAT(description.str(), HasSubstr("conflict"));
}

TEST(AssertOkAndAssignTest, AssignsTheValue) {
  ASSERT_OK_AND_ASSIGN(std::string name, absl::StatusOr<std::string>("bert"));
  EXPECT_EQ(name, "bert");
  ASSERT_OK(absl::OkStatus());
  EXPECT_OK(absl::StatusOr<int>(1));
}

}  // namespace
}  // namespace ckpt::testing
