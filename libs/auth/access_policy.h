#ifndef CKPT_LIBS_AUTH_ACCESS_POLICY_H_
#define CKPT_LIBS_AUTH_ACCESS_POLICY_H_

// Who may call what on a ckpt service: callers are named identities with a role, authenticated by
// a bearer token (stored as its SHA-256) or by their mutual-TLS certificate, and optionally scoped
// to model-name patterns. Every service asks one question per call -- AccessPolicy::Check(context,
// method, model) -- and the answer for each method lives in one table (RequiredRole).
//
// Roles, each including the one before:
//   reader  Download, FindMissingChunks, ListModels, ListVersions, GetManifest, Verify, GetStats,
//           ListAudit, ListHistory, Watch; the loader's Load, Preflight, Export; the trainer's
//           GetStatus.
//   writer  + Upload, SetAlias, DeleteAlias, AnnotateVersion, CreateModel, UpdateModel; the
//           trainer's CheckpointNow and Stop.
//   admin   + DeleteVersion, ApplyRetention, GarbageCollect, RenameModel, DeleteModel.
// A scoped identity ("models": ["team-a-*"]) may only make calls that name a model matching one
// of its patterns (shell-style: '*' matches any run of characters, '?' one character); calls that
// name no model (ListModels, GetStats, GarbageCollect...) need only the role, except ListHistory
// and Watch, which a scoped identity must make for named models (the store service refuses them
// otherwise rather than return a partial view).
//
// The identities file (JSON), re-read when it changes (checked at most once a second, on a call):
//   {"identities": [
//     {"name": "serving",  "token_sha256": "<64 hex digits>", "role": "reader"},
//     {"name": "team-a",   "token_sha256": "<64 hex digits>", "role": "writer",
//      "models": ["team-a-*"]},
//     {"name": "ops",      "certificate": "ops.example.com",  "role": "admin"}]}
// "certificate" matches a verified client certificate's subject alternative name, common name or
// full subject ("CN=ops,O=Example"). `printf %s "$TOKEN" | sha256sum` gives a token's hash. A file
// that no longer parses is refused with a message on stderr and the previous identities stay.
//
// Forwarded certificates: a front end that terminates its users' mutual TLS itself (the console:
// a browser's client certificate reaches the console, not the store) cannot present the user's
// certificate onwards, so it says whose it verified, and the store must trust it to. Such a front
// end is listed by its own certificate with "forwards_certificates": true and no role:
//     {"name": "console", "certificate": "console.example", "forwards_certificates": true}
// Its calls carry the names of the certificate it verified as `ckpt-forwarded-certificate`
// metadata (kForwardedCertificateMetadata in metadata.h, one value per name: its SANs,
// common name and RFC 2253 subject), and are the calls of the identity
// listed for that certificate ("alice via console" in the audit log and history), held to that
// identity's role and models. A bearer token on the call still wins (a user who signed in with
// one). The front end has no rights of its own: a call from it that forwards no certificate is
// UNAUTHENTICATED, and any other identity that sends the metadata is refused.
//
// Why not gRPC's authorization-policy engine (grpcpp/security/authorization_policy_provider.h):
// its rules match paths, headers and certificate principals, so it can neither compare hashed
// tokens nor see the model a request names, and a denied call gets a fixed "Unauthorized RPC
// request rejected" -- where ckpt's callers need PERMISSION_DENIED naming who they are, the
// method and the role it needs.
//
// Thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "libs/auth/model_scope.h"

namespace ckpt {

enum class Role { kReader = 1, kWriter = 2, kAdmin = 3 };

// "reader", "writer", "admin".
absl::string_view RoleName(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);

// The role a method needs, by its short name ("SetAlias"). Methods not in the table need admin,
// so a method added without thought is closed rather than open.
Role RequiredRole(absl::string_view method);

// An authenticated caller.
struct Caller {
  // The identity's name from the identities file; "anonymous" without authentication; "token"
  // for the single shared token of --auth_token_file.
  std::string identity;
  Role role = Role::kReader;
  // Model-name patterns it is limited to; empty: every model.
  std::vector<std::string> models;
  // Where the call came from, as gRPC writes it ("ipv4:10.0.0.7:51234").
  std::string peer;
};

struct IdentityEntry {
  std::string name;
  std::string token_sha256;  // 32 raw bytes; empty for a certificate identity.
  std::string certificate;   // SAN, CN or subject; empty for a token identity.
  Role role = Role::kReader;
  std::vector<std::string> models;
  // A front end that forwards its users' certificates (see above); it has no role of its own.
  bool forwards_certificates = false;
};

// Parses the identities file's JSON; INVALID_ARGUMENT naming `source` and the entry at fault
// (unknown field or role, bad hash, duplicate name or token, neither or both of token and
// certificate, a forwarding front end that is not a certificate identity or has a role).
absl::StatusOr<std::vector<IdentityEntry>> ParseIdentities(absl::string_view json,
                                                           absl::string_view source);

class AccessPolicy {
 public:
  // Every caller is admitted with the admin role, as "anonymous", or under mutual TLS as
  // "certificate:<its first SAN or CN>": for loopback, tests, and mutual TLS where every
  // certificate the CA signs may do anything.
  static std::unique_ptr<AccessPolicy> AllowAll();
  // One shared bearer token (--auth_token_file), identity "token", admin: the old behaviour.
  static std::unique_ptr<AccessPolicy> SharedToken(std::string token);
  // Named identities from `path` (format above), watched for changes. Errors from reading or
  // parsing it.
  static absl::StatusOr<std::unique_ptr<AccessPolicy>> FromIdentitiesFile(std::string path);
  // What a service's options ask for: `policy` when set, else SharedToken(token) when the token
  // is non-empty, else AllowAll().
  static std::shared_ptr<const AccessPolicy> Resolve(std::shared_ptr<const AccessPolicy> policy,
                                                     std::string token);

  // Who is calling: the identity whose token the "authorization: Bearer" metadata carries, else
  // the one whose certificate the verified TLS peer presented, or, when that peer is a
  // forwarding front end, the one listed for the certificate it forwards. UNAUTHENTICATED (naming
  // `service`) when neither names a known identity; PERMISSION_DENIED when an identity that may
  // not forward certificates sends the metadata.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& context,
                                      absl::string_view service) const;

  // How the audit log names a caller Authenticate refused: "unknown (token sha256:1a2b3c4d)" (the
  // first 8 hex digits of the presented token's SHA-256, enough to tell tokens apart, useless
  // for guessing one), "unknown (certificate <its first SAN or CN>)", or "unknown (no
  // credentials)".
  static std::string UnauthenticatedCallerName(const grpc::ServerContextBase& context);

  // OK when `caller` may call `method` (short name) on `model` (empty: the call names none);
  // PERMISSION_DENIED naming the identity, the method and the role or model scope it lacks.
  static absl::Status Authorize(const Caller& caller, absl::string_view method,
                                absl::string_view model);

  // Authenticate, then Authorize.
  absl::StatusOr<Caller> Check(const grpc::ServerContextBase& context, absl::string_view service,
                               absl::string_view method, absl::string_view model) const;

 private:
  enum class Mode { kAllowAll, kSharedToken, kIdentities };
  AccessPolicy(Mode mode, std::string token_or_path);

  // Re-reads the identities file when its modification time changed (at most once a second).
  void MaybeReload() const;

  const Mode mode_;
  const std::string token_or_path_;
  mutable absl::Mutex mu_;
  mutable std::vector<IdentityEntry> identities_ ABSL_GUARDED_BY(mu_);
  mutable int64_t loaded_mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  mutable absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ckpt

#endif  // CKPT_LIBS_AUTH_ACCESS_POLICY_H_
