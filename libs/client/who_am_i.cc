#include "libs/client/who_am_i.h"

#include <memory>
#include <string>

#include "libs/status/status_macros.h"
#include "proto/ckpt/v1/identity.grpc.pb.h"

namespace ckpt {

absl::StatusOr<v1::WhoAmIResponse> WhoAmI(const ClientOptions& options,
                                          const v1::WhoAmIRequest& request,
                                          absl::string_view noun) {
  ASSIGN_OR_RETURN(
      const std::shared_ptr<ClientChannel> channel,
      ClientChannel::Open(options, {"ckpt.v1.Identity", std::string(noun), {"WhoAmI"}}));
  auto stub = v1::Identity::NewStub(channel->channel());
  v1::WhoAmIResponse response;
  RETURN_IF_ERROR(channel->CallUnary("WhoAmI", options.deadline, [&](grpc::ClientContext* context) {
    response.Clear();
    return stub->WhoAmI(context, request, &response);
  }));
  return response;
}

}  // namespace ckpt
