#ifndef CKPT_LIBS_CLIENT_WHO_AM_I_H_
#define CKPT_LIBS_CLIENT_WHO_AM_I_H_

// Asks a ckpt server (the store or the loader) who it takes the caller of `options` to be, and
// which of `request.methods` it may call on `request.model`: ckpt.v1.Identity/WhoAmI
// (proto/ckpt/v1/identity.proto), answered by the server's own access policy. Used by the console
// (for each of its callers) and by `ckpt whoami`.
//
// Example:
//   v1::WhoAmIRequest request;
//   request.set_model("resnet");
//   request.add_methods("SetAlias");
//   ASSIGN_OR_RETURN(v1::WhoAmIResponse who, WhoAmI(options, request, "checkpoint store"));

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/rpc/client_channel.h"
#include "proto/ckpt/v1/identity.pb.h"

namespace ckpt {

// `noun` names the server in errors ("checkpoint store at HOST:PORT: ..."). Errors as
// ClientChannel's (UNAVAILABLE, UNAUTHENTICATED, ...); UNIMPLEMENTED from a server that predates
// ckpt.v1.Identity.
absl::StatusOr<v1::WhoAmIResponse> WhoAmI(const ClientOptions& options,
                                          const v1::WhoAmIRequest& request, absl::string_view noun);

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_WHO_AM_I_H_
