// ckpt.v1.Identity over a real gRPC server and an identities file: who the caller is, and which
// of the methods it asks about it may call on a model, as AccessPolicy::Check would answer them.

#include "libs/rpc/identity_service.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class IdentityServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(::testing::TempDir()) + "/identities.json";
    // sha256 of "reader-token" and "team-a-token".
    ckpt::testing::WriteTextFile(path, R"({"identities": [
        {"name": "viewer", "role": "reader", "token_sha256":
         "ba5005a40cf5212e4ac0190104cc127edab013294bb71279a975b27a80982d45"},
        {"name": "team-a", "role": "writer", "models": ["team-a-*"], "token_sha256":
         "06949cc40dd20849eda85dc8ba584ea93f025f083f115c82ab182512e0f64e39"}]})");
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy,
                         AccessPolicy::FromIdentitiesFile(path));
    service_ = std::make_unique<IdentityService>(std::move(policy), "checkpoint store");
    ASSERT_OK_AND_ASSIGN(server_, GrpcServer::Start({}, {{service_.get(), "ckpt.v1.Identity"}}));
  }

  absl::StatusOr<v1::WhoAmIResponse> WhoAmI(const std::string& token, const std::string& model) {
    ClientOptions options;
    options.address = server_->address();
    options.auth_token = token;
    ASSIGN_OR_RETURN(std::shared_ptr<ClientChannel> channel,
                     ClientChannel::Open(options, {"ckpt.v1.Identity", "checkpoint store", {}}));
    auto stub = v1::Identity::NewStub(channel->channel());
    v1::WhoAmIRequest request;
    request.add_methods("SetAlias");
    request.add_methods("GetManifest");
    request.add_methods("DeleteVersion");
    request.set_model(model);
    v1::WhoAmIResponse response;
    auto context = channel->NewContext(absl::Now() + absl::Seconds(10));
    RETURN_IF_ERROR(channel->FromCall(stub->WhoAmI(context.get(), request, &response)));
    return response;
  }

  std::unique_ptr<IdentityService> service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(IdentityServiceTest, AReaderMayReadButNotMoveAnAlias) {
  ASSERT_OK_AND_ASSIGN(v1::WhoAmIResponse who, WhoAmI("reader-token", "team-a-mnist"));
  EXPECT_EQ(who.identity(), "viewer");
  EXPECT_EQ(who.role(), "reader");
  EXPECT_THAT(who.models(), IsEmpty());
  EXPECT_THAT(who.peer(), HasSubstr("127.0.0.1"));
  EXPECT_THAT(who.allowed_methods(), ElementsAre("GetManifest"));
  EXPECT_THAT(who.refused_methods().at("SetAlias"), HasSubstr("needs the writer role"));
  EXPECT_THAT(who.refused_methods().at("DeleteVersion"), HasSubstr("needs the admin role"));
}

TEST_F(IdentityServiceTest, AScopedWriterMayChangeItsOwnModelsOnly) {
  ASSERT_OK_AND_ASSIGN(v1::WhoAmIResponse own, WhoAmI("team-a-token", "team-a-mnist"));
  EXPECT_EQ(own.identity(), "team-a");
  EXPECT_EQ(own.role(), "writer");
  EXPECT_THAT(own.models(), ElementsAre("team-a-*"));
  EXPECT_THAT(own.allowed_methods(), ElementsAre("SetAlias", "GetManifest"));
  ASSERT_OK_AND_ASSIGN(v1::WhoAmIResponse other, WhoAmI("team-a-token", "team-b-mnist"));
  EXPECT_THAT(other.allowed_methods(), IsEmpty());
  EXPECT_THAT(other.refused_methods().at("SetAlias"), HasSubstr("covers only"));
  // Without a model, only the role counts.
  ASSERT_OK_AND_ASSIGN(v1::WhoAmIResponse any, WhoAmI("team-a-token", ""));
  EXPECT_THAT(any.allowed_methods(), ElementsAre("SetAlias", "GetManifest"));
}

TEST_F(IdentityServiceTest, AnUnknownOrMissingTokenIsUnauthenticated) {
  EXPECT_THAT(WhoAmI("", "m"), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(WhoAmI("nobody", "m"),
              StatusIs(absl::StatusCode::kUnauthenticated, "not that of any identity"));
}

}  // namespace
}  // namespace ckpt
