#include "libs/auth/bearer_auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path, absl::string_view flag) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", flag, "=", path, ": ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", flag, "=", path, ": ", std::strerror(errno)));
  }
  const std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", path,
        " is empty; an empty token cannot authenticate anyone (drop the flag to go without "
        "authentication)"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, "=", path,
          " holds a token with whitespace, control or non-ASCII characters, which cannot travel "
          "in an 'authorization' header; use printable ASCII"));
    }
  }
  return token;
}

}  // namespace ckpt
