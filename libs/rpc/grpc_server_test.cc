#include "libs/rpc/grpc_server.h"

#include <memory>

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// A real service to register; its methods are never called here.
class IdleTrainerService final : public v1::Trainer::CallbackService {};

grpc::Status CheckHealth(const std::string& address, const std::string& service,
                         HealthCheckResponse* response) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckRequest request;
  request.set_service(service);
  return stub->Check(&context, request, response);
}

TEST(GrpcServerTest, ServesHealthOnAnEphemeralLoopbackPort) {
  IdleTrainerService trainer;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcServer> server,
                       GrpcServer::Start({}, {{&trainer, v1::Trainer::service_full_name()}}));
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));

  HealthCheckResponse response;
  ASSERT_TRUE(CheckHealth(server->address(), "", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  ASSERT_TRUE(CheckHealth(server->address(), "ckpt.v1.Trainer", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(server->address(), "ckpt.v1.NoSuchService", &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

std::vector<ServiceBinding> Trainer(IdleTrainerService* service) {
  return {{service, v1::Trainer::service_full_name()}};
}

TEST(GrpcServerTest, ShutdownStopsServing) {
  IdleTrainerService trainer;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcServer> server,
                       GrpcServer::Start({}, Trainer(&trainer)));
  const std::string address = server->address();
  server->Shutdown(absl::Seconds(1));
  server->Shutdown(absl::Seconds(1));  // Idempotent.
  server->Wait();
  HealthCheckResponse response;
  EXPECT_EQ(CheckHealth(address, "", &response).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(GrpcServerTest, TwoServersNeverShareAPort) {
  IdleTrainerService trainer, other_trainer;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcServer> first, GrpcServer::Start({}, Trainer(&trainer)));
  GrpcServerOptions options;
  options.listen_address = first->address();
  EXPECT_THAT(GrpcServer::Start(options, Trainer(&other_trainer)),
              StatusIs(absl::StatusCode::kUnavailable, first->address()));
}

TEST(GrpcServerTest, RejectsMalformedOptions) {
  IdleTrainerService trainer;
  EXPECT_THAT(GrpcServer::Start({}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "at least one service"));
  for (const char* address : {"localhost", ":50051", "127.0.0.1:http", "127.0.0.1:70000"}) {
    GrpcServerOptions options;
    options.listen_address = address;
    EXPECT_THAT(GrpcServer::Start(options, Trainer(&trainer)),
                StatusIs(absl::StatusCode::kInvalidArgument, "HOST:PORT"))
        << address;
  }
  GrpcServerOptions options;
  options.max_message_bytes = 0;
  EXPECT_THAT(GrpcServer::Start(options, Trainer(&trainer)),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_message_bytes"));
}

}  // namespace
}  // namespace ckpt
