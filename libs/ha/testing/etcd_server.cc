#include "libs/ha/testing/etcd_server.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/ha/etcd_client.h"

namespace ckpt::ha::testing {

namespace {
constexpr char kEtcd[] = "/usr/bin/etcd";
}  // namespace

bool EtcdServer::Available() { return ::access(kEtcd, X_OK) == 0; }

int UnusedLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

EtcdServer::EtcdServer(std::string dir, const EtcdServerTls* tls) {
  if (!Available()) return;
  if (dir.empty()) dir = ckpt::testing::TestCaseDir() + "-etcd";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (int attempt = 0; attempt < 3 && endpoint_.empty(); ++attempt) {
    const int client_port = UnusedLoopbackPort();
    const int peer_port = UnusedLoopbackPort();
    const std::string client =
        absl::StrCat(tls != nullptr ? "https" : "http", "://127.0.0.1:", client_port);
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port);
    process_ = std::make_unique<ckpt::testing::ChildProcess>(kEtcd, dir);
    std::vector<std::string> flags = {
        "--name=n1", absl::StrCat("--data-dir=", dir, "/data", attempt),
        "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
        "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
        absl::StrCat("--initial-cluster=n1=", peer), "--log-level=warn"};
    if (tls != nullptr) {
      flags.insert(flags.end(), {"--cert-file=" + tls->cert_file, "--key-file=" + tls->key_file,
                                 "--client-cert-auth", "--trusted-ca-file=" + tls->client_ca_file});
    }
    if (!process_->Start(flags)) continue;
    EtcdClientOptions options;
    options.endpoints = client;
    if (tls != nullptr) {
      options.ca_file = tls->client_ca_file;
      options.cert_file = tls->client_cert_file;
      options.key_file = tls->client_key_file;
    }
    absl::StatusOr<EtcdClient> etcd = EtcdClient::Create(options);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (etcd.ok() && absl::Now() < deadline) {
      if (etcd->Get("/ping").ok()) {
        endpoint_ = client;
        break;
      }
      if (process_->WaitForExit(absl::Milliseconds(100)).has_value()) break;  // a port race.
    }
  }
}

EtcdServer::~EtcdServer() {
  if (process_ != nullptr) {
    process_->Signal(SIGKILL);
    process_->WaitForExit(absl::Seconds(10));
  }
}

}  // namespace ckpt::ha::testing
