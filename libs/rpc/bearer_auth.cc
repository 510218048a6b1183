#include "libs/rpc/bearer_auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr absl::string_view kBearerPrefix = "Bearer ";

// Time depends only on the expected token's length, so responses do not reveal how many
// leading bytes were right.
bool TokensEqual(absl::string_view presented, absl::string_view expected) {
  unsigned char difference = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char given = i < presented.size() ? presented[i] : 0;
    difference |= static_cast<unsigned char>(given ^ static_cast<unsigned char>(expected[i]));
  }
  return difference == 0;
}

}  // namespace

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

absl::Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              absl::string_view expected, absl::string_view service) {
  if (expected.empty()) return absl::OkStatus();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this ", service, " requires 'authorization: Bearer <token>' metadata on every call"));
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWithIgnoreCase(value, kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "the 'authorization' metadata is not of the form 'Bearer <token>'");
  }
  if (!TokensEqual(value.substr(kBearerPrefix.size()), expected)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the bearer token is not valid for this ", service));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
