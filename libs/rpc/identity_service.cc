#include "libs/rpc/identity_service.h"

#include "libs/status/grpc_status.h"

namespace ckpt {

grpc::Status IdentityService::WhoAmI(grpc::ServerContext* context, const v1::WhoAmIRequest* request,
                                     v1::WhoAmIResponse* response) {
  absl::StatusOr<Caller> caller = access_->Check(*context, service_, "WhoAmI", "");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  response->set_identity(caller->identity);
  response->set_role(std::string(RoleName(caller->role)));
  for (const std::string& pattern : caller->models) response->add_models(pattern);
  response->set_peer(caller->peer);
  for (const std::string& method : request->methods()) {
    const absl::Status allowed = AccessPolicy::Authorize(*caller, method, request->model());
    if (allowed.ok()) {
      response->add_allowed_methods(method);
    } else {
      (*response->mutable_refused_methods())[method] = std::string(allowed.message());
    }
  }
  return grpc::Status::OK;
}

}  // namespace ckpt
