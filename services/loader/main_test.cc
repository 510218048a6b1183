// Runs the real loader binary: flags, --help, port file, health, auth, signals, cache log line.

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
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/child_process.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"
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
      : ChildProcess(testing::RunfilesPath("services/loader/loader"), dir) {}
};

std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  return context;
}
// An empty store directory (the loader opens existing stores only).
std::string MakeStore(const std::string& dir) {
  const std::string db = dir + "/db";
  StoreOptions options;
  options.db_path = db;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return db;
}

// Each start of the binary costs about a second (loading LibTorch), so the cases are few.
TEST(LoaderMainTest, ServesHealthAndAuthUntilSigtermThenLogsCacheStats) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string db = MakeStore(dir);
  const std::string port_file = dir + "/port";
  WriteTextFile(dir + "/token", "  tok-9\n");

  ServerProcess server(dir);
  ASSERT_TRUE(server.Start({"--store_dir=" + db, "--listen=127.0.0.1:0", "--port_file=" + port_file,
                            "--auth_token_file=" + dir + "/token", "--cache_bytes=1048576",
                            "--shutdown_grace=2s"}));
  const int port = server.WaitForPort(port_file, absl::Seconds(20));
  ASSERT_GT(port, 0) << server.stderr_text();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());

  auto health = grpc::health::v1::Health::NewStub(channel);
  HealthCheckRequest health_request;
  health_request.set_service(v1::Loader::service_full_name());
  HealthCheckResponse health_response;
  ASSERT_TRUE(health->Check(Context().get(), health_request, &health_response).ok());
  EXPECT_EQ(health_response.status(), HealthCheckResponse::SERVING);

  auto loader = v1::Loader::NewStub(channel);
  v1::PreflightRequest request;
  request.mutable_ref()->set_model("absent");
  v1::PreflightResponse response;
  EXPECT_EQ(loader->Preflight(Context().get(), request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // As long as the right token, but not it.
  EXPECT_EQ(loader->Preflight(Context("tok-8").get(), request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Authenticated, the call reaches the store, which has no such model.
  EXPECT_EQ(loader->Preflight(Context("tok-9").get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  server.Signal(SIGTERM);
  std::optional<int> status = server.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(status.has_value()) << "still running after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << server.stderr_text();
  EXPECT_THAT(server.stdout_text(),
              HasSubstr(absl::StrCat("loader serving ", db, " on ", address, "\n")));
  EXPECT_THAT(server.stderr_text(), HasSubstr("shutting down"));
  EXPECT_THAT(server.stderr_text(), HasSubstr("loader cache: hits=0 misses=0"));
}

TEST(LoaderMainTest, HelpDescribesEveryFlag) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ServerProcess server(dir);
  ASSERT_TRUE(server.Start({"--help"}));
  std::optional<int> status = server.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(status.has_value());
  const std::string help = server.stdout_text() + server.stderr_text();
  for (const char* flag :
       {"--store", "--store_dir", "--store_auth_token_file", "--store_tls_ca_file",
        "--store_tls_server_name", "--listen", "--port_file", "--auth_token_file",
        "--identities_file", "--tls_cert_file", "--tls_reload_interval", "--chunks_s3_endpoint",
        "--cache_bytes", "--max_message_bytes", "--shutdown_grace"}) {
    EXPECT_THAT(help, HasSubstr(flag)) << help;
  }
  EXPECT_THAT(help, HasSubstr("Default 1073741824 (1 GiB)"));
}

TEST(LoaderMainTest, BadFlagsExitTwoWithAClearMessage) {
  const std::string dir = TestCaseDir();
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  WriteTextFile(dir + "/empty_token", " \n");
  const std::string store_dir = "--store_dir=" + dir + "/db";
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "exactly one of --store=HOST:PORT"},
      {{store_dir, "--store=127.0.0.1:1"}, "exactly one of --store=HOST:PORT"},
      {{store_dir, "--auth_token_file=" + dir + "/empty_token"}, "is empty"},
      {{store_dir, "--cache_bytes=-1"}, "--cache_bytes must not be negative"},
      {{store_dir, "--max_message_bytes=1000"}, "too small"},
      {{store_dir, "--store_tls_ca_file=" + dir + "/ca.pem"}, "--store_tls_* flags need --store"},
      {{"--store=127.0.0.1:1", "--chunks_s3_endpoint=http://127.0.0.1:1", "--chunks_s3_bucket=b"},
       "--chunks_s3_* flags go with --store_dir"},
      {{store_dir, "--chunks_s3_bucket=b"}, "--chunks_s3_bucket needs --chunks_s3_endpoint"},
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
