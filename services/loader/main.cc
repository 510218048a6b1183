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

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/client/open_store.h"
#include "libs/loader/shm_server.h"
#include "libs/rpc/grpc_server.h"
#include "libs/server/server_main.h"
#include "libs/server/server_security.h"
#include "libs/server/service_flags.h"
#include "libs/server/service_server.h"
#include "libs/status/status_macros.h"
#include "libs/store/s3_chunk_backend.h"
#include "services/loader/loader_service.h"

CKPT_DEFINE_STORE_CLIENT_FLAGS("");
CKPT_DEFINE_S3_CHUNK_FLAGS();
CKPT_DEFINE_LISTEN_FLAGS(, "127.0.0.1:0");
CKPT_DEFINE_SERVER_SECURITY_FLAGS();
CKPT_DEFINE_SHUTDOWN_GRACE_FLAG();
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
namespace ckpt {
namespace {

constexpr int kExitBadFlags = 2;
constexpr int kExitFailure = 1;
constexpr int kMinMaxMessageBytes = kMaxLoaderPieceBytes + (64 << 10);

struct ServerConfig {
  StoreLocation store;
  S3ChunkStorageConfig chunks_s3;  // endpoint empty: pack files (or a --store service).
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
  ASSIGN_OR_RETURN(config.store, StoreLocationFromFlags(CKPT_STORE_CLIENT_FROM_FLAGS()));
  const S3ChunkFlags s3_flags = CKPT_S3_CHUNK_FROM_FLAGS();
  if (!s3_flags.empty() && config.store.directory.empty()) {
    return absl::InvalidArgumentError(
        "--chunks_s3_* flags go with --store_dir; a --store service has its own chunk storage");
  }
  ASSIGN_OR_RETURN(config.chunks_s3, S3ChunkStorageFromFlags(s3_flags));

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
  ASSIGN_OR_RETURN(const ServerSecurity security,
                   LoadServerSecurity(CKPT_SERVER_SECURITY_FROM_FLAGS(), "--"));
  config.server.tls = security.tls;
  config.service.access = security.access;
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

int Serve(const ServerConfig& config, const sigset_t& stop_signals) {
  const std::string store_name = config.store.ToString();
  StoreLocation location = config.store;
  // Here rather than in ConfigFromFlags: it reaches the network (the bucket is listed once).
  absl::StatusOr<std::shared_ptr<ChunkBackend>> chunks = OpenS3ChunkStorage(config.chunks_s3);
  if (!chunks.ok()) {
    std::cerr << "loader: chunk storage: " << chunks.status() << "\n";
    return kExitFailure;
  }
  location.chunk_backend = *std::move(chunks);
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenCheckpointStore(location);
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
  // Who a caller is and what it may do, by the same policy (the console's page asks it).
  absl::StatusOr<std::unique_ptr<ServiceServer>> serving =
      ServiceServer::Start(config.server, service->get(), v1::Loader::service_full_name(),
                           config.service.access, "loader");
  if (!serving.ok()) {
    std::cerr << "loader: " << serving.status() << "\n";
    return kExitFailure;
  }
  GrpcServer& server = (*serving)->server();
  std::unique_ptr<ShmLoaderServer> shm;
  if (!config.shm.socket_path.empty()) {
    ShmServerOptions shm_options = config.shm;
    shm_options.cache = &(*service)->cache();  // one cache for both transports.
    absl::StatusOr<std::unique_ptr<ShmLoaderServer>> started =
        ShmLoaderServer::Start(store->get(), std::move(shm_options));
    if (!started.ok()) {
      std::cerr << "loader: --shm_socket: " << started.status() << "\n";
      server.Shutdown(absl::ZeroDuration());
      server.Wait();
      return kExitFailure;
    }
    shm = *std::move(started);
  }
  ServeOptions serve;
  serve.program = "loader";
  serve.serving_line = absl::StrCat("loader serving ", store_name);
  serve.port_file = config.port_file;
  if (shm != nullptr) serve.after_address = absl::StrCat(" and ", shm->socket_path());
  serve.grace = config.shutdown_grace;
  serve.before_shutdown = [&shm] {
    if (shm != nullptr) shm->Shutdown();
  };
  const int exit_code = ServeUntilStopped(server, stop_signals, serve);
  serving->reset();
  shm.reset();
  std::cerr << "loader cache: " << (*service)->cache_stats().ToString() << std::endl;
  service->reset();
  store->reset();
  return exit_code;
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
