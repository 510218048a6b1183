// loader: serves stored checkpoint versions to consumers in their own shape (ckpt.v1.Loader plus
// grpc.health.v1.Health and reflection): subset, key layout, dtype, and file format (torch .pt,
// safetensors); in plaintext or TLS / mutual TLS, with named identities (--identities_file).
//
//   bazel run //services/loader -- --store_dir=/data/ckpt --listen=127.0.0.1:50052
//   bazel run //services/loader -- --store=store-host:50051 --cache_bytes=4294967296
//
// Prints "loader serving STORE on ADDRESS" once serving (with --port_file, the port is written
// there first). SIGINT / SIGTERM shut down gracefully: health turns NOT_SERVING, new calls are
// refused, in-flight calls get --shutdown_grace, then are cancelled; the chunk cache's counters
// are logged ("loader cache: hits=... misses=..."), exit status 0. Bad flags exit 2; a store or
// address that cannot be opened exits 1.

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/client/open_store.h"
#include "libs/io/atomic_file.h"
#include "libs/loader/shm_server.h"
#include "libs/rpc/bearer_auth.h"
#include "libs/rpc/grpc_server.h"
#include "libs/rpc/server_main.h"
#include "libs/rpc/server_security.h"
#include "services/loader/loader_service.h"

ABSL_FLAG(std::string, store, "",
          "HOST:PORT of a checkpoint_store server to read versions from. Exactly one of --store "
          "and --store_dir is required.");
ABSL_FLAG(std::string, store_dir, "",
          "Directory of a RocksDB checkpoint store to open in this process (embedded; no other "
          "process may have it open). Exactly one of --store and --store_dir is required.");
ABSL_FLAG(std::string, store_auth_token_file, "",
          "With --store: file holding the bearer token for the checkpoint store. Default: none.");
ABSL_FLAG(std::string, store_tls_ca_file, "",
          "With --store: PEM CA that signed the store server's certificate; turns TLS on. "
          "Default: plaintext.");
ABSL_FLAG(std::string, store_tls_cert_file, "",
          "With --store_tls_ca_file: PEM certificate this loader presents to the store (mutual "
          "TLS), with --store_tls_key_file.");
ABSL_FLAG(std::string, store_tls_key_file, "", "PEM private key of --store_tls_cert_file.");
ABSL_FLAG(std::string, store_tls_server_name, "",
          "Name the store's certificate must carry when it differs from --store's host.");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "HOST:PORT to serve on. Port 0 picks a free port (see --port_file). Default "
          "127.0.0.1:0: loopback only.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the port actually bound is written to this file (decimal, one line), "
          "atomically, once the server is serving. Default: none.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding one bearer token every call must present as metadata 'authorization: "
          "Bearer <token>' (surrounding whitespace ignored; health checks and reflection stay "
          "open). For named identities with roles use --identities_file instead. Default: none.");
ABSL_FLAG(std::string, identities_file, "",
          "JSON file of named identities with roles and optional model scopes, by token hash or "
          "client certificate (libs/rpc/access_policy.h); the loader's calls need the reader "
          "role. Re-read when it changes. Default: none (every caller is admitted).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of this server: serve TLS (with --tls_key_file). Re-read when "
          "it changes. Default: plaintext (warned about on any address but loopback).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: require client certificates signed by it (mutual TLS).");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "How often the TLS files are checked for a rotated certificate. Default 60s.");
ABSL_FLAG(int64_t, cache_bytes, int64_t{1} << 30,
          "Bytes of store chunks kept in memory, shared by every reader (LRU, content-addressed: "
          "concurrent readers of one version share one copy). 0 disables caching. Default "
          "1073741824 (1 GiB).");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "Load and Export streams served at once; more fail with RESOURCE_EXHAUSTED. Default 64.");
ABSL_FLAG(int, max_message_bytes, 16 << 20,
          "Largest gRPC message received or sent, in bytes; at least 1114112 (tensor bytes move "
          "in 1 MiB pieces). Default 16777216 (16 MiB).");
ABSL_FLAG(std::string, shm_socket, "",
          "Also serve Loads to consumers on this host over a Unix-domain socket at this path "
          "(at most 107 bytes; e.g. DIR/loader.sock beside the store): tensors are handed over as "
          "read-only file descriptors to map -- the store's pack files, or a sealed memfd of cast "
          "tensors -- not as bytes over gRPC. Clients: OpenLoaderClient / SharedMemoryLoader "
          "(libs/client/shm_loader.h), which fall back to gRPC where the socket is missing. "
          "Peers are admitted by their uid as the kernel reports it (SO_PEERCRED): this loader's "
          "own uid and --shm_allowed_uids, each a reader of every model (bearer tokens and "
          "--identities_file apply to gRPC only). Empty (default): off.");
ABSL_FLAG(std::string, shm_socket_mode, "0600",
          "Octal mode of the --shm_socket file: 0600 lets only this uid connect, 0660 its group "
          "too (whose uids must still be in --shm_allowed_uids). Default 0600.");
ABSL_FLAG(std::vector<std::string>, shm_allowed_uids, {},
          "Comma-separated uids admitted on --shm_socket besides this loader's own. They get "
          "copies of exactly the tensors they load, never the store's pack files (which may "
          "hold other models' bytes). Default: none.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "On SIGINT / SIGTERM, how long in-flight calls may run before they are cancelled. A "
          "duration such as 10s or 500ms. Default 10s.");

namespace ckpt {
namespace {

constexpr int kExitBadFlags = 2;
constexpr int kExitFailure = 1;
constexpr int kMinMaxMessageBytes = kMaxLoaderPieceBytes + (64 << 10);

struct ServerConfig {
  std::string store_address;
  std::string store_auth_token;
  ClientTlsOptions store_tls;
  std::string store_dir;
  LoaderServiceOptions service;
  GrpcServerOptions server;
  std::string port_file;
  absl::Duration shutdown_grace;
  ShmServerOptions shm;  // socket_path empty: no shared-memory socket.
};

absl::StatusOr<ServerConfig> ConfigFromFlags(const std::vector<char*>& positional) {
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "'; every setting is a --flag"));
  }
  ServerConfig config;
  config.store_address = absl::GetFlag(FLAGS_store);
  config.store_dir = absl::GetFlag(FLAGS_store_dir);
  if (config.store_address.empty() == config.store_dir.empty()) {
    return absl::InvalidArgumentError(
        "exactly one of --store=HOST:PORT (a checkpoint_store server) and --store_dir=DIR (an "
        "embedded store) is required");
  }
  const std::string store_token_file = absl::GetFlag(FLAGS_store_auth_token_file);
  if (!store_token_file.empty()) {
    if (config.store_address.empty()) {
      return absl::InvalidArgumentError("--store_auth_token_file needs --store");
    }
    absl::StatusOr<std::string> token =
        ReadAuthTokenFile(store_token_file, "--store_auth_token_file");
    if (!token.ok()) return token.status();
    config.store_auth_token = *std::move(token);
  }
  config.store_tls.ca_file = absl::GetFlag(FLAGS_store_tls_ca_file);
  config.store_tls.cert_file = absl::GetFlag(FLAGS_store_tls_cert_file);
  config.store_tls.key_file = absl::GetFlag(FLAGS_store_tls_key_file);
  config.store_tls.server_name = absl::GetFlag(FLAGS_store_tls_server_name);
  if (config.store_address.empty() &&
      !(config.store_tls.ca_file.empty() && config.store_tls.cert_file.empty())) {
    return absl::InvalidArgumentError("--store_tls_* flags need --store");
  }
  config.server.listen_address = absl::GetFlag(FLAGS_listen);
  config.server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (config.server.max_message_bytes < kMinMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", config.server.max_message_bytes,
                     " is too small; use at least ", kMinMaxMessageBytes));
  }
  config.service.cache_bytes = absl::GetFlag(FLAGS_cache_bytes);
  if (config.service.cache_bytes < 0) {
    return absl::InvalidArgumentError("--cache_bytes must not be negative");
  }
  config.service.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  if (config.service.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError("--max_concurrent_streams must be at least 1");
  }
  ServerSecurityFlags security_flags;
  security_flags.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  security_flags.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  security_flags.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  security_flags.tls_reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  security_flags.identities_file = absl::GetFlag(FLAGS_identities_file);
  security_flags.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  absl::StatusOr<ServerSecurity> security = LoadServerSecurity(security_flags);
  if (!security.ok()) return security.status();
  config.server.tls = security->tls;
  config.service.access = security->access;
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (config.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown_grace must not be negative");
  }
  config.shm.socket_path = absl::GetFlag(FLAGS_shm_socket);
  const std::string mode = absl::GetFlag(FLAGS_shm_socket_mode);
  char* mode_end = nullptr;
  const long parsed_mode = std::strtol(mode.c_str(), &mode_end, 8);
  if (mode.empty() || *mode_end != '\0' || parsed_mode < 0 || parsed_mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shm_socket_mode=", mode, " is not an octal file mode such as 0600"));
  }
  config.shm.socket_mode = static_cast<mode_t>(parsed_mode);
  for (const std::string& uid : absl::GetFlag(FLAGS_shm_allowed_uids)) {
    uint32_t parsed_uid = 0;
    if (!absl::SimpleAtoi(uid, &parsed_uid)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shm_allowed_uids: '", uid, "' is not a numeric uid"));
    }
    config.shm.allowed_uids.push_back(static_cast<uid_t>(parsed_uid));
  }
  if (config.shm.socket_path.empty() && !config.shm.allowed_uids.empty()) {
    return absl::InvalidArgumentError("--shm_allowed_uids needs --shm_socket");
  }
  return config;
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenStore(const ServerConfig& config) {
  StoreLocation location;
  location.address = config.store_address;
  location.auth_token = config.store_auth_token;
  location.tls = config.store_tls;
  location.directory = config.store_dir;
  return OpenCheckpointStore(location);
}

int Serve(const ServerConfig& config, const sigset_t& stop_signals) {
  const std::string store_name = config.store_dir.empty() ? config.store_address : config.store_dir;
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenStore(config);
  if (!store.ok()) {
    std::cerr << "loader: cannot open the store " << store_name << ": " << store.status() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<std::unique_ptr<LoaderService>> service =
      LoaderService::Create(store->get(), config.service);
  if (!service.ok()) {
    std::cerr << "loader: " << service.status() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(config.server, {{service->get(), v1::Loader::service_full_name()}});
  if (!server.ok()) {
    std::cerr << "loader: " << server.status() << "\n";
    return kExitFailure;
  }
  if (!config.port_file.empty()) {
    absl::Status written =
        WriteFileAtomically(config.port_file, absl::StrCat((*server)->port(), "\n"));
    if (!written.ok()) {
      std::cerr << "loader: writing --port_file: " << written << "\n";
      (*server)->Shutdown(absl::ZeroDuration());
      (*server)->Wait();
      return kExitFailure;
    }
  }
  std::unique_ptr<ShmLoaderServer> shm;
  if (!config.shm.socket_path.empty()) {
    absl::StatusOr<std::unique_ptr<ShmLoaderServer>> started =
        ShmLoaderServer::Start(store->get(), config.shm);
    if (!started.ok()) {
      std::cerr << "loader: --shm_socket: " << started.status() << "\n";
      (*server)->Shutdown(absl::ZeroDuration());
      (*server)->Wait();
      return kExitFailure;
    }
    shm = *std::move(started);
  }
  std::cout << "loader serving " << store_name << " on " << (*server)->address()
            << (shm != nullptr ? absl::StrCat(" and ", shm->socket_path()) : "") << std::endl;

  WaitForStopSignal(stop_signals, "loader", config.shutdown_grace);
  if (shm != nullptr) shm->Shutdown();
  (*server)->Shutdown(config.shutdown_grace);
  (*server)->Wait();
  server->reset();
  shm.reset();
  std::cerr << "loader cache: " << (*service)->cache_stats().ToString() << std::endl;
  service->reset();
  store->reset();
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves stored ckpt versions adapted to each consumer (ckpt.v1.Loader).\n"
      "  loader (--store=HOST:PORT | --store_dir=DIR) [--listen=127.0.0.1:0] [--port_file=FILE]\n"
      "         [--store_tls_ca_file=PEM [--store_tls_cert_file=PEM --store_tls_key_file=PEM]]\n"
      "         [--tls_cert_file=PEM --tls_key_file=PEM [--tls_client_ca_file=PEM]]\n"
      "         [--identities_file=JSON | --auth_token_file=FILE] [--cache_bytes=1073741824]\n"
      "         [--shm_socket=PATH [--shm_socket_mode=0600] [--shm_allowed_uids=UID,...]]\n"
      "         [--shutdown_grace=10s]");
  ckpt::SetHelpFlagsFile("services/loader/main.cc");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  absl::StatusOr<ckpt::ServerConfig> config = ckpt::ConfigFromFlags(positional);
  if (!config.ok()) {
    std::cerr << "loader: " << config.status().message() << " (see --help)\n";
    return ckpt::kExitBadFlags;
  }
  const sigset_t stop_signals = ckpt::BlockStopSignals();
  return ckpt::Serve(*config, stop_signals);
}
