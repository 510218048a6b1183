#include "libs/server/server_security.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/auth/bearer_auth.h"
#include "libs/status/status_macros.h"

namespace ckpt {

absl::StatusOr<ServerSecurity> LoadServerSecurity(const ServerSecurityFlags& flags,
                                                  absl::string_view flag_prefix) {
  const auto flag = [&](absl::string_view name) { return absl::StrCat(flag_prefix, name); };
  if (!flags.identities_file.empty() && !flags.auth_token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag("identities_file"), " and ", flag("auth_token_file"),
        " are alternatives: put the shared token in the identities file as one identity"));
  }
  if (flags.tls_cert_file.empty() != flags.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS needs both ", flag("tls_cert_file"), " and ", flag("tls_key_file")));
  }
  if (!flags.tls_client_ca_file.empty() && flags.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag("tls_client_ca_file"),
                                                   " (mutual TLS) needs ", flag("tls_cert_file"),
                                                   " and ", flag("tls_key_file")));
  }
  ServerSecurity security;
  security.tls.cert_file = flags.tls_cert_file;
  security.tls.key_file = flags.tls_key_file;
  security.tls.client_ca_file = flags.tls_client_ca_file;
  security.tls.reload_interval = flags.tls_reload_interval;
  if (!flags.identities_file.empty()) {
    ASSIGN_OR_RETURN(security.access, AccessPolicy::FromIdentitiesFile(flags.identities_file));
  } else if (!flags.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(std::string token,
                     ReadAuthTokenFile(flags.auth_token_file, flag("auth_token_file")));
    security.access = AccessPolicy::SharedToken(std::move(token));
  } else {
    security.access = AccessPolicy::AllowAll();
  }
  return security;
}

}  // namespace ckpt
