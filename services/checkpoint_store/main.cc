// checkpoint_store: serves a RocksDB checkpoint store over gRPC (ckpt.v1.CheckpointStore plus
// grpc.health.v1.Health and reflection), in plaintext or over TLS / mutual TLS, with named
// identities and roles (--identities_file).
//
//   bazel run //services/checkpoint_store -- --db_path=/data/ckpt --listen=127.0.0.1:50051
//
// Prints "checkpoint store serving DB on ADDRESS" once serving (and, with --port_file, writes the
// port there first). SIGINT / SIGTERM shut down gracefully: health turns NOT_SERVING, new calls
// are refused, in-flight calls get --shutdown_grace to finish and are then cancelled (an upload
// that did not commit by then leaves nothing visible; a store operation already running, such as
// a commit or a verify, completes first, since the store cannot interrupt it); exit status 0. Bad
// flags exit 2, a store or address that cannot be opened exits 1.

#include <signal.h>

#include <cerrno>
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
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/io/atomic_file.h"
#include "libs/rpc/grpc_server.h"
#include "libs/rpc/server_main.h"
#include "libs/rpc/server_security.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_chunk_backend.h"
#include "services/checkpoint_store/store_service.h"

ABSL_FLAG(std::string, db_path, "",
          "Directory of the store's RocksDB database; created if it does not exist. Required.");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "HOST:PORT to serve on. Port 0 picks a free port (see --port_file). Default "
          "127.0.0.1:0: loopback only; serving other machines (0.0.0.0:PORT) is an explicit "
          "choice.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the port actually bound is written to this file (decimal, one line), "
          "atomically, once the server is serving, for scripts that start it on port 0. "
          "Default: none.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding one bearer token every call must present as metadata 'authorization: "
          "Bearer <token>' (surrounding whitespace is ignored; health checks and reflection stay "
          "open); its holder may do anything. For named identities with roles use "
          "--identities_file instead. Default: none.");
ABSL_FLAG(std::string, identities_file, "",
          "JSON file of named identities, each with a role (reader, writer, admin), optional "
          "model-name patterns, and a token_sha256 or a client certificate name "
          "(libs/rpc/access_policy.h; README 'Serving the store to other teams'). Re-read when it "
          "changes. Default: none (every caller is admitted).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of this server: serve TLS (with --tls_key_file). Re-read when "
          "it changes. Default: plaintext, with a warning at start-up on any address other than "
          "loopback.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: require every client to present a certificate signed by it (mutual "
          "TLS); its SAN or CN is the caller's identity. Default: no client certificates.");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "How often the TLS files are checked for a rotated certificate. Default 60s.");
ABSL_FLAG(int, max_message_bytes, 16 << 20,
          "Largest gRPC message received or sent, in bytes. Tensor bytes move in pieces of at "
          "most 1 MiB, so this bounds manifests and listings; at least 1114112 (1 MiB + 64 KiB). "
          "Default 16777216 (16 MiB).");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "On SIGINT / SIGTERM, how long in-flight calls may run before they are cancelled; an "
          "upload not committed by then leaves nothing visible. A duration such as 10s or 500ms. "
          "Default 10s.");
ABSL_FLAG(absl::Duration, abandoned_upload_grace, absl::Hours(1),
          "Garbage collection leaves the chunks of an upload abandoned less than this long ago, "
          "so a client that reconnects can reuse them; uploads in progress are never collected. "
          "A duration such as 1h or 90m. Default 1h.");
ABSL_FLAG(int, worker_threads, 8,
          "Threads that run store work (RocksDB reads and writes, hashing, fsync) off gRPC's "
          "threads; calls beyond this many wait in a queue. Default 8.");
ABSL_FLAG(int, max_watches, 1000,
          "Watch streams (serving fleets following an alias) served at once, each holding a "
          "thread; more are refused with RESOURCE_EXHAUSTED. Default 1000.");
ABSL_FLAG(absl::Duration, watch_write_timeout, absl::Seconds(30),
          "A watcher that has not taken a message for this long (it stopped reading) is cut "
          "off; it may resume from its last resume token. Default 30s.");
ABSL_FLAG(std::string, chunks_s3_endpoint, "",
          "Keep chunk bytes in an S3-compatible object store at this endpoint "
          "(http://HOST:PORT or https://HOST[:PORT]; path-style, e.g. radosgw, MinIO, AWS) "
          "instead of pack files under --db_path. RocksDB in --db_path stays the index "
          "(versions, refcounts, where each chunk lies): keep it as safe as the bucket, and open "
          "the store with the same --chunks_s3_* flags every time. Each commit uploads one pack "
          "object (multipart in 8 MiB parts) and is acknowledged only once it is in the bucket. "
          "Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the environment, "
          "or --chunks_s3_credentials_file; never from a flag value. Default: unset (pack "
          "files).");
ABSL_FLAG(std::string, chunks_s3_bucket, "",
          "With --chunks_s3_endpoint: the bucket (it must exist). Required then.");
ABSL_FLAG(std::string, chunks_s3_prefix, "",
          "With --chunks_s3_endpoint: a key prefix ending in '/' (e.g. team-a/), so one bucket "
          "can hold several stores; objects are PREFIXpacks/<16 hex>.pack. One prefix serves one "
          "store: garbage collection deletes pack objects under it that this store does not "
          "name. Default: empty.");
ABSL_FLAG(std::string, chunks_s3_region, "us-east-1",
          "With --chunks_s3_endpoint: the region in the SigV4 signature (radosgw: its "
          "zonegroup, usually 'default', though it accepts any). Default us-east-1.");
ABSL_FLAG(std::string, chunks_s3_credentials_file, "",
          "With --chunks_s3_endpoint: a file in AWS's shared-credentials format "
          "(aws_access_key_id = ... / aws_secret_access_key = ...) to read the key from instead "
          "of the environment. Default: the environment.");
ABSL_FLAG(std::string, chunks_s3_ca_file, "",
          "With an https --chunks_s3_endpoint: PEM CA certificates to trust instead of the "
          "system's. Default: the system's.");
ABSL_FLAG(int64_t, watch_max_lag, 10000,
          "A watcher held up by flow control and more than this many history events behind "
          "ends with RESOURCE_EXHAUSTED naming its resume token. Default 10000.");

namespace ckpt {
namespace {

constexpr int kExitBadFlags = 2;
constexpr int kExitFailure = 1;
constexpr int kMinMaxMessageBytes = kMaxTensorDataBytes + (64 << 10);

struct ServerConfig {
  StoreOptions store;
  S3ChunkStorageConfig chunks_s3;  // endpoint empty: pack files.
  StoreServiceOptions service;
  GrpcServerOptions server;
  std::string port_file;
  absl::Duration shutdown_grace;
};

absl::StatusOr<ServerConfig> ConfigFromFlags(const std::vector<char*>& positional) {
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "'; every setting is a --flag"));
  }
  ServerConfig config;
  config.store.db_path = absl::GetFlag(FLAGS_db_path);
  if (config.store.db_path.empty()) {
    return absl::InvalidArgumentError("--db_path is required: the store's database directory");
  }
  config.store.abandoned_upload_grace = absl::GetFlag(FLAGS_abandoned_upload_grace);
  if (config.store.abandoned_upload_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--abandoned_upload_grace must not be negative");
  }
  config.chunks_s3.endpoint = absl::GetFlag(FLAGS_chunks_s3_endpoint);
  config.chunks_s3.bucket = absl::GetFlag(FLAGS_chunks_s3_bucket);
  config.chunks_s3.prefix = absl::GetFlag(FLAGS_chunks_s3_prefix);
  config.chunks_s3.region = absl::GetFlag(FLAGS_chunks_s3_region);
  config.chunks_s3.ca_file = absl::GetFlag(FLAGS_chunks_s3_ca_file);
  if (!config.chunks_s3.endpoint.empty()) {
    if (config.chunks_s3.bucket.empty()) {
      return absl::InvalidArgumentError("--chunks_s3_endpoint needs --chunks_s3_bucket");
    }
    absl::Status credentials =
        LoadS3Credentials(absl::GetFlag(FLAGS_chunks_s3_credentials_file), config.chunks_s3);
    if (!credentials.ok()) return credentials;
  } else if (!config.chunks_s3.bucket.empty() || !config.chunks_s3.prefix.empty()) {
    return absl::InvalidArgumentError(
        "--chunks_s3_bucket / --chunks_s3_prefix need --chunks_s3_endpoint");
  }
  config.server.listen_address = absl::GetFlag(FLAGS_listen);
  config.server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (config.server.max_message_bytes < kMinMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes=", config.server.max_message_bytes,
        " is too small: a TensorData message carries up to 1 MiB of tensor bytes; use at least ",
        kMinMaxMessageBytes));
  }
  config.service.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  if (config.service.worker_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_threads must be at least 1, got ", config.service.worker_threads));
  }
  config.service.max_watches = absl::GetFlag(FLAGS_max_watches);
  config.service.watch_write_timeout = absl::GetFlag(FLAGS_watch_write_timeout);
  config.service.watch_max_lag = absl::GetFlag(FLAGS_watch_max_lag);
  if (config.service.max_watches < 1 ||
      config.service.watch_write_timeout <= absl::ZeroDuration() ||
      config.service.watch_max_lag < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_watches must be >= 1 (got ", config.service.max_watches,
                     "), --watch_write_timeout > 0 (got ",
                     absl::FormatDuration(config.service.watch_write_timeout),
                     ") and --watch_max_lag >= 1 (got ", config.service.watch_max_lag, ")"));
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
  return config;
}

int Serve(ServerConfig config, const sigset_t& stop_signals) {
  // Here rather than in ConfigFromFlags: it reaches the network (the bucket is listed once).
  absl::StatusOr<std::shared_ptr<ChunkBackend>> chunks = OpenS3ChunkStorage(config.chunks_s3);
  if (!chunks.ok()) {
    std::cerr << "checkpoint_store: chunk storage: " << chunks.status() << "\n";
    return kExitFailure;
  }
  config.store.chunk_backend = *std::move(chunks);
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(config.store);
  if (!store.ok()) {
    std::cerr << "checkpoint_store: cannot open the store at " << config.store.db_path << ": "
              << store.status() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<std::unique_ptr<StoreService>> service =
      StoreService::Create(store->get(), config.service);
  if (!service.ok()) {
    std::cerr << "checkpoint_store: " << service.status() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(
      config.server, {{service->get(), v1::CheckpointStore::service_full_name()}});
  if (!server.ok()) {
    std::cerr << "checkpoint_store: " << server.status() << "\n";
    return kExitFailure;
  }
  if (!config.port_file.empty()) {
    absl::Status written =
        WriteFileAtomically(config.port_file, absl::StrCat((*server)->port(), "\n"));
    if (!written.ok()) {
      std::cerr << "checkpoint_store: writing --port_file: " << written << "\n";
      (*server)->Shutdown(absl::ZeroDuration());
      (*server)->Wait();
      return kExitFailure;
    }
  }
  std::cout << "checkpoint store serving " << config.store.db_path << " on " << (*server)->address()
            << std::endl;

  WaitForStopSignal(stop_signals, "checkpoint_store", config.shutdown_grace);
  (*service)->EndWatches();  // watches never end on their own; the grace is for other calls.
  (*server)->Shutdown(config.shutdown_grace);
  (*server)->Wait();
  server->reset();
  service->reset();  // Waits for the last call, joins its threads.
  store->reset();
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves a ckpt checkpoint store over gRPC.\n"
      "  checkpoint_store --db_path=DIR [--listen=127.0.0.1:0] [--port_file=FILE]\n"
      "                   [--tls_cert_file=PEM --tls_key_file=PEM [--tls_client_ca_file=PEM]]\n"
      "                   [--identities_file=JSON | --auth_token_file=FILE] "
      "[--shutdown_grace=10s]");
  ckpt::SetHelpFlagsFile("services/checkpoint_store/main.cc");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  absl::StatusOr<ckpt::ServerConfig> config = ckpt::ConfigFromFlags(positional);
  if (!config.ok()) {
    std::cerr << "checkpoint_store: " << config.status().message() << " (see --help)\n";
    return ckpt::kExitBadFlags;
  }
  const sigset_t stop_signals = ckpt::BlockStopSignals();
  return ckpt::Serve(*config, stop_signals);
}
