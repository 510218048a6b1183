// TLS and mutual TLS end to end: GrpcServer's credentials, ClientChannel's, and AccessPolicy's
// certificate identities, with real certificates made by openssl in setup.

#include <filesystem>
#include <iostream>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/auth/access_policy.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/grpc_server.h"
#include "libs/rpc/identity_service.h"
#include "libs/server/run_certificate.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"
#include "libs/testing/test_certificates.h"
#include "proto/ckpt/v1/identity.grpc.pb.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TestCertificates;

// Answers GetStatus with the caller's identity (in `model`) as the access policy sees it.
class WhoAmI final : public v1::Trainer::Service {
 public:
  explicit WhoAmI(const AccessPolicy* policy) : policy_(policy) {}
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest*,
                         v1::TrainerStatus* status) override {
    absl::StatusOr<Caller> caller = policy_->Check(*context, "trainer", "GetStatus", "");
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    status->set_model(caller->identity);
    return grpc::Status::OK;
  }
  // Needs the writer role; answers nothing else.
  grpc::Status CheckpointNow(grpc::ServerContext* context, const v1::CheckpointNowRequest*,
                             v1::CheckpointNowResponse*) override {
    return ToGrpcStatus(policy_->Check(*context, "trainer", "CheckpointNow", "").status());
  }

 private:
  const AccessPolicy* policy_;
};

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(::testing::TempDir()) + "/tls");
    std::filesystem::create_directories(*dir_);
    absl::StatusOr<TestCertificates> certs = ckpt::testing::MakeTestCertificates(*dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new TestCertificates(*certs);
  }

  void Serve(const AccessPolicy* policy, bool mutual, absl::Duration reload = absl::Seconds(60)) {
    service_ = std::make_unique<WhoAmI>(policy);
    GrpcServerOptions options;
    options.tls.cert_file = certs_->server.cert;
    options.tls.key_file = certs_->server.key;
    if (mutual) options.tls.client_ca_file = certs_->ca;
    options.tls.reload_interval = reload;
    ASSERT_OK_AND_ASSIGN(server_,
                         GrpcServer::Start(options, {{service_.get(), "ckpt.v1.Trainer"}}));
  }

  ClientOptions Client(const ckpt::testing::CertificateFiles* identity) const {
    ClientOptions options;
    options.address = server_->address();
    options.connect_timeout = absl::Seconds(2);
    options.tls.ca_file = certs_->ca;
    if (identity != nullptr) {
      options.tls.cert_file = identity->cert;
      options.tls.key_file = identity->key;
    }
    return options;
  }

  // The identity the server saw, or the error.
  absl::StatusOr<std::string> WhoAmIAs(const ClientOptions& options) const {
    absl::StatusOr<std::string> who = Call(options);
    if (!who.ok()) std::cerr << "call failed: " << who.status() << "\n";
    return who;
  }
  // CheckpointNow (a writer's call) as `options`' identity.
  absl::Status CheckpointNowAs(const ClientOptions& options) const {
    ASSIGN_OR_RETURN(std::shared_ptr<ClientChannel> channel,
                     ClientChannel::Open(options, {"ckpt.v1.Trainer", "trainer", {}}));
    auto stub = v1::Trainer::NewStub(channel->channel());
    auto context = channel->NewContext(absl::Now() + absl::Seconds(10));
    v1::CheckpointNowResponse response;
    return channel->FromCall(
        stub->CheckpointNow(context.get(), v1::CheckpointNowRequest(), &response));
  }
  absl::StatusOr<std::string> Call(const ClientOptions& options) const {
    ASSIGN_OR_RETURN(std::shared_ptr<ClientChannel> channel,
                     ClientChannel::Open(options, {"ckpt.v1.Trainer", "trainer", {}}));
    auto stub = v1::Trainer::NewStub(channel->channel());
    auto context = channel->NewContext(absl::Now() + absl::Seconds(10));
    v1::TrainerStatus status;
    RETURN_IF_ERROR(
        channel->FromCall(stub->GetStatus(context.get(), v1::GetStatusRequest(), &status)));
    return status.model();
  }

  static std::string* dir_;
  static TestCertificates* certs_;
  std::unique_ptr<WhoAmI> service_;
  std::unique_ptr<GrpcServer> server_;
};

std::string* TlsTest::dir_ = nullptr;
TestCertificates* TlsTest::certs_ = nullptr;

absl::StatusOr<std::unique_ptr<AccessPolicy>> CertificatePolicy(const std::string& dir) {
  const std::string path = dir + "/identities.json";
  ckpt::testing::WriteTextFile(path, R"({"identities": [
      {"name": "team-a", "certificate": "team-a.example", "role": "writer"},
      {"name": "ops", "certificate": "ops", "role": "admin"}]})");
  return AccessPolicy::FromIdentitiesFile(path);
}

TEST_F(TlsTest, MutualTlsAcceptsAGoodClientCertificateAndNamesItsIdentity) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy, CertificatePolicy(*dir_));
  Serve(policy.get(), /*mutual=*/true);
  // The SAN names team-a; ops has only a common name.
  EXPECT_EQ(WhoAmIAs(Client(&certs_->client)).value_or("error"), "team-a");
  EXPECT_EQ(WhoAmIAs(Client(&certs_->ops)).value_or("error"), "ops");
}

TEST_F(TlsTest, MutualTlsRefusesNoCertificateAForeignOneAndAnExpiredOne) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy, CertificatePolicy(*dir_));
  Serve(policy.get(), /*mutual=*/true);
  EXPECT_THAT(WhoAmIAs(Client(nullptr)),
              StatusIs(absl::StatusCode::kUnavailable, "client certificate"));
  EXPECT_THAT(WhoAmIAs(Client(&certs_->foreign_client)),
              StatusIs(absl::StatusCode::kUnavailable, "cannot connect"));
  EXPECT_THAT(WhoAmIAs(Client(&certs_->expired_client)),
              StatusIs(absl::StatusCode::kUnavailable, "cannot connect"));
  // The server still serves good clients after refusing those.
  EXPECT_EQ(WhoAmIAs(Client(&certs_->client)).value_or("error"), "team-a");
}

TEST_F(TlsTest, ATrustedCertificateNotListedInTheIdentitiesFileIsUnauthenticated) {
  const std::string path = *dir_ + "/only-ops.json";
  ckpt::testing::WriteTextFile(path, R"({"identities": [
      {"name": "ops", "certificate": "ops", "role": "admin"}]})");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy,
                       AccessPolicy::FromIdentitiesFile(path));
  Serve(policy.get(), /*mutual=*/true);
  // The CA signed it, so TLS admits it; but no identity is listed for it.
  EXPECT_THAT(WhoAmIAs(Client(&certs_->client)),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       "no identity is listed for the certificate of team-a.example"));
  EXPECT_EQ(WhoAmIAs(Client(&certs_->ops)).value_or("error"), "ops");
}

TEST_F(TlsTest, ACertificateIdentityIsHeldToItsRoleLikeAToken) {
  const std::string path = *dir_ + "/reader-cert.json";
  ckpt::testing::WriteTextFile(path, R"({"identities": [
      {"name": "team-a", "certificate": "team-a.example", "role": "reader"},
      {"name": "ops", "certificate": "ops", "role": "admin"}]})");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy,
                       AccessPolicy::FromIdentitiesFile(path));
  Serve(policy.get(), /*mutual=*/true);
  EXPECT_EQ(WhoAmIAs(Client(&certs_->client)).value_or("error"), "team-a");
  EXPECT_THAT(CheckpointNowAs(Client(&certs_->client)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "identity 'team-a' (role reader) may not ask the trainer for a "
                       "checkpoint (CheckpointNow): that needs the writer role"));
  EXPECT_OK(CheckpointNowAs(Client(&certs_->ops)));
}

TEST_F(TlsTest, AnIdentityRemovedFromTheFileIsRefusedWithinTheReloadIntervalWithoutARestart) {
  const std::string path = *dir_ + "/revoked.json";
  ckpt::testing::WriteTextFile(path, R"({"identities": [
      {"name": "team-a", "certificate": "team-a.example", "role": "writer"},
      {"name": "ops", "certificate": "ops", "role": "admin"}]})");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy,
                       AccessPolicy::FromIdentitiesFile(path));
  Serve(policy.get(), /*mutual=*/true);
  ASSERT_EQ(WhoAmIAs(Client(&certs_->client)).value_or("error"), "team-a");
  // Revoked: written to a temporary file and renamed over, as an operator's tooling would.
  ckpt::testing::WriteTextFile(path + ".new", R"({"identities": [
      {"name": "ops", "certificate": "ops", "role": "admin"}]})");
  std::filesystem::rename(path + ".new", path);
  const absl::Time revoked = absl::Now();
  absl::Status refused;
  while (absl::Now() - revoked < absl::Seconds(5)) {
    refused = WhoAmIAs(Client(&certs_->client)).status();
    if (!refused.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnauthenticated));
  // The reload is checked at most once a second: refused within about that, never later.
  EXPECT_LT(absl::Now() - revoked, absl::Seconds(2.5));
  EXPECT_EQ(WhoAmIAs(Client(&certs_->ops)).value_or("error"), "ops");
}

// A front end (here holding the `ops` certificate) that forwards its user's certificate: the
// call is the user's, held to the user's role, and nobody else may forward.
TEST_F(TlsTest, AForwardingFrontEndActsAsTheUserWhoseCertificateItForwardsAndAsNobodyElse) {
  const std::string path = *dir_ + "/forwarding.json";
  // bot: sha256("bot-token").
  ckpt::testing::WriteTextFile(path, R"({"identities": [
      {"name": "console", "certificate": "ops", "forwards_certificates": true},
      {"name": "team-a", "certificate": "team-a.example", "role": "writer",
       "models": ["team-a-*"]},
      {"name": "viewer", "certificate": "viewer.example", "role": "reader"},
      {"name": "bot", "role": "reader", "token_sha256":
       "df27f9beb68b7766af3ab2cd7eeefe0c759ca4d085db8b2235811ad36f27cd1c"}]})");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const AccessPolicy> policy,
                       AccessPolicy::FromIdentitiesFile(path));
  IdentityService identity(policy, "test server");
  service_ = std::make_unique<WhoAmI>(policy.get());
  GrpcServerOptions server_options;
  server_options.tls = {certs_->server.cert, certs_->server.key, certs_->ca, absl::Seconds(60)};
  ASSERT_OK_AND_ASSIGN(server_,
                       GrpcServer::Start(server_options, {{service_.get(), "ckpt.v1.Trainer"},
                                                          {&identity, "ckpt.v1.Identity"}}));
  const auto who_am_i = [&](const ClientOptions& options) -> absl::StatusOr<v1::WhoAmIResponse> {
    ASSIGN_OR_RETURN(std::shared_ptr<ClientChannel> channel,
                     ClientChannel::Open(options, {"ckpt.v1.Identity", "test server", {}}));
    auto stub = v1::Identity::NewStub(channel->channel());
    v1::WhoAmIRequest request;
    request.add_methods("SetAlias");
    request.set_model("team-a-mnist");
    v1::WhoAmIResponse response;
    auto context = channel->NewContext(absl::Now() + absl::Seconds(10));
    RETURN_IF_ERROR(channel->FromCall(stub->WhoAmI(context.get(), request, &response)));
    return response;
  };

  ClientOptions front_end = Client(&certs_->ops);
  front_end.forwarded_certificate_names = {"team-a.example", "CN=alice,O=Example"};
  ASSERT_OK_AND_ASSIGN(v1::WhoAmIResponse alice, who_am_i(front_end));
  EXPECT_EQ(alice.identity(), "team-a via console");
  EXPECT_EQ(alice.role(), "writer");
  EXPECT_THAT(alice.models(), ::testing::ElementsAre("team-a-*"));
  EXPECT_THAT(alice.allowed_methods(), ::testing::ElementsAre("SetAlias"));
  EXPECT_OK(CheckpointNowAs(front_end));

  // A reader's certificate, forwarded, is a reader's call.
  front_end.forwarded_certificate_names = {"viewer.example"};
  EXPECT_EQ(WhoAmIAs(front_end).value_or("error"), "viewer via console");
  EXPECT_THAT(CheckpointNowAs(front_end),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "identity 'viewer via console' (role reader) may not ask the trainer "
                       "for a checkpoint (CheckpointNow)"));

  // A certificate no identity is listed for, and no certificate at all: the front end has no
  // rights of its own.
  front_end.forwarded_certificate_names = {"stranger.example"};
  EXPECT_THAT(WhoAmIAs(front_end),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       "no identity is listed for the certificate of stranger.example (forwarded "
                       "by 'console')"));
  front_end.forwarded_certificate_names.clear();
  EXPECT_THAT(WhoAmIAs(front_end),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       "'console' forwards its users' certificates and this call forwarded none"));

  // A user who signed in with a token is the token's identity, whoever relays the call.
  front_end.forwarded_certificate_names = {"team-a.example"};
  front_end.auth_token = "bot-token";
  EXPECT_EQ(WhoAmIAs(front_end).value_or("error"), "bot");

  // An identity that is not a forwarding front end may not claim to be someone else.
  ClientOptions team_a = Client(&certs_->client);
  team_a.forwarded_certificate_names = {"ops"};
  EXPECT_THAT(WhoAmIAs(team_a), StatusIs(absl::StatusCode::kPermissionDenied,
                                         "identity 'team-a' may not forward client certificates"));
  team_a.forwarded_certificate_names.clear();
  EXPECT_EQ(WhoAmIAs(team_a).value_or("error"), "team-a");
  server_.reset();  // before `identity`, which it serves, goes
}

TEST_F(TlsTest, ServerTlsWithoutClientCertificatesAuthenticatesByToken) {
  std::unique_ptr<AccessPolicy> policy = AccessPolicy::SharedToken("s3cret");
  Serve(policy.get(), /*mutual=*/false);
  ClientOptions options = Client(nullptr);
  EXPECT_THAT(WhoAmIAs(options), StatusIs(absl::StatusCode::kUnauthenticated));
  options.auth_token = "s3creT";  // As long as the right token, but not it.
  EXPECT_THAT(WhoAmIAs(options), StatusIs(absl::StatusCode::kUnauthenticated));
  options.auth_token = "s3cret";
  EXPECT_EQ(WhoAmIAs(options).value_or("error"), "token");
  // A client that does not trust the server's CA cannot connect.
  options.tls.ca_file = certs_->other_ca;
  EXPECT_THAT(WhoAmIAs(options), StatusIs(absl::StatusCode::kUnavailable, "cannot connect"));
  // Nor can a plaintext client.
  options.tls = ClientTlsOptions();
  EXPECT_THAT(WhoAmIAs(options), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, ARotatedServerCertificateIsServedWithoutARestart) {
  // The server's files are copies this test may overwrite.
  const std::string rotate_dir = *dir_ + "/rotate";
  std::filesystem::create_directories(rotate_dir);
  ASSERT_OK_AND_ASSIGN(ckpt::testing::CertificateFiles first,
                       ckpt::testing::IssueCertificate(rotate_dir, certs_->ca, "first", "/CN=first",
                                                       "IP:127.0.0.1", 30));
  ASSERT_OK_AND_ASSIGN(ckpt::testing::CertificateFiles second,
                       ckpt::testing::IssueCertificate(rotate_dir, certs_->ca, "second",
                                                       "/CN=second", "IP:127.0.0.1", 30));
  const std::string cert = rotate_dir + "/live.pem", key = rotate_dir + "/live.key";
  std::filesystem::copy_file(first.cert, cert);
  std::filesystem::copy_file(first.key, key);
  std::unique_ptr<AccessPolicy> policy = AccessPolicy::AllowAll();
  service_ = std::make_unique<WhoAmI>(policy.get());
  GrpcServerOptions options;
  options.tls = {cert, key, "", absl::Seconds(1)};
  ASSERT_OK_AND_ASSIGN(server_, GrpcServer::Start(options, {{service_.get(), "ckpt.v1.Trainer"}}));

  // The common name of the certificate a new connection is served.
  const auto served_name = [&]() -> std::string {
    ClientOptions client = Client(nullptr);
    absl::StatusOr<std::shared_ptr<ClientChannel>> channel =
        ClientChannel::Open(client, {"ckpt.v1.Trainer", "trainer", {}});
    if (!channel.ok()) return channel.status().ToString();
    auto stub = v1::Trainer::NewStub((*channel)->channel());
    auto context = (*channel)->NewContext(absl::Now() + absl::Seconds(10));
    v1::TrainerStatus status;
    if (!stub->GetStatus(context.get(), v1::GetStatusRequest(), &status).ok()) return "failed";
    const auto names = context->auth_context()->FindPropertyValues("x509_common_name");
    return names.empty() ? "" : std::string(names[0].data(), names[0].size());
  };
  EXPECT_EQ(served_name(), "first");
  // Replace key and certificate (each by an atomic rename, as cert managers do).
  std::filesystem::copy_file(second.key, key + ".new");
  std::filesystem::copy_file(second.cert, cert + ".new");
  std::filesystem::rename(key + ".new", key);
  std::filesystem::rename(cert + ".new", cert);
  std::string name;
  for (int i = 0; i < 50 && name != "second"; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    name = served_name();
  }
  EXPECT_EQ(name, "second");
}

TEST(RunCertificateTest, AServerWithARunCertificateIsReachedByClientsTrustingExactlyIt) {
  const std::string dir = std::string(::testing::TempDir()) + "/run-cert";
  std::filesystem::create_directories(dir);
  ASSERT_OK_AND_ASSIGN(RunCertificate run,
                       MakeRunCertificate("ckpt-run", {"127.0.0.1", "localhost"}, absl::Hours(1)));
  ckpt::testing::WriteTextFile(dir + "/run.pem", run.cert_pem);
  ckpt::testing::WriteTextFile(dir + "/run.key", run.key_pem);
  ASSERT_OK_AND_ASSIGN(RunCertificate other,
                       MakeRunCertificate("ckpt-run", {"127.0.0.1"}, absl::Hours(1)));
  ckpt::testing::WriteTextFile(dir + "/other.pem", other.cert_pem);
  EXPECT_THAT(ckpt::testing::RunShell("openssl x509 -noout -text -in " + dir + "/run.pem").output,
              ::testing::AllOf(::testing::HasSubstr("IP Address:127.0.0.1"),
                               ::testing::HasSubstr("DNS:localhost")));

  std::unique_ptr<AccessPolicy> policy = AccessPolicy::AllowAll();
  WhoAmI service(policy.get());
  GrpcServerOptions options;
  options.tls = {dir + "/run.pem", dir + "/run.key", "", absl::Seconds(60)};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcServer> server,
                       GrpcServer::Start(options, {{&service, "ckpt.v1.Trainer"}}));
  ClientOptions client;
  client.address = server->address();
  client.connect_timeout = absl::Seconds(2);
  client.tls.ca_file = dir + "/run.pem";
  EXPECT_OK(ClientChannel::Open(client, {"ckpt.v1.Trainer", "trainer", {}}).status());
  // Another run's certificate is not trusted.
  client.tls.ca_file = dir + "/other.pem";
  EXPECT_THAT(ClientChannel::Open(client, {"ckpt.v1.Trainer", "trainer", {}}),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(GrpcServerTlsOptionsTest, BadTlsFilesFailAtStartNamingTheFlag) {
  class Idle final : public v1::Trainer::Service {
  } idle;
  GrpcServerOptions options;
  options.tls.cert_file = "/no/such/cert.pem";
  EXPECT_THAT(GrpcServer::Start(options, {{&idle, "ckpt.v1.Trainer"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "tls_key_file"));
  options.tls.key_file = "/no/such/key.pem";
  EXPECT_THAT(GrpcServer::Start(options, {{&idle, "ckpt.v1.Trainer"}}),
              StatusIs(absl::StatusCode::kNotFound, "tls_cert_file=/no/such/cert.pem"));
  const std::string not_pem = std::string(::testing::TempDir()) + "/not.pem";
  ckpt::testing::WriteTextFile(not_pem, "hello");
  options.tls.cert_file = not_pem;
  options.tls.key_file = not_pem;
  EXPECT_THAT(GrpcServer::Start(options, {{&idle, "ckpt.v1.Trainer"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds no PEM block"));
}

TEST(LoopbackTest, OnlyLoopbackHostsAreLoopback) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("[::]"));
  EXPECT_FALSE(IsLoopbackHost("10.1.2.3"));
}

}  // namespace
}  // namespace ckpt
