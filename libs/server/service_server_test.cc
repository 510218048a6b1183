// ServiceServer over a real gRPC server: the service it is given and ckpt.v1.Identity are both
// served, and Identity answers by the access policy it was given, naming the server.

#include "libs/server/service_server.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "proto/ckpt/v1/identity.grpc.pb.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

// A real service to serve; its methods are never called here.
class IdleTrainerService final : public v1::Trainer::CallbackService {};

HealthCheckResponse::ServingStatus HealthOf(const std::string& address,
                                            const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  return status.ok() ? response.status() : HealthCheckResponse::UNKNOWN;
}

grpc::Status WhoAmI(const std::string& address, const std::string& token,
                    v1::WhoAmIResponse* response) {
  auto stub = v1::Identity::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::WhoAmIRequest request;
  request.add_methods("GetStatus");
  return stub->WhoAmI(&context, request, response);
}

TEST(ServiceServerTest, ServesTheServiceAndIdentityByTheSamePolicy) {
  IdleTrainerService trainer;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ServiceServer> serving,
      ServiceServer::Start({}, &trainer, v1::Trainer::service_full_name(),
                           AccessPolicy::SharedToken("run-token"), "test trainer"));
  const std::string address = serving->server().address();
  EXPECT_EQ(HealthOf(address, "ckpt.v1.Trainer"), HealthCheckResponse::SERVING);
  EXPECT_EQ(HealthOf(address, "ckpt.v1.Identity"), HealthCheckResponse::SERVING);

  v1::WhoAmIResponse who;
  const grpc::Status refused = WhoAmI(address, "", &who);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(refused.error_message(), HasSubstr("test trainer"));
  const grpc::Status admitted = WhoAmI(address, "run-token", &who);
  ASSERT_TRUE(admitted.ok()) << admitted.error_message();
  EXPECT_THAT(who.allowed_methods(), ::testing::ElementsAre("GetStatus"));
}

TEST(ServiceServerTest, WithoutAPolicyEveryCallerIsAdmitted) {
  IdleTrainerService trainer;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServiceServer> serving,
                       ServiceServer::Start({}, &trainer, v1::Trainer::service_full_name(),
                                            nullptr, "test trainer"));
  v1::WhoAmIResponse who;
  const grpc::Status admitted = WhoAmI(serving->server().address(), "", &who);
  ASSERT_TRUE(admitted.ok()) << admitted.error_message();
  EXPECT_THAT(who.allowed_methods(), ::testing::ElementsAre("GetStatus"));
}

TEST(ServiceServerTest, AnAddressInUseIsUnavailable) {
  IdleTrainerService trainer;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServiceServer> first,
                       ServiceServer::Start({}, &trainer, v1::Trainer::service_full_name(),
                                            nullptr, "test trainer"));
  GrpcServerOptions same_port;
  same_port.listen_address = first->server().address();
  IdleTrainerService second_trainer;
  EXPECT_THAT(ServiceServer::Start(same_port, &second_trainer, v1::Trainer::service_full_name(),
                                   nullptr, "test trainer")
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable, first->server().address()));
}

}  // namespace
}  // namespace ckpt
