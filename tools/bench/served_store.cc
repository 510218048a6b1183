#include "tools/bench/served_store.h"

#include <utility>

#include "libs/status/status_macros.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt::bench {

absl::StatusOr<ServedStore> ServeStore(CheckpointStore& store) {
  ServedStore served;
  ASSIGN_OR_RETURN(served.service, StoreService::Create(&store, StoreServiceOptions()));
  ASSIGN_OR_RETURN(
      served.server,
      GrpcServer::Start(GrpcServerOptions(),
                        {{served.service.get(), v1::CheckpointStore::service_full_name()}}));
  return served;
}

}  // namespace ckpt::bench
