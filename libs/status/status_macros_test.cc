#include "libs/status/status_macros.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

absl::Status FailIf(bool fail) {
  return fail ? absl::InvalidArgumentError("asked to fail") : absl::OkStatus();
}

absl::StatusOr<int> ParsePositive(int value) {
  if (value <= 0) return absl::OutOfRangeError("not positive");
  return value;
}

absl::Status RunsBothChecks(bool first_fails, int* steps) {
  RETURN_IF_ERROR(FailIf(first_fails));
  ++*steps;
  RETURN_IF_ERROR(ParsePositive(-1));
  ++*steps;
  return absl::OkStatus();
}

TEST(ReturnIfErrorTest, ReturnsTheFirstErrorAndStopsThere) {
  int steps = 0;
  EXPECT_THAT(RunsBothChecks(true, &steps), StatusIs(absl::StatusCode::kInvalidArgument, "fail"));
  EXPECT_EQ(steps, 0);
  EXPECT_THAT(RunsBothChecks(false, &steps), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(steps, 1);
}

TEST(ReturnIfErrorTest, EvaluatesItsExpressionOnce) {
  int calls = 0;
  auto counted = [&] {
    ++calls;
    return absl::OkStatus();
  };
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(counted());
    return absl::OkStatus();
  };
  EXPECT_OK(run());
  EXPECT_EQ(calls, 1);
}

absl::StatusOr<int> Doubled(int value) {
  ASSIGN_OR_RETURN(int parsed, ParsePositive(value));
  return parsed * 2;
}

TEST(AssignOrReturnTest, AssignsTheValueOrReturnsTheError) {
  EXPECT_EQ(Doubled(21).value(), 42);
  EXPECT_THAT(Doubled(0), StatusIs(absl::StatusCode::kOutOfRange, "not positive"));
}

absl::StatusOr<std::unique_ptr<std::string>> MakeName(bool fail) {
  if (fail) return absl::NotFoundError("no name");
  return std::make_unique<std::string>("resnet");
}

absl::StatusOr<std::string> UsesMoveOnlyValues(bool fail) {
  std::unique_ptr<std::string> name;
  ASSIGN_OR_RETURN(name, MakeName(fail));  // Assigns to an existing variable.
  ASSIGN_OR_RETURN(auto other, MakeName(false));
  ASSIGN_OR_RETURN(auto third, MakeName(false));  // Two on adjacent lines do not clash.
  return *name + *other + *third;
}

TEST(AssignOrReturnTest, WorksWithMoveOnlyTypesAndExistingVariables) {
  EXPECT_EQ(UsesMoveOnlyValues(false).value(), "resnetresnetresnet");
  EXPECT_THAT(UsesMoveOnlyValues(true), StatusIs(absl::StatusCode::kNotFound, "no name"));
}

}  // namespace
}  // namespace ckpt
