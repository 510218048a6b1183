#include "libs/rpc/reflection_v1_service.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"

namespace ckpt {
namespace {

namespace reflection = ::grpc::reflection::v1;
using ::testing::ElementsAre;
using ::testing::IsSupersetOf;
using ::testing::UnorderedElementsAre;

class IdleTrainerService final : public v1::Trainer::CallbackService {};

// A client that knows nothing but the v1 reflection protocol, as grpcurl is: one stream, one
// response per request.
class ReflectionV1Test : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(server_,
                         GrpcServer::Start({}, {{&trainer_, v1::Trainer::service_full_name()}}));
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = reflection::ServerReflection::NewStub(channel_);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    stream_ = stub_->ServerReflectionInfo(&context_);
  }

  void TearDown() override {
    stream_->WritesDone();
    EXPECT_TRUE(stream_->Finish().ok());
  }

  reflection::ServerReflectionResponse Ask(const reflection::ServerReflectionRequest& request) {
    EXPECT_TRUE(stream_->Write(request));
    reflection::ServerReflectionResponse response;
    EXPECT_TRUE(stream_->Read(&response));
    return response;
  }

  // The names of the files a response carries, in order.
  static std::vector<std::string> FileNames(const reflection::ServerReflectionResponse& response) {
    std::vector<std::string> names;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      EXPECT_TRUE(file.ParseFromString(bytes));
      names.push_back(file.name());
    }
    return names;
  }

  IdleTrainerService trainer_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<reflection::ServerReflection::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<reflection::ServerReflectionRequest,
                                           reflection::ServerReflectionResponse>>
      stream_;
};

TEST_F(ReflectionV1Test, ListsTheServicesAndResolvesAServiceIntoADescriptorPool) {
  reflection::ServerReflectionRequest request;
  request.set_list_services("");
  reflection::ServerReflectionResponse listed = Ask(request);
  std::vector<std::string> services;
  for (const auto& service : listed.list_services_response().service()) {
    services.push_back(service.name());
  }
  EXPECT_THAT(services, UnorderedElementsAre("ckpt.v1.Trainer", "grpc.health.v1.Health",
                                             "grpc.reflection.v1.ServerReflection",
                                             "grpc.reflection.v1alpha.ServerReflection"));

  // The service's file comes with every file it imports: a client builds the service's
  // descriptors from the answer alone and can then call it.
  request.set_file_containing_symbol("ckpt.v1.Trainer");
  reflection::ServerReflectionResponse files = Ask(request);
  EXPECT_EQ(files.original_request().file_containing_symbol(), "ckpt.v1.Trainer");
  const std::vector<std::string> names = FileNames(files);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "proto/ckpt/v1/trainer.proto");
  EXPECT_THAT(names, IsSupersetOf({"proto/ckpt/v1/types.proto"}));
  google::protobuf::DescriptorPool pool;
  // Dependencies first, as a pool needs them.
  for (auto it = files.file_descriptor_response().file_descriptor_proto().rbegin();
       it != files.file_descriptor_response().file_descriptor_proto().rend(); ++it) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(*it));
    ASSERT_NE(pool.BuildFile(file), nullptr) << file.name();
  }
  const google::protobuf::ServiceDescriptor* service = pool.FindServiceByName("ckpt.v1.Trainer");
  ASSERT_NE(service, nullptr);
  ASSERT_NE(service->FindMethodByName("CheckpointNow"), nullptr);
  EXPECT_EQ(service->FindMethodByName("CheckpointNow")->input_type()->full_name(),
            "ckpt.v1.CheckpointNowRequest");

  // On the same stream, a file already sent comes alone, its imports not again.
  request.set_file_containing_symbol("ckpt.v1.Trainer.GetStatus");
  EXPECT_THAT(FileNames(Ask(request)), ElementsAre("proto/ckpt/v1/trainer.proto"));
  request.set_file_by_filename("proto/ckpt/v1/types.proto");
  EXPECT_THAT(FileNames(Ask(request)), ElementsAre("proto/ckpt/v1/types.proto"));
  request.set_all_extension_numbers_of_type("ckpt.v1.TrainerStatus");
  reflection::ServerReflectionResponse numbers = Ask(request);
  EXPECT_EQ(numbers.all_extension_numbers_response().base_type_name(), "ckpt.v1.TrainerStatus");
  EXPECT_EQ(numbers.all_extension_numbers_response().extension_number_size(), 0);
}

TEST_F(ReflectionV1Test, UnknownNamesAreNotFoundAndTheStreamGoesOn) {
  reflection::ServerReflectionRequest request;
  request.set_file_containing_symbol("ckpt.v1.NoSuchService");
  reflection::ServerReflectionResponse missing = Ask(request);
  EXPECT_EQ(missing.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_response().error_message(),
              ::testing::HasSubstr("ckpt.v1.NoSuchService"));
  request.set_file_by_filename("no/such.proto");
  EXPECT_EQ(Ask(request).error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  request.mutable_file_containing_extension()->set_containing_type("ckpt.v1.TrainerStatus");
  request.mutable_file_containing_extension()->set_extension_number(1000);
  EXPECT_EQ(Ask(request).error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  request.set_list_services("");
  EXPECT_GE(Ask(request).list_services_response().service_size(), 4);
}

}  // namespace
}  // namespace ckpt
