#ifndef CKPT_LIBS_RPC_BEARER_AUTH_H_
#define CKPT_LIBS_RPC_BEARER_AUTH_H_

// Bearer-token authentication shared by every ckpt service: reading the token from the file an
// --auth_token_file flag names, and checking a call's "authorization: Bearer <token>" metadata.

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/string_ref.h"

namespace ckpt {

// The token in `path` without surrounding whitespace. INVALID_ARGUMENT (naming `flag`) when the
// file cannot be read, is empty, or holds characters that cannot travel in gRPC metadata.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path,
                                              absl::string_view flag = "--auth_token_file");

// OK when `expected` is empty (no authentication) or the metadata carries
// "authorization: Bearer <expected>"; UNAUTHENTICATED naming `service` otherwise. The comparison
// takes time that depends only on the expected token's length.
absl::Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              absl::string_view expected, absl::string_view service);

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_BEARER_AUTH_H_
