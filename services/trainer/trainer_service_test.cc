// The ckpt.v1.Trainer control API's authentication and authorization, served by a real gRPC server
// on loopback over a real TrainerControl, with a thread standing in for rank 0's training loop.

#include "services/trainer/trainer_service.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"

namespace ckpt {
namespace {

constexpr char kToken[] = "trainer-control-token";

std::string Sha256Hex(const std::string& token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

// `token` with one byte changed at `index`: as long as the right one, so only a comparison of
// every byte tells them apart.
std::string SameLengthWrong(std::string token, size_t index) {
  token[index] ^= 1;
  return token;
}

// Plays rank 0's loop against the control: publishes a status, answers checkpoint and stop
// requests at "step boundaries" every few milliseconds, and counts the requests it saw.
class Loop {
 public:
  explicit Loop(train::TrainerControl* control) : control_(control) {
    v1::TrainerStatus status;
    status.set_state(v1::TrainerStatus::STATE_TRAINING);
    status.set_model("m");
    status.set_global_step(7);
    control_->SetStatus(status);
    thread_ = std::thread([this] { Run(); });
  }
  ~Loop() {
    done_ = true;
    thread_.join();
  }
  int checkpoints() const { return checkpoints_; }
  int stops() const { return stops_; }

 private:
  void Run() {
    int64_t version = 0;
    while (!done_) {
      const train::TrainerControl::Requests requests = control_->pending();
      if (requests.checkpoint) {
        ++checkpoints_;
        v1::VersionRef ref;
        ref.set_model("m");
        ref.set_version(++version);
        control_->CheckpointFinished(ref);
      }
      if (requests.stop) {
        ++stops_;
        control_->Finished(std::nullopt);
        return;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  train::TrainerControl* const control_;
  std::atomic<bool> done_{false};
  std::atomic<int> checkpoints_{0};
  std::atomic<int> stops_{0};
  std::thread thread_;
};

class TrainerServiceTest : public ::testing::Test {
 protected:
  void Serve(std::shared_ptr<const AccessPolicy> policy) {
    service_ = std::make_unique<TrainerService>(&control_, std::move(policy), absl::Seconds(10));
    ASSERT_OK_AND_ASSIGN(
        server_, GrpcServer::Start({}, {{service_.get(), v1::Trainer::service_full_name()}}));
    stub_ = v1::Trainer::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  grpc::StatusCode GetStatus(const std::string& token) {
    v1::TrainerStatus status;
    return stub_->GetStatus(Context(token).get(), {}, &status).error_code();
  }
  grpc::StatusCode CheckpointNow(const std::string& token) {
    v1::CheckpointNowResponse response;
    return stub_->CheckpointNow(Context(token).get(), {}, &response).error_code();
  }
  grpc::StatusCode Stop(const std::string& token) {
    v1::StopResponse response;
    return stub_->Stop(Context(token).get(), {}, &response).error_code();
  }

  train::TrainerControl control_;
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Trainer::Stub> stub_;
};

TEST_F(TrainerServiceTest, SharedTokenRefusesEveryOtherTokenAndTheLoopNeverSeesTheirRequests) {
  Loop loop(&control_);
  Serve(AccessPolicy::SharedToken(kToken));
  const size_t last = sizeof(kToken) - 2;
  for (const std::string& token : {std::string(), std::string("wrong"), std::string(kToken) + "x",
                                   SameLengthWrong(kToken, 0), SameLengthWrong(kToken, last)}) {
    SCOPED_TRACE(token);
    EXPECT_EQ(GetStatus(token), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(CheckpointNow(token), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Stop(token), grpc::StatusCode::UNAUTHENTICATED);
  }
  // A refused CheckpointNow or Stop never reached the training loop.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(loop.checkpoints(), 0);
  EXPECT_EQ(loop.stops(), 0);

  v1::TrainerStatus status;
  ASSERT_TRUE(stub_->GetStatus(Context(kToken).get(), {}, &status).ok());
  EXPECT_EQ(status.global_step(), 7);
  v1::CheckpointNowResponse checkpoint;
  grpc::Status result = stub_->CheckpointNow(Context(kToken).get(), {}, &checkpoint);
  ASSERT_TRUE(result.ok()) << result.error_message();
  EXPECT_EQ(checkpoint.version().version(), 1);
  EXPECT_EQ(Stop(kToken), grpc::StatusCode::OK);
  EXPECT_EQ(loop.checkpoints(), 1);
  EXPECT_EQ(loop.stops(), 1);
}

TEST_F(TrainerServiceTest, IdentitiesGiveReadersStatusOnlyAndRefuseNearMissTokens) {
  const std::string dir = testing::TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string reader = "reader-token-0001", writer = "writer-token-0002";
  testing::WriteTextFile(
      dir + "/identities.json",
      absl::StrCat(R"({"identities": [)", R"({"name": "dashboard", "token_sha256": ")",
                   Sha256Hex(reader), R"(", "role": "reader"}, )",
                   R"({"name": "scheduler", "token_sha256": ")", Sha256Hex(writer),
                   R"(", "role": "writer"}]})"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy,
                       AccessPolicy::FromIdentitiesFile(dir + "/identities.json"));
  Loop loop(&control_);
  Serve(std::move(policy));

  for (const std::string& token :
       {SameLengthWrong(reader, 0), SameLengthWrong(reader, reader.size() - 1),
        SameLengthWrong(writer, 0), SameLengthWrong(writer, writer.size() - 1)}) {
    SCOPED_TRACE(token);
    EXPECT_EQ(GetStatus(token), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(CheckpointNow(token), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Stop(token), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(GetStatus(""), grpc::StatusCode::UNAUTHENTICATED);
  // A reader watches but may not checkpoint or stop the run.
  EXPECT_EQ(GetStatus(reader), grpc::StatusCode::OK);
  EXPECT_EQ(CheckpointNow(reader), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Stop(reader), grpc::StatusCode::PERMISSION_DENIED);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(loop.checkpoints(), 0);
  EXPECT_EQ(loop.stops(), 0);

  EXPECT_EQ(CheckpointNow(writer), grpc::StatusCode::OK);
  EXPECT_EQ(Stop(writer), grpc::StatusCode::OK);
  EXPECT_EQ(loop.checkpoints(), 1);
  EXPECT_EQ(loop.stops(), 1);
}

}  // namespace
}  // namespace ckpt
