#ifndef CKPT_LIBS_SERVER_SERVICE_SERVER_H_
#define CKPT_LIBS_SERVER_SERVICE_SERVER_H_

// One ckpt service on its gRPC server with ckpt.v1.Identity beside it, answering from the same
// access policy, so a caller (the console's page, `ckpt whoami`) can ask any server who it is
// there and what it may do. GrpcServer adds health and reflection. The block the checkpoint
// store's and the loader's main.cc each ran for themselves.
//
// Example (a server's main.cc):
//   ASSIGN_OR_RETURN(std::unique_ptr<ServiceServer> serving,
//                    ServiceServer::Start(options, service.get(),
//                                         v1::Loader::service_full_name(), access, "loader"));
//   return ServeUntilStopped(serving->server(), stop_signals, serve);

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/impl/service_type.h"
#include "libs/auth/access_policy.h"
#include "libs/rpc/grpc_server.h"
#include "libs/rpc/identity_service.h"

namespace ckpt {

class ServiceServer {
 public:
  // Serves `service` (not owned; it must outlive the ServiceServer) as `service_name` and
  // ckpt.v1.Identity by `access` (null admits every caller, as a service without one does).
  // `served_by` names the server in refusals ("checkpoint store"). The errors of
  // GrpcServer::Start (e.g. an address that cannot be bound).
  static absl::StatusOr<std::unique_ptr<ServiceServer>> Start(
      const GrpcServerOptions& options, grpc::Service* service, absl::string_view service_name,
      std::shared_ptr<const AccessPolicy> access, absl::string_view served_by);

  GrpcServer& server() { return *server_; }

 private:
  ServiceServer(std::shared_ptr<const AccessPolicy> access, absl::string_view served_by);

  IdentityService identity_;
  // After identity_: destroyed (shut down) before the service it serves.
  std::unique_ptr<GrpcServer> server_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_SERVER_SERVICE_SERVER_H_
