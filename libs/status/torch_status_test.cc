#include "libs/status/torch_status.h"

#include <new>
#include <stdexcept>

#include "ATen/core/Tensor.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/zeros.h"
#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(CatchTorchErrorsTest, ReturnsTheValueWhenNothingThrows) {
  absl::StatusOr<at::Tensor> result = CatchTorchErrors([] { return at::ones({2, 3}); });
  ASSERT_OK(result);
  EXPECT_EQ(result->numel(), 6);
}

TEST(CatchTorchErrorsTest, TranslatesARealLibTorchFailure) {
  absl::StatusOr<at::Tensor> result =
      CatchTorchErrors([] { return at::zeros({2}).view({3}); }, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument, "shape '[3]' is invalid"));
  // The C++ backtrace LibTorch appends stays out of the message.
  EXPECT_THAT(result.status().message(), ::testing::Not(::testing::HasSubstr("frame #")));
}

TEST(CatchTorchErrorsTest, VoidFunctionsGiveAStatus) {
  EXPECT_OK(CatchTorchErrors([] {}));
  EXPECT_THAT(CatchTorchErrors([] { TORCH_CHECK(false, "checked ", 42); }),
              StatusIs(absl::StatusCode::kInternal, "checked 42"));
}

TEST(CatchTorchErrorsTest, MapsTheC10ErrorSubclasses) {
  EXPECT_THAT(CatchTorchErrors([] { TORCH_CHECK_INDEX(false, "index 9 of 3"); }),
              StatusIs(absl::StatusCode::kOutOfRange, "index 9 of 3"));
  EXPECT_THAT(CatchTorchErrors([] { TORCH_CHECK_VALUE(false, "bad value"); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad value"));
  EXPECT_THAT(CatchTorchErrors([] { TORCH_CHECK_TYPE(false, "bad type"); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad type"));
  EXPECT_THAT(CatchTorchErrors([] { TORCH_CHECK_NOT_IMPLEMENTED(false, "no kernel"); }),
              StatusIs(absl::StatusCode::kUnimplemented, "no kernel"));
}

TEST(CatchTorchErrorsTest, MapsStandardExceptions) {
  EXPECT_THAT(CatchTorchErrors([] { throw std::bad_alloc(); }),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(CatchTorchErrors([] { throw std::runtime_error("boom"); }),
              StatusIs(absl::StatusCode::kInternal, "boom"));
}

TEST(ThrowAsC10ErrorTest, RoundTripsThroughCatchTorchErrors) {
  for (const absl::Status& status :
       {absl::InvalidArgumentError("x"), absl::OutOfRangeError("y"), absl::InternalError("z")}) {
    absl::Status back = CatchTorchErrors([&] { ThrowAsC10Error(status); });
    EXPECT_EQ(back.code(), status.code());
    EXPECT_THAT(std::string(back.message()), ::testing::HasSubstr(std::string(status.message())));
  }
}

}  // namespace
}  // namespace ckpt
