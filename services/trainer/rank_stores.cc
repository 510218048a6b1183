#include "services/trainer/rank_stores.h"

#include <climits>
#include <cstdlib>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/client/open_store.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
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

  std::unique_ptr<CheckpointStore> opened;  // the embedded store, or a client.
  std::unique_ptr<StoreService> service;    // rank 0, lending the embedded store.
  std::unique_ptr<GrpcServer> server;
  std::string where;
};

// Rank 0 of an embedded store: opens it and, for other ranks, starts the server lending it.
// Returns what the others need to connect ("HOST:PORT TOKEN"; empty when alone).
absl::StatusOr<std::string> OpenEmbedded(const RankStoreOptions& options, int world_size,
                                         RankStoresImpl& stores) {
  StoreLocation location;
  location.directory = options.store_dir;
  location.create_if_missing = true;
  ASSIGN_OR_RETURN(stores.opened, OpenCheckpointStore(location));
  char resolved[PATH_MAX];
  stores.where =
      realpath(options.store_dir.c_str(), resolved) != nullptr ? resolved : options.store_dir;
  if (world_size == 1) return std::string();
  StoreServiceOptions service_options;
  service_options.auth_token = RandomToken();
  service_options.worker_threads = 2;
  ASSIGN_OR_RETURN(stores.service, StoreService::Create(stores.opened.get(), service_options));
  GrpcServerOptions server_options;
  server_options.listen_address = "0.0.0.0:0";
  ASSIGN_OR_RETURN(
      stores.server,
      GrpcServer::Start(server_options, {{stores.service.get(), "ckpt.v1.CheckpointStore"}}));
  return absl::StrCat(options.master_addr, ":", stores.server->port(), " ",
                      service_options.auth_token);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankStores>> OpenRankStores(const RankStoreOptions& options,
                                                           const ddp::ProcessGroupHandle& group) {
  auto stores = std::make_unique<RankStoresImpl>();
  StoreLocation remote;
  if (!options.store_address.empty()) {
    remote.address = options.store_address;
    remote.auth_token = options.store_auth_token;
    ASSIGN_OR_RETURN(stores->opened, OpenCheckpointStore(remote));
    stores->where = options.store_address;
    return stores;
  }
  std::string shared_address;
  if (group.rank == 0) {
    ASSIGN_OR_RETURN(shared_address, OpenEmbedded(options, group.world_size, *stores));
  }
  if (group.world_size > 1) {
    ASSIGN_OR_RETURN(
        shared_address,
        CatchTorchErrors([&] { return ddp::BroadcastString(*group.group, shared_address); },
                         absl::StatusCode::kUnavailable));
  }
  if (group.rank != 0) {
    const size_t space = shared_address.find(' ');
    remote.address = shared_address.substr(0, space);
    remote.auth_token = shared_address.substr(space + 1);
    ASSIGN_OR_RETURN(stores->opened, OpenCheckpointStore(remote));
    stores->where = options.store_dir;
  }
  return stores;
}

}  // namespace ckpt
