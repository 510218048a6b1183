// Runs the real checkpoint_store binary: flags, port file, health, auth, signals, exit codes.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/testing/child_process.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

extern char** environ;

namespace ckpt {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

using testing::TestCaseDir;
using testing::WriteTextFile;

// The binary under test, with its output in `dir`.
class ServerProcess : public testing::ChildProcess {
 public:
  explicit ServerProcess(const std::string& dir)
      : ChildProcess(testing::RunfilesPath("services/checkpoint_store/checkpoint_store"), dir) {}
};

std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  return context;
}

// Each start of the binary costs about a second (loading LibTorch), so the cases are few.
TEST(CheckpointStoreMainTest, ServesUntilSigtermThenExitsZero) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir + "/second").c_str(), 0755), 0);
  const std::string db = dir + "/db";
  const std::string port_file = dir + "/port";
  WriteTextFile(dir + "/token", "  tok-123\n");

  ServerProcess server(dir);
  ASSERT_TRUE(server.Start({"--store_dir=" + db, "--listen=127.0.0.1:0", "--port_file=" + port_file,
                            "--auth_token_file=" + dir + "/token", "--shutdown_grace=2s"}));
  const int port = server.WaitForPort(port_file, absl::Seconds(20));
  ASSERT_GT(port, 0) << server.stderr_text();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());

  auto health = grpc::health::v1::Health::NewStub(channel);
  HealthCheckRequest health_request;
  health_request.set_service(v1::CheckpointStore::service_full_name());
  HealthCheckResponse health_response;
  ASSERT_TRUE(health->Check(Context().get(), health_request, &health_response).ok());
  EXPECT_EQ(health_response.status(), HealthCheckResponse::SERVING);

  auto store = v1::CheckpointStore::NewStub(channel);
  v1::StoreStats stats;
  EXPECT_EQ(store->GetStats(Context().get(), {}, &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // As long as the right token, but not it.
  EXPECT_EQ(store->GetStats(Context("tok-124").get(), {}, &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(store->GetStats(Context("tok-123").get(), {}, &stats).ok());

  // The database is the running server's: a second server on it fails and says why.
  ServerProcess second(dir + "/second");
  ASSERT_TRUE(second.Start({"--store_dir=" + db}));
  std::optional<int> second_status = second.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(second_status.has_value());
  EXPECT_EQ(WEXITSTATUS(*second_status), 1);
  EXPECT_THAT(second.stderr_text(), HasSubstr("cannot open the store at " + db));

  server.Signal(SIGTERM);
  std::optional<int> status = server.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(status.has_value()) << "still running after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << server.stderr_text();
  EXPECT_THAT(server.stdout_text(),
              HasSubstr(absl::StrCat("checkpoint store serving ", db, " on ", address, "\n")));
  EXPECT_THAT(server.stderr_text(), HasSubstr("shutting down"));
}

TEST(CheckpointStoreMainTest, SigintAlsoShutsDownGracefully) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ServerProcess server(dir);
  // The old spelling of --store_dir still works for one release, and says so.
  ASSERT_TRUE(server.Start({"--db_path=" + dir + "/db", "--port_file=" + dir + "/port"}));
  ASSERT_GT(server.WaitForPort(dir + "/port", absl::Seconds(20)), 0) << server.stderr_text();
  EXPECT_THAT(server.stderr_text(), HasSubstr("--db_path is deprecated; use --store_dir"));
  server.Signal(SIGINT);
  std::optional<int> status = server.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(status.has_value()) << "still running after SIGINT";
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << server.stderr_text();
}

TEST(CheckpointStoreMainTest, HelpListsTheSharedFlags) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ServerProcess server(dir);
  ASSERT_TRUE(server.Start({"--help"}));
  ASSERT_TRUE(server.WaitForExit(absl::Seconds(20)).has_value());
  const std::string help = server.stdout_text() + server.stderr_text();
  for (const char* flag :
       {"--store_dir", "--listen", "--port_file", "--tls_cert_file", "--tls_key_file",
        "--tls_client_ca_file", "--tls_reload_interval", "--identities_file", "--auth_token_file",
        "--shutdown_grace", "--chunks_s3_endpoint", "--chunks_s3_credentials_file",
        "--max_watches"}) {
    EXPECT_THAT(help, HasSubstr(flag)) << help;
  }
}

TEST(CheckpointStoreMainTest, BadFlagsExitTwoWithAClearMessage) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  WriteTextFile(dir + "/empty_token", " \n");
  const std::string db = "--store_dir=" + dir + "/db";
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "--store_dir is required"},
      {{db, "--db_path=" + dir + "/db"}, "old spelling of --store_dir"},
      {{db, "--tls_key_file=" + dir + "/key.pem"}, "TLS needs both --tls_cert_file"},
      {{db, "--chunks_s3_region=default"}, "--chunks_s3_region needs --chunks_s3_endpoint"},
      {{db, "--chunks_s3_endpoint=http://127.0.0.1:1"},
       "--chunks_s3_endpoint needs --chunks_s3_bucket"},
      {{db, "--auth_token_file=" + dir + "/missing"}, "cannot read --auth_token_file"},
      {{db, "--auth_token_file=" + dir + "/empty_token"}, "is empty"},
      {{db, "--max_message_bytes=1000"}, "too small"},
      {{db, "--etcd_cert_file=" + dir + "/store.pem"}, "--etcd_*_file need --etcd_endpoints"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.flags));
    ServerProcess server(dir);
    ASSERT_TRUE(server.Start(c.flags));
    std::optional<int> status = server.WaitForExit(absl::Seconds(20));
    ASSERT_TRUE(status.has_value());
    ASSERT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 2);
    EXPECT_THAT(server.stderr_text(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace ckpt
