// WhoAmI against a real gRPC server serving ckpt.v1.Identity over a shared-token policy.

#include "libs/client/who_am_i.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/grpc_server.h"
#include "libs/rpc/identity_service.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

TEST(WhoAmITest, AsksTheServerWhoTheCallerIsAndWhatItMayCall) {
  IdentityService service(AccessPolicy::SharedToken("s3cret"), "checkpoint store");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcServer> server,
                       GrpcServer::Start({}, {{&service, "ckpt.v1.Identity"}}));
  ClientOptions options;
  options.address = server->address();
  options.auth_token = "s3cret";
  v1::WhoAmIRequest request;
  request.add_methods("DeleteVersion");
  ASSERT_OK_AND_ASSIGN(v1::WhoAmIResponse who, WhoAmI(options, request, "checkpoint store"));
  EXPECT_EQ(who.identity(), "token");
  EXPECT_EQ(who.role(), "admin");
  EXPECT_THAT(who.allowed_methods(), ::testing::ElementsAre("DeleteVersion"));
  options.auth_token = "wrong";
  EXPECT_THAT(WhoAmI(options, request, "checkpoint store"),
              StatusIs(absl::StatusCode::kUnauthenticated, "token"));
}

}  // namespace
}  // namespace ckpt
