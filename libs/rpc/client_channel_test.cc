#include "libs/rpc/client_channel.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

// A Trainer service whose calls fail with UNAVAILABLE the first `failures` times: GetStatus
// stands for a read-only call the client retries, Stop for one that changes the server.
class FlakyTrainer final : public v1::Trainer::Service {
 public:
  explicit FlakyTrainer(int failures) : failures_(failures) {}
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::TrainerStatus*) override {
    return Answer(get_status_calls_);
  }
  grpc::Status Stop(grpc::ServerContext*, const v1::StopRequest*, v1::StopResponse*) override {
    return Answer(stop_calls_);
  }
  int get_status_calls() const { return get_status_calls_; }
  int stop_calls() const { return stop_calls_; }

 private:
  grpc::Status Answer(std::atomic<int>& calls) {
    if (calls++ < failures_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "warming up");
    return grpc::Status::OK;
  }
  const int failures_;
  std::atomic<int> get_status_calls_{0};
  std::atomic<int> stop_calls_{0};
};

const ServiceSpec& TrainerSpec() {
  static const ServiceSpec* spec = new ServiceSpec{"ckpt.v1.Trainer", "trainer", {"GetStatus"}};
  return *spec;
}

class ClientChannelTest : public ::testing::Test {
 protected:
  void Serve(int failures) {
    service_ = std::make_unique<FlakyTrainer>(failures);
    ASSERT_OK_AND_ASSIGN(server_, GrpcServer::Start({}, {{service_.get(), "ckpt.v1.Trainer"}}));
  }
  ClientOptions Options() const {
    ClientOptions options;
    options.address = server_->address();
    options.initial_backoff = absl::Milliseconds(10);
    return options;
  }
  absl::Status GetStatus(const ClientChannel& channel) const {
    auto stub = v1::Trainer::NewStub(channel.channel());
    v1::TrainerStatus status;
    return channel.CallUnary("GetStatus", absl::Seconds(10), [&](grpc::ClientContext* context) {
      return stub->GetStatus(context, v1::GetStatusRequest(), &status);
    });
  }
  absl::Status Stop(const ClientChannel& channel) const {
    auto stub = v1::Trainer::NewStub(channel.channel());
    v1::StopResponse response;
    return channel.CallUnary("Stop", absl::Seconds(10), [&](grpc::ClientContext* context) {
      return stub->Stop(context, v1::StopRequest(), &response);
    });
  }

  std::unique_ptr<FlakyTrainer> service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(ClientChannelTest, CallUnaryRetriesTheNamedReadOnlyMethodsOnUnavailable) {
  Serve(/*failures=*/2);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ClientChannel> channel,
                       ClientChannel::Open(Options(), TrainerSpec()));
  EXPECT_OK(GetStatus(*channel));
  EXPECT_EQ(service_->get_status_calls(), 3);
  // A method not named is sent once: it may have changed the server.
  EXPECT_THAT(Stop(*channel), StatusIs(absl::StatusCode::kUnavailable,
                                       "trainer at " + server_->address() + ": warming up"));
  EXPECT_EQ(service_->stop_calls(), 1);
}

TEST_F(ClientChannelTest, RetriesStopAtMaxRetries) {
  Serve(/*failures=*/100);
  ClientOptions options = Options();
  options.max_retries = 1;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ClientChannel> channel,
                       ClientChannel::Open(options, TrainerSpec()));
  EXPECT_THAT(GetStatus(*channel), StatusIs(absl::StatusCode::kUnavailable, "warming up"));
  EXPECT_EQ(service_->get_status_calls(), 2);
  options.max_retries = 0;
  ASSERT_OK_AND_ASSIGN(channel, ClientChannel::Open(options, TrainerSpec()));
  EXPECT_THAT(GetStatus(*channel), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(service_->get_status_calls(), 3);
}

TEST_F(ClientChannelTest, RestartOnUnavailableRunsTheAttemptAgainFromTheStart) {
  Serve(/*failures=*/0);
  ClientOptions options = Options();
  options.max_retries = 3;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ClientChannel> channel,
                       ClientChannel::Open(options, TrainerSpec()));
  int attempts = 0;
  EXPECT_OK(
      channel->RestartOnUnavailable(absl::Seconds(10), [&](std::unique_ptr<grpc::ClientContext>) {
        return ++attempts < 3 ? absl::UnavailableError("reset") : absl::OkStatus();
      }));
  EXPECT_EQ(attempts, 3);
  attempts = 0;
  EXPECT_THAT(channel->RestartOnUnavailable(absl::Seconds(10),
                                            [&](std::unique_ptr<grpc::ClientContext>) {
                                              ++attempts;
                                              return absl::UnavailableError("reset");
                                            }),
              StatusIs(absl::StatusCode::kUnavailable, "reset"));
  EXPECT_EQ(attempts, 4);
  attempts = 0;
  EXPECT_THAT(channel->RestartOnUnavailable(absl::Seconds(10),
                                            [&](std::unique_ptr<grpc::ClientContext>) {
                                              ++attempts;
                                              return absl::NotFoundError("no such version");
                                            }),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(attempts, 1);
}

TEST_F(ClientChannelTest, AServerThatIsDownIsUnavailableNamingIt) {
  Serve(/*failures=*/0);
  ClientOptions options = Options();
  options.connect_timeout = absl::Milliseconds(300);
  server_->Shutdown(absl::ZeroDuration());
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kUnavailable,
                       "cannot connect to the trainer at " + options.address));
}

TEST_F(ClientChannelTest, AReadOnlyCallToAServerThatWentDownIsUnavailableNamingIt) {
  Serve(/*failures=*/0);
  ClientOptions options = Options();
  options.connect_timeout = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ClientChannel> channel,
                       ClientChannel::Open(options, TrainerSpec()));
  server_->Shutdown(absl::ZeroDuration());
  // Fail-fast: the retries are spent long before the call's 10 s deadline.
  const absl::Time start = absl::Now();
  EXPECT_THAT(GetStatus(*channel),
              StatusIs(absl::StatusCode::kUnavailable, "trainer at " + options.address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(ClientChannelTest, AListOrDnsNameReachesTheServersThatAreUp) {
  Serve(/*failures=*/0);
  for (const std::string& address :
       {absl::StrCat("127.0.0.1:1,", server_->address()),  // port 1: nobody listens.
        absl::StrCat("dns:///localhost:", server_->port())}) {
    SCOPED_TRACE(address);
    ClientOptions options = Options();
    options.address = address;
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<ClientChannel> channel,
                         ClientChannel::Open(options, TrainerSpec()));
    for (int i = 0; i < 5; ++i) EXPECT_OK(GetStatus(*channel));
    EXPECT_EQ(channel->ServerName(), "trainer at " + address);
  }
}

TEST(ChannelTargetTest, OneAddressKeepsPickFirstAndSeveralGetRoundRobinWithHealthChecks) {
  ASSERT_OK_AND_ASSIGN(ChannelTarget one,
                       ChannelTargetFor("loader.example:7070", "ckpt.v1.Loader"));
  EXPECT_EQ(one.target, "loader.example:7070");
  EXPECT_EQ(one.service_config, "");
  EXPECT_FALSE(one.balanced);

  ASSERT_OK_AND_ASSIGN(ChannelTarget list,
                       ChannelTargetFor("10.0.0.1:7070, 10.0.0.2:7071", "ckpt.v1.Loader"));
  EXPECT_EQ(list.target, "ipv4:10.0.0.1:7070,10.0.0.2:7071");
  EXPECT_TRUE(list.balanced);
  EXPECT_EQ(list.service_config, R"({"loadBalancingConfig":[{"round_robin":{}}],)"
                                 R"("healthCheckConfig":{"serviceName":"ckpt.v1.Loader"}})");
  // Never gRPC's retries (client_channel.h says why).
  EXPECT_THAT(list.service_config, ::testing::Not(::testing::HasSubstr("retry")));

  ASSERT_OK_AND_ASSIGN(ChannelTarget v6, ChannelTargetFor("[::1]:1,[fe80::1]:2", "s"));
  EXPECT_EQ(v6.target, "ipv6:[::1]:1,[fe80::1]:2");

  ASSERT_OK_AND_ASSIGN(ChannelTarget dns, ChannelTargetFor("dns:///loaders.internal:7070", "s"));
  EXPECT_EQ(dns.target, "dns:///loaders.internal:7070");
  EXPECT_TRUE(dns.balanced);
  EXPECT_THAT(dns.service_config, ::testing::HasSubstr("round_robin"));
}

TEST(ChannelTargetTest, BadListsAreInvalidArgumentsNamingTheEntry) {
  EXPECT_THAT(ChannelTargetFor("10.0.0.1:7070,loader-b:7070", "s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'loader-b:7070'"));
  EXPECT_THAT(ChannelTargetFor("10.0.0.1:7070,loader-b:7070", "s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "dns:///NAME:PORT"));
  EXPECT_THAT(ChannelTargetFor("10.0.0.1:7070,", "s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "''"));
  EXPECT_THAT(ChannelTargetFor("10.0.0.1:7070,10.0.0.2:99999", "s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'10.0.0.2:99999'"));
  EXPECT_THAT(ChannelTargetFor("10.0.0.1:7070,[::1]:7070", "s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "mixes IPv4 and IPv6"));
  ClientOptions options;
  options.address = "10.0.0.1:7070,10.0.0.2:7070";
  options.tls.ca_file = "/no/such/ca.pem";
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "tls.server_name"));
}

TEST(ClientChannelOptionsTest, BadOptionsAreInvalidArgumentsNamingTheField) {
  ClientOptions options;
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "address"));
  options.address = "127.0.0.1:1";
  options.auth_token = "two words";
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "auth_token"));
  options.auth_token = "";
  options.stream_deadline = absl::ZeroDuration();
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "stream_deadline"));
  options.stream_deadline = absl::Hours(1);
  options.tls.cert_file = "client.pem";
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "tls.key_file"));
  options.tls.key_file = "client.key";
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "tls.ca_file"));
  options.tls.ca_file = "/no/such/ca.pem";
  EXPECT_THAT(ClientChannel::Open(options, TrainerSpec()),
              StatusIs(absl::StatusCode::kNotFound, "tls.ca_file=/no/such/ca.pem"));
}

}  // namespace
}  // namespace ckpt
