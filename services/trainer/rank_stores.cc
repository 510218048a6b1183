#include "services/trainer/rank_stores.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/client/open_store.h"
#include "libs/io/private_directory.h"
#include "libs/rpc/grpc_server.h"
#include "libs/server/run_certificate.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/audited_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt {
namespace {

std::string RandomToken() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(device(), absl::kZeroPad8));
  return token;
}

class RankStoresImpl final : public RankStores {
 public:
  ~RankStoresImpl() override {
    if (server != nullptr) server->Shutdown(absl::Seconds(5));
    server.reset();
    service.reset();
  }
  CheckpointStore& store() override { return *opened; }
  const std::string& location() const override { return where; }

  // Rank 0: the embedded store itself, which the service lends (and audits calls to).
  std::unique_ptr<CheckpointStore> embedded;
  // What this rank uses: rank 0's audited view of `embedded` (destroyed before it), or a client.
  std::unique_ptr<CheckpointStore> opened;
  std::unique_ptr<StoreService> service;  // rank 0, lending the embedded store.
  std::unique_ptr<GrpcServer> server;
  std::string where;
  PrivateDirectory tls_dir;  // the run certificate's files, when lent across machines.
};

// What rank 0 sends the others: "HOST:PORT TOKEN", then, when the store is served across
// machines, a newline and the run certificate's PEM (the key stays on rank 0).
struct LentStore {
  std::string address;
  std::string token;
  std::string cert_pem;

  std::string Encode() const {
    return absl::StrCat(address, " ", token, cert_pem.empty() ? "" : "\n", cert_pem);
  }
  static LentStore Decode(absl::string_view encoded) {
    LentStore lent;
    const size_t newline = encoded.find('\n');
    const absl::string_view first = encoded.substr(0, newline);
    const size_t space = first.find(' ');
    lent.address = std::string(first.substr(0, space));
    lent.token = std::string(first.substr(space + 1));
    if (newline != absl::string_view::npos) {
      lent.cert_pem = std::string(encoded.substr(newline + 1));
    }
    return lent;
  }
};

// Rank 0 of an embedded store: opens it and, for other ranks, starts the server lending it.
// Returns what the others need to connect (LentStore::Encode(); empty when alone).
absl::StatusOr<std::string> OpenEmbedded(const RankStoreOptions& options, int world_size,
                                         RankStoresImpl& stores) {
  StoreOptions store_options;
  store_options.db_path = options.store_dir;
  store_options.create_if_missing = true;
  ASSIGN_OR_RETURN(stores.embedded, RocksDbCheckpointStore::Open(store_options));
  // Rank 0's own commits are audited as the trainer process; the other ranks' go through the
  // service, which audits them as its callers. (OpenCheckpointStore's audited view would record
  // the service's calls twice.)
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  stores.opened = std::make_unique<AuditedStore>(
      *stores.embedded,
      AuditedStore::Actor{absl::StrCat("trainer:", ProcessUserName(), "@", host), "local"});
  char resolved[PATH_MAX];
  stores.where =
      realpath(options.store_dir.c_str(), resolved) != nullptr ? resolved : options.store_dir;
  if (world_size == 1) return std::string();
  StoreServiceOptions service_options;
  service_options.auth_token = RandomToken();
  service_options.worker_threads = 2;
  ASSIGN_OR_RETURN(stores.service, StoreService::Create(stores.embedded.get(), service_options));
  GrpcServerOptions server_options;
  // Ranks that reach rank 0 over loopback (one node) get a store that only this machine can
  // reach. Across nodes the store must listen on the network.
  const bool one_node = IsLoopbackHost(options.master_addr);
  server_options.listen_address = one_node ? "127.0.0.1:0" : "0.0.0.0:0";
  LentStore lent;
  lent.token = service_options.auth_token;
  if (!one_node) {
    // Across machines the token and the tensors must not travel in the clear: TLS with a
    // certificate made for this run, which the other ranks receive over the process group.
    ASSIGN_OR_RETURN(
        const RunCertificate run,
        MakeRunCertificate("ckpt-trainer-store", {options.master_addr}, absl::Hours(24 * 30)));
    ASSIGN_OR_RETURN(stores.tls_dir, PrivateDirectory::Create("ckpt-run-tls"));
    ASSIGN_OR_RETURN(server_options.tls.cert_file, stores.tls_dir.Write("store.pem", run.cert_pem));
    ASSIGN_OR_RETURN(server_options.tls.key_file, stores.tls_dir.Write("store.key", run.key_pem));
    lent.cert_pem = run.cert_pem;
  }
  ASSIGN_OR_RETURN(
      stores.server,
      GrpcServer::Start(server_options, {{stores.service.get(), "ckpt.v1.CheckpointStore"}}));
  lent.address = absl::StrCat(options.master_addr, ":", stores.server->port());
  std::cerr << "trainer: lending the embedded store to the other ranks on " << lent.address
            << (one_node ? " (loopback only)" : " (TLS with this run's certificate)") << "\n";
  return lent.Encode();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankStores>> OpenRankStores(const RankStoreOptions& options,
                                                           const ddp::ProcessGroupHandle& group) {
  auto stores = std::make_unique<RankStoresImpl>();
  StoreLocation remote;
  if (!options.store_address.empty()) {
    remote.address = options.store_address;
    remote.auth_token = options.store_auth_token;
    remote.tls = options.store_tls;
    ASSIGN_OR_RETURN(stores->opened, OpenCheckpointStore(remote));
    stores->where = options.store_address;
    return stores;
  }
  std::string shared_address;
  if (group.rank == 0) {
    ASSIGN_OR_RETURN(shared_address, OpenEmbedded(options, group.world_size, *stores));
  }
  if (group.world_size > 1) {
    ASSIGN_OR_RETURN(shared_address,
                     CatchTorchErrors([&] { return group.comm.BroadcastString(shared_address); },
                                      absl::StatusCode::kUnavailable));
  }
  if (group.rank != 0) {
    const LentStore lent = LentStore::Decode(shared_address);
    remote.address = lent.address;
    remote.auth_token = lent.token;
    if (!lent.cert_pem.empty()) {
      ASSIGN_OR_RETURN(stores->tls_dir, PrivateDirectory::Create("ckpt-run-tls"));
      ASSIGN_OR_RETURN(remote.tls.ca_file, stores->tls_dir.Write("store.pem", lent.cert_pem));
    }
    ASSIGN_OR_RETURN(stores->opened, OpenCheckpointStore(remote));
    stores->where = options.store_dir;
  }
  return stores;
}

}  // namespace ckpt
