#ifndef CKPT_LIBS_AUTH_BEARER_AUTH_H_
#define CKPT_LIBS_AUTH_BEARER_AUTH_H_

// Reading a bearer token from the file an --auth_token_file flag names. Checking a call's token
// is AccessPolicy's (access_policy.h).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// The token in `path` without surrounding whitespace. INVALID_ARGUMENT (naming `flag`) when the
// file cannot be read, is empty, or holds characters that cannot travel in gRPC metadata.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path,
                                              absl::string_view flag = "--auth_token_file");

}  // namespace ckpt

#endif  // CKPT_LIBS_AUTH_BEARER_AUTH_H_
