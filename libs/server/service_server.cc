#include "libs/server/service_server.h"

#include <utility>

#include "libs/status/status_macros.h"
#include "proto/ckpt/v1/identity.grpc.pb.h"

namespace ckpt {

ServiceServer::ServiceServer(std::shared_ptr<const AccessPolicy> access,
                             absl::string_view served_by)
    : identity_(std::move(access), std::string(served_by)) {}

absl::StatusOr<std::unique_ptr<ServiceServer>> ServiceServer::Start(
    const GrpcServerOptions& options, grpc::Service* service, absl::string_view service_name,
    std::shared_ptr<const AccessPolicy> access, absl::string_view served_by) {
  std::unique_ptr<ServiceServer> serving(new ServiceServer(std::move(access), served_by));
  ASSIGN_OR_RETURN(serving->server_,
                   GrpcServer::Start(options, {{service, std::string(service_name)},
                                               {&serving->identity_,
                                                v1::Identity::service_full_name()}}));
  return serving;
}

}  // namespace ckpt
