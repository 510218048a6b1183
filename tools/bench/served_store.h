#ifndef CKPT_TOOLS_BENCH_SERVED_STORE_H_
#define CKPT_TOOLS_BENCH_SERVED_STORE_H_

// A store served over gRPC from this process (a StoreService on 127.0.0.1, a free port): what the
// figures that measure a client of the store service (R4, R11, M3) run against.
//
// Example:
//   ASSIGN_OR_RETURN(ServedStore served, ServeStore(*store));
//   options.address = absl::StrCat("127.0.0.1:", served.port());

#include <memory>

#include "absl/status/statusor.h"
#include "libs/rpc/grpc_server.h"
#include "libs/store/checkpoint_store.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt::bench {

struct ServedStore {
  std::unique_ptr<StoreService> service;
  std::unique_ptr<GrpcServer> server;  // declared last: shut down before the service goes.

  int port() const { return server->port(); }
};

// Serves `store`, which must outlive the result, with the service's default options.
absl::StatusOr<ServedStore> ServeStore(CheckpointStore& store);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_SERVED_STORE_H_
