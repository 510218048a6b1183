#ifndef CKPT_LIBS_RPC_IDENTITY_SERVICE_H_
#define CKPT_LIBS_RPC_IDENTITY_SERVICE_H_

// IdentityService: ckpt.v1.Identity (proto/ckpt/v1/identity.proto), which tells a caller who the
// server takes it to be and which of a list of methods it may call on a model. A client that
// shows actions by the caller's rights (the console's page shows promote and rollback only to
// those who may) asks the server's own AccessPolicy, so the rules stay in one place: the answer
// is what Check would say for each of those calls.
//
// Example (a server's main.cc):
//   IdentityService identity(security.access, "checkpoint store");
//   GrpcServer::Start(options, {{&store_service, ...},
//                               {&identity, v1::Identity::service_full_name()}});

#include <memory>
#include <string>

#include "grpcpp/server_context.h"
#include "libs/auth/access_policy.h"
#include "proto/ckpt/v1/identity.grpc.pb.h"

namespace ckpt {

class IdentityService final : public v1::Identity::Service {
 public:
  // `service`: how refusals name the server ("checkpoint store"). A null `access` admits every
  // caller (AccessPolicy::Resolve), as a service without one does.
  IdentityService(std::shared_ptr<const AccessPolicy> access, std::string service)
      : access_(AccessPolicy::Resolve(std::move(access), "")), service_(std::move(service)) {}

  grpc::Status WhoAmI(grpc::ServerContext* context, const v1::WhoAmIRequest* request,
                      v1::WhoAmIResponse* response) override;

 private:
  const std::shared_ptr<const AccessPolicy> access_;
  const std::string service_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_IDENTITY_SERVICE_H_
