// HttpsTls under cpp-httplib's SSLServer with real certificates (made by openssl in setup) and
// real clients (curl, openssl s_client): TLS, mutual TLS with the client certificate's names as
// gRPC would give them, refusals, and a rotated certificate served without a restart.

#include "libs/console/https_tls.h"

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"
#include "libs/testing/test_certificates.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TestCertificates;
using ::testing::HasSubstr;

class HttpsTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(::testing::TempDir()) + "/https");
    std::filesystem::create_directories(*dir_);
    absl::StatusOr<TestCertificates> certs = ckpt::testing::MakeTestCertificates(*dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new TestCertificates(*certs);
  }

  // Serves "/" answering the client certificate's names, one per line.
  void Serve(ServerTlsOptions options) {
    ASSERT_OK_AND_ASSIGN(tls_, HttpsTls::Load(std::move(options)));
    server_ = std::make_unique<httplib::SSLServer>(
        [this](SSL_CTX& context) { return tls_->Configure(context); });
    ASSERT_TRUE(server_->is_valid());
    server_->Get("/", [](const httplib::Request& request, httplib::Response& response) {
      response.set_content(absl::StrJoin(PeerCertificateNames(request.ssl), "\n"), "text/plain");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    serving_ = std::thread([this] { server_->listen_after_bind(); });
  }
  void TearDown() override {
    if (server_ != nullptr) server_->stop();
    if (serving_.joinable()) serving_.join();
  }

  // curl's answer, or "failed: ..." when the connection was refused.
  std::string Get(const ckpt::testing::CertificateFiles* client) const {
    std::string command = absl::StrCat("curl -sS --max-time 10 --cacert ", certs_->ca);
    if (client != nullptr) {
      absl::StrAppend(&command, " --cert ", client->cert, " --key ", client->key);
    }
    absl::StrAppend(&command, " https://127.0.0.1:", port_, "/ 2>&1");
    const ckpt::testing::ShellResult result = ckpt::testing::RunShell(command);
    if (result.exit_code != 0) return "failed: " + result.output;
    return result.output;
  }

  static std::string* dir_;
  static TestCertificates* certs_;
  std::unique_ptr<HttpsTls> tls_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread serving_;
  int port_ = 0;
};

std::string* HttpsTlsTest::dir_ = nullptr;
TestCertificates* HttpsTlsTest::certs_ = nullptr;

TEST_F(HttpsTlsTest, BadFilesAreRefusedNamingTheFlag) {
  EXPECT_THAT(HttpsTls::Load({certs_->server.cert, "", "", absl::Seconds(60)}),
              StatusIs(absl::StatusCode::kInvalidArgument, "go together"));
  EXPECT_THAT(HttpsTls::Load({*dir_ + "/nothing.pem", certs_->server.key, "", absl::Seconds(60)}),
              StatusIs(absl::StatusCode::kNotFound, "--tls_cert_file="));
  EXPECT_THAT(HttpsTls::Load({certs_->server.key, certs_->server.key, "", absl::Seconds(60)}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a PEM certificate"));
  EXPECT_THAT(HttpsTls::Load({certs_->server.cert, certs_->client.key, "", absl::Seconds(60)}),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not the key of --tls_cert_file"));
  EXPECT_THAT(HttpsTls::Load(
                  {certs_->server.cert, certs_->server.key, certs_->server.key, absl::Seconds(60)}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--tls_client_ca_file="));
}

TEST_F(HttpsTlsTest, ServesTlsToAnyClientWithoutAClientCa) {
  Serve({certs_->server.cert, certs_->server.key, "", absl::Seconds(60)});
  EXPECT_EQ(Get(nullptr), "");  // no client certificate, no names
  // A client that trusts another CA does not trust this server.
  const ckpt::testing::ShellResult distrust = ckpt::testing::RunShell(absl::StrCat(
      "curl -sS --max-time 10 --cacert ", certs_->other_ca, " https://127.0.0.1:", port_, "/"));
  EXPECT_NE(distrust.exit_code, 0);
}

TEST_F(HttpsTlsTest, MutualTlsNamesTheClientCertificateAsGrpcWouldAndRefusesOthers) {
  Serve({certs_->server.cert, certs_->server.key, certs_->ca, absl::Seconds(60)});
  EXPECT_EQ(Get(&certs_->client), "team-a.example\nteam-a\nCN=team-a");
  EXPECT_EQ(Get(&certs_->ops), "ops\nCN=ops");
  EXPECT_THAT(Get(nullptr), HasSubstr("failed"));
  EXPECT_THAT(Get(&certs_->foreign_client), HasSubstr("failed"));
  EXPECT_THAT(Get(&certs_->expired_client), HasSubstr("failed"));
  // Still serving good clients after refusing those.
  EXPECT_EQ(Get(&certs_->ops), "ops\nCN=ops");
  // A client that reconnects (as a browser does, offering to resume its session) is served too.
  const ckpt::testing::ShellResult twice = ckpt::testing::RunShell(
      absl::StrCat("curl -sS --max-time 10 --cacert ", certs_->ca, " --cert ", certs_->ops.cert,
                   " --key ", certs_->ops.key, " -H 'Connection: close' https://127.0.0.1:", port_,
                   "/ https://127.0.0.1:", port_, "/ 2>&1"));
  EXPECT_EQ(twice.exit_code, 0) << twice.output;
  EXPECT_EQ(twice.output, "ops\nCN=opsops\nCN=ops");
}

TEST_F(HttpsTlsTest, ARotatedCertificateIsServedWithoutARestart) {
  const std::string rotate = *dir_ + "/rotate";
  std::filesystem::create_directories(rotate);
  ASSERT_OK_AND_ASSIGN(ckpt::testing::CertificateFiles first,
                       ckpt::testing::IssueCertificate(rotate, certs_->ca, "first", "/CN=first",
                                                       "IP:127.0.0.1", 30));
  ASSERT_OK_AND_ASSIGN(ckpt::testing::CertificateFiles second,
                       ckpt::testing::IssueCertificate(rotate, certs_->ca, "second", "/CN=second",
                                                       "IP:127.0.0.1", 30));
  const std::string cert = rotate + "/live.pem", key = rotate + "/live.key";
  std::filesystem::copy_file(first.cert, cert, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(first.key, key, std::filesystem::copy_options::overwrite_existing);
  Serve({cert, key, "", absl::Seconds(1)});
  const auto served = [&] {
    return std::string(absl::StripAsciiWhitespace(
        ckpt::testing::RunShell(
            absl::StrCat("openssl s_client -connect 127.0.0.1:", port_,
                         " </dev/null 2>/dev/null | openssl x509 -noout -subject"))
            .output));
  };
  EXPECT_THAT(served(), HasSubstr("CN = first"));
  std::filesystem::copy_file(second.key, key + ".new");
  std::filesystem::copy_file(second.cert, cert + ".new");
  std::filesystem::rename(key + ".new", key);
  std::filesystem::rename(cert + ".new", cert);
  std::string now;
  for (int i = 0; i < 50 && now.find("second") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    now = served();
  }
  EXPECT_THAT(now, HasSubstr("CN = second"));
  EXPECT_EQ(Get(nullptr), "");  // and curl still verifies it
}

}  // namespace
}  // namespace ckpt
