#ifndef CKPT_LIBS_SERVER_SERVER_SECURITY_H_
#define CKPT_LIBS_SERVER_SERVER_SECURITY_H_

// A server's security settings as every ckpt server's flags give them (--tls_cert_file,
// --tls_key_file, --tls_client_ca_file, --tls_reload_interval, --identities_file,
// --auth_token_file), checked and turned into GrpcServer's TLS options and an AccessPolicy in
// one place. Each main.cc defines its flags and fills ServerSecurityFlags from them.
//
// Example:
//   ServerSecurityFlags flags;
//   flags.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
//   ...
//   ASSIGN_OR_RETURN(ServerSecurity security, LoadServerSecurity(flags, "--"));
//   server_options.tls = security.tls;
//   service_options.access = security.access;

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/auth/access_policy.h"
#include "libs/rpc/grpc_server.h"

namespace ckpt {

struct ServerSecurityFlags {
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  absl::Duration tls_reload_interval = absl::Seconds(60);
  std::string identities_file;
  std::string auth_token_file;
};

struct ServerSecurity {
  ServerTlsOptions tls;
  std::shared_ptr<const AccessPolicy> access;
};

// Reads the token or identities file and checks the combination. `flag_prefix` ("--" or
// "--control_") names the flags in messages. INVALID_ARGUMENT when both --identities_file and
// --auth_token_file are given, or a client CA without a server certificate; file errors as
// ReadAuthTokenFile / AccessPolicy::FromIdentitiesFile report them. TLS files themselves are
// checked when the server starts (GrpcServer::Start).
absl::StatusOr<ServerSecurity> LoadServerSecurity(const ServerSecurityFlags& flags,
                                                  absl::string_view flag_prefix = "--");

}  // namespace ckpt

#endif  // CKPT_LIBS_SERVER_SERVER_SECURITY_H_
