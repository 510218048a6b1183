#include "libs/auth/access_policy.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpc/grpc_security_constants.h"
#include "libs/auth/metadata.h"
#include "libs/io/read_file.h"
#include "libs/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

constexpr absl::Duration kReloadCheckInterval = absl::Seconds(1);

struct MethodRole {
  absl::string_view method;
  Role role;
  absl::string_view action;  // what a caller of it tries to do, for refusals.
};

// Every method of ckpt.v1.CheckpointStore, ckpt.v1.Loader and ckpt.v1.Trainer.
constexpr MethodRole kMethodRoles[] = {
    // ckpt.v1.CheckpointStore
    {"Download", Role::kReader, "read versions"},
    {"FindMissingChunks", Role::kReader, "check which chunks the store holds"},
    {"ListModels", Role::kReader, "list models"},
    {"ListVersions", Role::kReader, "list versions"},
    {"GetManifest", Role::kReader, "read manifests"},
    {"Verify", Role::kReader, "verify versions"},
    {"GetStats", Role::kReader, "read the store's statistics"},
    {"ListAudit", Role::kReader, "read the audit log"},
    {"ListHistory", Role::kReader, "read the registry's history"},
    {"Watch", Role::kReader, "watch the registry"},
    {"Upload", Role::kWriter, "commit versions"},
    {"SetAlias", Role::kWriter, "move aliases"},
    {"DeleteAlias", Role::kWriter, "delete aliases"},
    {"AnnotateVersion", Role::kWriter, "annotate versions"},
    {"CreateModel", Role::kWriter, "create models"},
    {"UpdateModel", Role::kWriter, "change models' details"},
    {"DeleteVersion", Role::kAdmin, "delete versions"},
    {"ApplyRetention", Role::kAdmin, "apply retention"},
    {"GarbageCollect", Role::kAdmin, "collect garbage"},
    {"RenameModel", Role::kAdmin, "rename models"},
    {"DeleteModel", Role::kAdmin, "delete models"},
    // ckpt.v1.Loader
    {"Load", Role::kReader, "load versions"},
    {"Preflight", Role::kReader, "preflight loads"},
    {"Export", Role::kReader, "export versions"},
    // ckpt.v1.Trainer
    {"GetStatus", Role::kReader, "read the trainer's status"},
    {"CheckpointNow", Role::kWriter, "ask the trainer for a checkpoint"},
    {"Stop", Role::kWriter, "stop the trainer"},
    // ckpt.v1.Identity (every server)
    {"WhoAmI", Role::kReader, "ask who it is"},
};

std::string Sha256(absl::string_view bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

// Time independent of where the inputs differ (both are digests of equal length).
bool DigestsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

// The token of "authorization: Bearer <token>"; nullopt without that metadata; an error for
// metadata of another form.
absl::StatusOr<std::optional<std::string>> BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationMetadata);
  if (it == metadata.end()) return std::optional<std::string>();
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWithIgnoreCase(value, kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "the 'authorization' metadata is not of the form 'Bearer <token>'");
  }
  return std::optional<std::string>(
      std::string(value.substr(absl::string_view(kBearerPrefix).size())));
}

// The names a verified client certificate goes by: its SANs, common name and subject. Empty
// without TLS or without a client certificate.
std::vector<std::string> CertificateNames(const grpc::ServerContextBase& context) {
  std::vector<std::string> names;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property :
       {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SUBJECT_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      names.emplace_back(value.data(), value.size());
    }
  }
  return names;
}

// The identity listed for a certificate that goes by `names` (its SANs, common name, subject);
// null when none is. `users_only`: not a forwarding front end (what a front end forwards is a
// user's certificate).
const IdentityEntry* FindCertificateIdentity(const std::vector<IdentityEntry>& identities,
                                             const std::vector<std::string>& names,
                                             bool users_only) {
  for (const IdentityEntry& entry : identities) {
    if (entry.certificate.empty() || (users_only && entry.forwards_certificates)) continue;
    if (std::find(names.begin(), names.end(), entry.certificate) != names.end()) return &entry;
  }
  return nullptr;
}

// The names a forwarding front end sent for its user's certificate.
std::vector<std::string> ForwardedCertificateNames(const grpc::ServerContextBase& context) {
  std::vector<std::string> names;
  const auto range = context.client_metadata().equal_range(kForwardedCertificateMetadata);
  for (auto it = range.first; it != range.second; ++it) {
    names.emplace_back(it->second.data(), it->second.size());
  }
  return names;
}

int64_t ModificationTimeNs(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) return -1;
  return int64_t{info.st_mtim.tv_sec} * 1000000000 + info.st_mtim.tv_nsec;
}

absl::StatusOr<std::vector<IdentityEntry>> LoadIdentitiesFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string json, ReadSmallFile(path, "--identities_file"));
  return ParseIdentities(json, path);
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kWriter:
      return "writer";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kReader, Role::kWriter, Role::kAdmin}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "'; roles are reader, writer and admin"));
}

Role RequiredRole(absl::string_view method) {
  for (const MethodRole& entry : kMethodRoles) {
    if (entry.method == method) return entry.role;
  }
  return Role::kAdmin;
}

namespace {

// "move aliases (SetAlias)": what the caller tried, then the method, for refusals.
std::string Attempted(absl::string_view method) {
  for (const MethodRole& entry : kMethodRoles) {
    if (entry.method == method) return absl::StrCat(entry.action, " (", method, ")");
  }
  return absl::StrCat("call ", method);
}

}  // namespace

absl::StatusOr<std::vector<IdentityEntry>> ParseIdentities(absl::string_view json,
                                                           absl::string_view source) {
  const nlohmann::json root = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("identities file ", source, ": ", why));
  };
  if (root.is_discarded()) return bad("not valid JSON");
  if (!root.is_object() || !root.contains("identities") || !root["identities"].is_array()) {
    return bad(R"(want {"identities": [{"name": ..., "role": ..., ...}, ...]})");
  }
  std::vector<IdentityEntry> entries;
  absl::flat_hash_set<std::string> names, tokens, certificates;
  int index = 0;
  for (const nlohmann::json& item : root["identities"]) {
    const std::string where = absl::StrCat("identities[", index++, "]");
    if (!item.is_object()) return bad(absl::StrCat(where, " is not an object"));
    IdentityEntry entry;
    for (const auto& [key, value] : item.items()) {
      if (key == "forwards_certificates") {
        if (!value.is_boolean()) {
          return bad(absl::StrCat(where, ".forwards_certificates must be true or false"));
        }
        entry.forwards_certificates = value.get<bool>();
        continue;
      }
      if (key == "models") {
        if (!value.is_array()) return bad(absl::StrCat(where, ".models must be a list"));
        for (const nlohmann::json& pattern : value) {
          if (!pattern.is_string() || pattern.get<std::string>().empty()) {
            return bad(absl::StrCat(where, ".models must hold non-empty strings"));
          }
          entry.models.push_back(pattern.get<std::string>());
        }
        continue;
      }
      if (!value.is_string()) return bad(absl::StrCat(where, ".", key, " must be a string"));
      const std::string text = value.get<std::string>();
      if (key == "name") {
        entry.name = text;
      } else if (key == "role") {
        absl::StatusOr<Role> role = ParseRole(text);
        if (!role.ok()) return bad(absl::StrCat(where, ": ", role.status().message()));
        entry.role = *role;
      } else if (key == "token_sha256") {
        const bool hex = text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
                           return absl::ascii_isxdigit(static_cast<unsigned char>(c));
                         });
        if (!hex) {
          return bad(absl::StrCat(where,
                                  ".token_sha256 must be 64 hex digits (sha256sum of the "
                                  "token)"));
        }
        entry.token_sha256 = absl::HexStringToBytes(text);
      } else if (key == "certificate") {
        entry.certificate = text;
      } else {
        return bad(absl::StrCat(where, " has unknown field '", key,
                                "' (fields: name, role, token_sha256, certificate, models, "
                                "forwards_certificates)"));
      }
    }
    if (entry.name.empty()) return bad(absl::StrCat(where, " has no name"));
    if (entry.forwards_certificates) {
      // Its calls are its users' calls: a role of its own would be rights nobody is accountable
      // for, and a token would let anyone holding it vouch for any certificate.
      if (item.contains("role") || item.contains("models")) {
        return bad(absl::StrCat(where, " (", entry.name,
                                ") forwards certificates, so it has no role or models of its "
                                "own: each call gets those of the user whose certificate it "
                                "forwards"));
      }
      if (entry.certificate.empty()) {
        return bad(absl::StrCat(where, " (", entry.name,
                                ") forwards certificates, so it must be known by its own "
                                "certificate (a 'certificate' field), not a token"));
      }
    } else if (!item.contains("role")) {
      return bad(absl::StrCat(where, " (", entry.name, ") has no role"));
    }
    if (entry.token_sha256.empty() == entry.certificate.empty()) {
      return bad(absl::StrCat(where, " (", entry.name,
                              ") needs exactly one of token_sha256 and certificate"));
    }
    if (!names.insert(entry.name).second) {
      return bad(absl::StrCat("two identities are named '", entry.name, "'"));
    }
    if (!entry.token_sha256.empty() && !tokens.insert(entry.token_sha256).second) {
      return bad(absl::StrCat(where, " (", entry.name, ") has the same token as another"));
    }
    if (!entry.certificate.empty() && !certificates.insert(entry.certificate).second) {
      return bad(absl::StrCat(where, " (", entry.name, ") names the same certificate as another"));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

AccessPolicy::AccessPolicy(Mode mode, std::string token_or_path)
    : mode_(mode), token_or_path_(std::move(token_or_path)) {}

std::unique_ptr<AccessPolicy> AccessPolicy::AllowAll() {
  return std::unique_ptr<AccessPolicy>(new AccessPolicy(Mode::kAllowAll, ""));
}

std::unique_ptr<AccessPolicy> AccessPolicy::SharedToken(std::string token) {
  return std::unique_ptr<AccessPolicy>(
      new AccessPolicy(Mode::kSharedToken, Sha256(std::move(token))));
}

std::shared_ptr<const AccessPolicy> AccessPolicy::Resolve(
    std::shared_ptr<const AccessPolicy> policy, std::string token) {
  if (policy != nullptr) return policy;
  if (!token.empty()) return SharedToken(std::move(token));
  return AllowAll();
}

absl::StatusOr<std::unique_ptr<AccessPolicy>> AccessPolicy::FromIdentitiesFile(std::string path) {
  const int64_t mtime = ModificationTimeNs(path);
  ASSIGN_OR_RETURN(std::vector<IdentityEntry> identities, LoadIdentitiesFile(path));
  std::unique_ptr<AccessPolicy> policy(new AccessPolicy(Mode::kIdentities, std::move(path)));
  absl::MutexLock lock(&policy->mu_);
  policy->identities_ = std::move(identities);
  policy->loaded_mtime_ns_ = mtime;
  policy->last_check_ = absl::Now();
  return policy;
}

void AccessPolicy::MaybeReload() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - last_check_ < kReloadCheckInterval) return;
  last_check_ = now;
  const int64_t mtime = ModificationTimeNs(token_or_path_);
  if (mtime == loaded_mtime_ns_) return;
  absl::StatusOr<std::vector<IdentityEntry>> identities = LoadIdentitiesFile(token_or_path_);
  loaded_mtime_ns_ = mtime;  // A broken file is reported once, not on every call.
  if (!identities.ok()) {
    std::fprintf(stderr, "access policy: keeping the previous identities: %s\n",
                 std::string(identities.status().message()).c_str());
    return;
  }
  identities_ = *std::move(identities);
  std::fprintf(stderr, "access policy: reloaded %zu identities from %s\n", identities_.size(),
               token_or_path_.c_str());
}

absl::StatusOr<Caller> AccessPolicy::Authenticate(const grpc::ServerContextBase& context,
                                                  absl::string_view service) const {
  Caller caller;
  caller.peer = context.peer();
  if (mode_ == Mode::kAllowAll) {
    // Mutual TLS without an identities file admits every certificate the CA signed; its name
    // still tells the audit log who called.
    const std::vector<std::string> names = CertificateNames(context);
    caller.identity = names.empty() ? "anonymous" : absl::StrCat("certificate:", names.front());
    caller.role = Role::kAdmin;
    return caller;
  }
  ASSIGN_OR_RETURN(const std::optional<std::string> token, BearerToken(context));
  if (mode_ == Mode::kSharedToken) {
    if (!token.has_value()) {
      return absl::UnauthenticatedError(absl::StrCat(
          "this ", service, " requires 'authorization: Bearer <token>' metadata on every call"));
    }
    if (!DigestsEqual(Sha256(*token), token_or_path_)) {
      return absl::UnauthenticatedError(
          absl::StrCat("the bearer token is not valid for this ", service));
    }
    caller.identity = "token";
    caller.role = Role::kAdmin;
    return caller;
  }
  MaybeReload();
  const std::vector<std::string> certificate_names = CertificateNames(context);
  const std::string digest = token.has_value() ? Sha256(*token) : std::string();
  absl::MutexLock lock(&mu_);
  const IdentityEntry* found = nullptr;
  for (const IdentityEntry& entry : identities_) {
    // Every entry is compared, so the time taken does not say which token was close.
    if (token.has_value() && !entry.token_sha256.empty() &&
        DigestsEqual(digest, entry.token_sha256)) {
      found = &entry;
    }
  }
  if (token.has_value() && found == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("the bearer token is not that of any identity of this ", service));
  }
  if (found == nullptr) {
    found = FindCertificateIdentity(identities_, certificate_names, /*users_only=*/false);
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this ", service, " knows the caller by a bearer token or a client certificate; ",
        certificate_names.empty() ? "the call carried neither"
                                  : absl::StrCat("no identity is listed for the certificate of ",
                                                 absl::StrJoin(certificate_names, ", "))));
  }
  const std::vector<std::string> forwarded = ForwardedCertificateNames(context);
  if (token.has_value()) {
    // A user who signed in with a token is that token's identity, whoever relayed the call.
  } else if (found->forwards_certificates) {
    const IdentityEntry* user =
        FindCertificateIdentity(identities_, forwarded, /*users_only=*/true);
    if (user == nullptr) {
      return absl::UnauthenticatedError(absl::StrCat(
          "this ", service, " knows the caller by a bearer token or a client certificate; ",
          forwarded.empty()
              ? absl::StrCat("'", found->name,
                             "' forwards its users' certificates and this call forwarded none")
              : absl::StrCat("no identity is listed for the certificate of ",
                             absl::StrJoin(forwarded, ", "), " (forwarded by '", found->name,
                             "')")));
    }
    caller.identity = absl::StrCat(user->name, " via ", found->name);
    caller.role = user->role;
    caller.models = user->models;
    return caller;
  } else if (!forwarded.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "identity '", found->name, "' may not forward client certificates (",
        kForwardedCertificateMetadata,
        " metadata): only an identity listed with \"forwards_certificates\": true may"));
  }
  caller.identity = found->name;
  caller.role = found->role;
  caller.models = found->models;
  return caller;
}

std::string AccessPolicy::UnauthenticatedCallerName(const grpc::ServerContextBase& context) {
  absl::StatusOr<std::optional<std::string>> token = BearerToken(context);
  if (!token.ok()) return "unknown (malformed authorization metadata)";
  if (token->has_value()) {
    return absl::StrCat(
        "unknown (token sha256:", absl::BytesToHexString(Sha256(**token)).substr(0, 8), ")");
  }
  const std::vector<std::string> names = CertificateNames(context);
  if (!names.empty()) return absl::StrCat("unknown (certificate ", names.front(), ")");
  return "unknown (no credentials)";
}

absl::Status AccessPolicy::Authorize(const Caller& caller, absl::string_view method,
                                     absl::string_view model) {
  const Role needed = RequiredRole(method);
  if (static_cast<int>(caller.role) < static_cast<int>(needed)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "identity '", caller.identity, "' (role ", RoleName(caller.role), ") may not ",
        Attempted(method), model.empty() ? "" : absl::StrCat(" on model '", model, "'"),
        ": that needs the ", RoleName(needed), " role"));
  }
  const ModelScope scope(caller.models);
  if (model.empty() || scope.Covers(model)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "identity '", caller.identity, "' may not ", Attempted(method), " on model '", model,
      "': its ", RoleName(caller.role), " role covers only ", scope.Describe()));
}

absl::StatusOr<Caller> AccessPolicy::Check(const grpc::ServerContextBase& context,
                                           absl::string_view service, absl::string_view method,
                                           absl::string_view model) const {
  ASSIGN_OR_RETURN(Caller caller, Authenticate(context, service));
  RETURN_IF_ERROR(Authorize(caller, method, model));
  return caller;
}

}  // namespace ckpt
