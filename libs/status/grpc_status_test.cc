#include "libs/status/grpc_status.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTripsWithItsMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "what went wrong");
    const grpc::Status wire = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), "what went wrong");
    EXPECT_EQ(FromGrpcStatus(wire), status);
  }
}

TEST(GrpcStatusTest, OkStaysOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_OK(FromGrpcStatus(grpc::Status::OK));
}

TEST(GrpcStatusTest, NamedGrpcCodesMapToTheirAbslTwins) {
  EXPECT_THAT(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no token")),
              StatusIs(absl::StatusCode::kUnauthenticated, "no token"));
  EXPECT_THAT(FromGrpcStatus(grpc::Status(grpc::StatusCode::DATA_LOSS, "checksum")),
              StatusIs(absl::StatusCode::kDataLoss, "checksum"));
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace ckpt
