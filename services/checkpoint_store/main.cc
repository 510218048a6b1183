// checkpoint_store: serves a RocksDB checkpoint store over gRPC (ckpt.v1.CheckpointStore plus
// grpc.health.v1.Health and reflection), in plaintext or over TLS / mutual TLS, with named
// identities and roles (--identities_file).
//
//   bazel run //services/checkpoint_store -- --store_dir=/data/ckpt --listen=127.0.0.1:50051
//
// Prints "checkpoint store serving DB on ADDRESS" once serving (and, with --port_file, writes the
// port there first). SIGINT / SIGTERM shut down gracefully: health turns NOT_SERVING, new calls
// are refused, in-flight calls get --shutdown_grace to finish and are then cancelled (an upload
// that did not commit by then leaves nothing visible; a store operation already running, such as
// a commit or a verify, completes first, since the store cannot interrupt it); exit status 0. Bad
// flags exit 2, a store or address that cannot be opened exits 1.

#include <signal.h>

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
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libs/ha/etcd_client.h"
#include "libs/ha/store_failover.h"
#include "libs/rpc/grpc_server.h"
#include "libs/server/server_main.h"
#include "libs/server/server_security.h"
#include "libs/server/service_server.h"
#include "libs/server/service_flags.h"
#include "libs/status/status_macros.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/s3_chunk_backend.h"
#include "services/checkpoint_store/store_service.h"

ABSL_FLAG(std::string, store_dir, "",
          "Directory of the store's RocksDB database (and its pack files); created if it does "
          "not exist. Required.");
ABSL_FLAG(std::string, db_path, "",
          "Deprecated spelling of --store_dir (every other ckpt binary says --store_dir); "
          "accepted, with a warning, until the next release.");
CKPT_DEFINE_LISTEN_FLAGS(, "127.0.0.1:0");
CKPT_DEFINE_SERVER_SECURITY_FLAGS();
CKPT_DEFINE_SHUTDOWN_GRACE_FLAG();
CKPT_DEFINE_S3_CHUNK_FLAGS();
ABSL_FLAG(int, max_message_bytes, 16 << 20,
          "Largest gRPC message received or sent, in bytes. Tensor bytes move in pieces of at "
          "most 1 MiB, so this bounds manifests and listings; at least 1114112 (1 MiB + 64 KiB). "
          "Default 16777216 (16 MiB).");
ABSL_FLAG(absl::Duration, abandoned_upload_grace, absl::Hours(1),
          "Garbage collection leaves the chunks of an upload abandoned less than this long ago, "
          "so a client that reconnects can reuse them; uploads in progress are never collected. "
          "A duration such as 1h or 90m. Default 1h.");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "Run as one of several stores sharing one bucket (--chunks_s3_*): comma-separated etcd "
          "URLs (http://HOST:PORT, or https:// with --etcd_*_file). The store that holds the "
          "writer's lease in etcd takes changes; the others follow the bucket's change log, answer reads, and refuse changes "
          "with UNAVAILABLE naming the writer, and their health reports ckpt.v1.CheckpointStore "
          "NOT_SERVING, so clients given every store's address (--store=A,B) reach the writer. "
          "Empty (the default): this store is the only writer.");
ABSL_FLAG(std::string, etcd_ca_file, "",
          "With https:// --etcd_endpoints: the PEM CA that signed the etcd members' "
          "certificates. Default: the system's CAs.");
ABSL_FLAG(std::string, etcd_cert_file, "",
          "With https:// --etcd_endpoints: this store's PEM client certificate (with "
          "--etcd_key_file), for an etcd cluster started with --client-cert-auth, so only "
          "stores holding such a certificate can take the writer's lease.");
ABSL_FLAG(std::string, etcd_key_file, "", "The private key of --etcd_cert_file (PEM).");
ABSL_FLAG(std::string, advertise_address, "",
          "With --etcd_endpoints: this store's address as clients reach it, named to them when "
          "it is the writer. Default: the address it listens on.");
ABSL_FLAG(std::string, writer_key, "",
          "With --etcd_endpoints: the etcd key that names the writer. Default "
          "/ckpt/writer/BUCKET/PREFIX, one per change log.");
ABSL_FLAG(absl::Duration, writer_lease_ttl, absl::Seconds(2),
          "With --etcd_endpoints: the writer's lease. A dead writer's successor takes over about "
          "this long after it died; a writer that cannot renew it within this long steps down. "
          "Default 2s.");
ABSL_FLAG(absl::Duration, follow_interval, absl::Milliseconds(100),
          "With --etcd_endpoints: how often a follower applies the writer's new changes and "
          "tries for the lease. Default 100ms.");
ABSL_FLAG(int64_t, change_log_snapshot_every, 10000,
          "Every this many changes the writer puts a snapshot of its whole index beside the "
          "change log (in the background; the two newest are kept), so that a store started on "
          "an empty directory loads it and replays only the changes after it. 0: never. Default "
          "10000.");
ABSL_FLAG(int, worker_threads, 8,
          "Threads that run store work (RocksDB reads and writes, hashing, fsync) off gRPC's "
          "threads; calls beyond this many wait in a queue. Default 8.");
ABSL_FLAG(int, max_watches, 1000,
          "Watch streams (serving fleets following an alias) served at once, each holding a "
          "thread; more are refused with RESOURCE_EXHAUSTED. Default 1000.");
ABSL_FLAG(absl::Duration, watch_write_timeout, absl::Seconds(30),
          "A watcher that has not taken a message for this long (it stopped reading) is cut "
          "off; it may resume from its last resume token. Default 30s.");
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
  // --etcd_endpoints (and its TLS files): several stores on one bucket, one of them the writer.
  ha::EtcdClientOptions etcd;
  ha::StoreFailoverOptions failover;
};

absl::StatusOr<ServerConfig> ConfigFromFlags(const std::vector<char*>& positional) {
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "'; every setting is a --flag"));
  }
  ServerConfig config;
  config.store.db_path = absl::GetFlag(FLAGS_store_dir);
  if (const std::string old_spelling = absl::GetFlag(FLAGS_db_path); !old_spelling.empty()) {
    if (!config.store.db_path.empty()) {
      return absl::InvalidArgumentError(
          "--db_path is the old spelling of --store_dir: give only --store_dir");
    }
    std::cerr << "checkpoint_store: --db_path is deprecated; use --store_dir (the same flag)\n";
    config.store.db_path = old_spelling;
  }
  if (config.store.db_path.empty()) {
    return absl::InvalidArgumentError("--store_dir is required: the store's database directory");
  }
  config.store.abandoned_upload_grace = absl::GetFlag(FLAGS_abandoned_upload_grace);
  if (config.store.abandoned_upload_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--abandoned_upload_grace must not be negative");
  }
  ASSIGN_OR_RETURN(config.chunks_s3, S3ChunkStorageFromFlags(CKPT_S3_CHUNK_FROM_FLAGS()));
  config.server.listen_address = absl::GetFlag(FLAGS_listen);
  config.server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (config.server.max_message_bytes < kMinMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes=", config.server.max_message_bytes,
        " is too small: a TensorData message carries up to 1 MiB of tensor bytes; use at least ",
        kMinMaxMessageBytes));
  }
  config.store.change_log_snapshot_every = absl::GetFlag(FLAGS_change_log_snapshot_every);
  if (config.store.change_log_snapshot_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--change_log_snapshot_every must not be negative, got ",
        config.store.change_log_snapshot_every));
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
  ASSIGN_OR_RETURN(const ServerSecurity security,
                   LoadServerSecurity(CKPT_SERVER_SECURITY_FROM_FLAGS(), "--"));
  config.server.tls = security.tls;
  config.service.access = security.access;
  config.etcd.endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  config.etcd.ca_file = absl::GetFlag(FLAGS_etcd_ca_file);
  config.etcd.cert_file = absl::GetFlag(FLAGS_etcd_cert_file);
  config.etcd.key_file = absl::GetFlag(FLAGS_etcd_key_file);
  if (!config.etcd.endpoints.empty()) {
    if (config.chunks_s3.endpoint.empty()) {
      return absl::InvalidArgumentError(
          "--etcd_endpoints needs --chunks_s3_endpoint: stores on several hosts share their "
          "change log and packs through a bucket");
    }
    config.store.start_as_follower = true;
    config.failover.address = absl::GetFlag(FLAGS_advertise_address);
    config.failover.key = absl::GetFlag(FLAGS_writer_key);
    if (config.failover.key.empty()) {
      config.failover.key =
          absl::StrCat("/ckpt/writer/", config.chunks_s3.bucket, "/", config.chunks_s3.prefix);
    }
    config.failover.lease_ttl = absl::GetFlag(FLAGS_writer_lease_ttl);
    config.failover.follow_interval = absl::GetFlag(FLAGS_follow_interval);
    if (config.failover.lease_ttl < absl::Seconds(1) ||
        config.failover.follow_interval <= absl::ZeroDuration() ||
        config.failover.follow_interval >= config.failover.lease_ttl) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--writer_lease_ttl must be >= 1s and --follow_interval > 0 and shorter than it (got ",
          absl::FormatDuration(config.failover.lease_ttl), " and ",
          absl::FormatDuration(config.failover.follow_interval), ")"));
    }
  } else if (!absl::GetFlag(FLAGS_advertise_address).empty() ||
             !absl::GetFlag(FLAGS_writer_key).empty() || !config.etcd.ca_file.empty() ||
             !config.etcd.cert_file.empty() || !config.etcd.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--advertise_address, --writer_key and --etcd_*_file need --etcd_endpoints");
  }
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
  // Who a caller is and what it may do, by the same policy (the console's page asks it).
  absl::StatusOr<std::unique_ptr<ServiceServer>> serving =
      ServiceServer::Start(config.server, service->get(), v1::CheckpointStore::service_full_name(),
                           config.service.access, "checkpoint store");
  if (!serving.ok()) {
    std::cerr << "checkpoint_store: " << serving.status() << "\n";
    return kExitFailure;
  }
  GrpcServer& server = (*serving)->server();
  std::unique_ptr<ha::StoreFailover> failover;
  if (!config.etcd.endpoints.empty()) {
    // A follower until the lease says otherwise: clients balancing over every store's address
    // skip it (its health says NOT_SERVING for the store service).
    GrpcServer* const grpc_server = &server;
    grpc_server->SetServing(v1::CheckpointStore::service_full_name(), false);
    absl::StatusOr<ha::EtcdClient> etcd = ha::EtcdClient::Create(config.etcd);
    if (!etcd.ok()) {
      std::cerr << "checkpoint_store: --etcd_endpoints: " << etcd.status() << "\n";
      return kExitFailure;
    }
    if (config.failover.address.empty()) config.failover.address = grpc_server->address();
    config.failover.on_role = [grpc_server](bool writer, const std::string& writer_address) {
      grpc_server->SetServing(v1::CheckpointStore::service_full_name(), writer);
      std::cerr << "checkpoint_store: "
                << (writer ? std::string("the writer")
                           : absl::StrCat("a follower (the writer: ",
                                          writer_address.empty() ? "none yet" : writer_address,
                                          ")"))
                << "\n";
    };
    absl::StatusOr<std::unique_ptr<ha::StoreFailover>> started =
        ha::StoreFailover::Start(**store, *std::move(etcd), config.failover);
    if (!started.ok()) {
      std::cerr << "checkpoint_store: " << started.status() << "\n";
      return kExitFailure;
    }
    failover = *std::move(started);
  }
  ServeOptions serve;
  serve.program = "checkpoint_store";
  serve.serving_line = absl::StrCat("checkpoint store serving ", config.store.db_path);
  serve.port_file = config.port_file;
  serve.grace = config.shutdown_grace;
  // Watches never end on their own; the grace is for other calls.
  serve.before_shutdown = [&service] { (*service)->EndWatches(); };
  const int exit_code = ServeUntilStopped(server, stop_signals, serve);
  failover.reset();  // a writer hands over: its lease revoked, a follower takes over at once.
  serving->reset();
  service->reset();  // Waits for the last call, joins its threads.
  store->reset();
  return exit_code;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves a ckpt checkpoint store over gRPC.\n"
      "  checkpoint_store --store_dir=DIR [--listen=127.0.0.1:0] [--port_file=FILE]\n"
      "                   [--tls_cert_file=PEM --tls_key_file=PEM [--tls_client_ca_file=PEM]]\n"
      "                   [--identities_file=JSON | --auth_token_file=FILE] "
      "[--shutdown_grace=10s]\n"
      "                   [--chunks_s3_endpoint=URL --chunks_s3_bucket=B ...]\n"
      "                   [--etcd_endpoints=URL,URL,URL [--advertise_address=HOST:PORT]\n"
      "                    [--etcd_ca_file=PEM --etcd_cert_file=PEM --etcd_key_file=PEM]]\n"
      "Every acknowledged change is first recorded in the store's change log (beside the packs,\n"
      "or in their bucket); an empty --store_dir is rebuilt from it. With --etcd_endpoints\n"
      "several stores share one bucket: one writer, the others follow and take over.");
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
