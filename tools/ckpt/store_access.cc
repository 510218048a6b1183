#include "tools/ckpt/store_access.h"

#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/auth/bearer_auth.h"
#include "libs/client/open_store.h"
#include "libs/loader/local_loader.h"
#include "libs/status/status_macros.h"
#include "libs/store/s3_chunk_backend.h"
#include "libs/store/version_filter_text.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

// The client options of one connection, `connection` "store" (--store) or "loader" (--loader):
// --store_auth_token_file and --store_tls_* as every binary that reaches a store spells them,
// --loader_* likewise. Until the release after 2026-12, the CLI's older --auth_token_file and
// --tls_*, which served whichever connection the command made, are still accepted (with a
// deprecation line on stderr); both spellings of one option together are refused.
constexpr const char* kConnectionOptions[] = {"auth_token_file", "tls_ca_file", "tls_cert_file",
                                              "tls_key_file", "tls_server_name"};

absl::StatusOr<std::optional<std::string>> ConnectionOption(const cli::ParsedCommandLine& line,
                                                            absl::string_view connection,
                                                            absl::string_view name) {
  const std::string current = absl::StrCat(connection, "_", name);
  if (line.Has(current) && line.Has(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", current, " and --", name, " (its deprecated spelling) given together"));
  }
  if (line.Has(current)) return line.Get(current);
  if (!line.Has(name)) return std::nullopt;
  static absl::flat_hash_set<std::string>* warned = new absl::flat_hash_set<std::string>();
  if (warned->insert(current).second) {
    std::cerr << "ckpt: --" << name << " is deprecated and will be removed in the next release; "
              << "use --" << current << "\n";
  }
  return line.Get(name);
}

// The client TLS options of `connection` (plaintext when no CA file is given).
absl::StatusOr<ClientTlsOptions> ConnectionTls(const cli::ParsedCommandLine& line,
                                               absl::string_view connection) {
  ClientTlsOptions tls;
  const std::pair<const char*, std::string*> fields[] = {{"tls_ca_file", &tls.ca_file},
                                                         {"tls_cert_file", &tls.cert_file},
                                                         {"tls_key_file", &tls.key_file},
                                                         {"tls_server_name", &tls.server_name}};
  for (const auto& [name, field] : fields) {
    ASSIGN_OR_RETURN(std::optional<std::string> value, ConnectionOption(line, connection, name));
    if (value.has_value()) *field = *std::move(value);
  }
  return tls;
}

// The bearer token of `connection`, read from its token file; empty without one.
absl::StatusOr<std::string> ConnectionToken(const cli::ParsedCommandLine& line,
                                            absl::string_view connection) {
  ASSIGN_OR_RETURN(std::optional<std::string> file,
                   ConnectionOption(line, connection, "auth_token_file"));
  if (!file.has_value()) return std::string();
  return ReadAuthTokenFile(*file);
}

// INVALID_ARGUMENT naming the first option of `connection` (current spelling, or with
// `deprecated_too` the old one) given although the command makes no such connection.
absl::Status RefuseConnectionOptions(const cli::ParsedCommandLine& line,
                                     absl::string_view connection, bool deprecated_too) {
  for (const char* name : kConnectionOptions) {
    const std::string current = absl::StrCat(connection, "_", name);
    const std::string given = line.Has(current)                  ? current
                              : deprecated_too && line.Has(name) ? std::string(name)
                                                                 : std::string();
    if (!given.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", given, " needs --", connection, "=HOST:PORT"));
    }
  }
  return absl::OkStatus();
}

bool HasChunksS3(const cli::ParsedCommandLine& line) {
  for (const char* option :
       {"chunks_s3_endpoint", "chunks_s3_bucket", "chunks_s3_prefix", "chunks_s3_region",
        "chunks_s3_credentials_file", "chunks_s3_ca_file"}) {
    if (line.Has(option)) return true;
  }
  return false;
}

// --chunks_s3_*: the embedded store's chunks in an object store; null without them. Which options
// go together is checked where the servers' flags are checked (S3ChunkStorageFromFlags).
absl::StatusOr<std::shared_ptr<ChunkBackend>> ChunkBackendFor(const cli::ParsedCommandLine& line) {
  S3ChunkFlags flags;
  const auto given = [&line](const char* option) {
    return line.Has(option) ? line.Get(option) : std::string();
  };
  flags.endpoint = given("chunks_s3_endpoint");
  flags.bucket = given("chunks_s3_bucket");
  flags.prefix = given("chunks_s3_prefix");
  flags.region = given("chunks_s3_region");
  flags.credentials_file = given("chunks_s3_credentials_file");
  flags.ca_file = given("chunks_s3_ca_file");
  ASSIGN_OR_RETURN(const S3ChunkStorageConfig config, S3ChunkStorageFromFlags(flags));
  return OpenS3ChunkStorage(config);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenStore(const cli::ParsedCommandLine& line,
                                                           bool create) {
  StoreLocation location;
  if (line.Has("store") && HasChunksS3(line)) {
    return absl::InvalidArgumentError(
        "--chunks_s3_* options go with --store_dir; a --store service has its own chunk storage");
  }
  if (!line.Has("loader")) RETURN_IF_ERROR(RefuseConnectionOptions(line, "loader", false));
  if (line.Has("store")) {
    location.address = line.Get("store");
    ASSIGN_OR_RETURN(location.auth_token, ConnectionToken(line, "store"));
    ASSIGN_OR_RETURN(location.tls, ConnectionTls(line, "store"));
  } else {
    // The deprecated spellings serve --loader too; without either they are refused here.
    RETURN_IF_ERROR(RefuseConnectionOptions(line, "store", !line.Has("loader")));
    location.directory = line.Get("store_dir");
    location.create_if_missing = create;
    ASSIGN_OR_RETURN(location.chunk_backend, ChunkBackendFor(line));
  }
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenCheckpointStore(location);
  if (!store.ok()) {
    // The hint fits a store that is not there, not one that is damaged or held by another process.
    const bool absent = store.status().code() == absl::StatusCode::kNotFound;
    return absl::Status(
        store.status().code(),
        absl::StrCat("opening the store ", location.ToString(), ": ", store.status().message(),
                     absent && !create && location.address.empty()
                         ? " (import a checkpoint first, or pass --store_dir)"
                         : ""));
  }
  return store;
}

absl::StatusOr<std::unique_ptr<RemoteLoader>> ConnectLoader(const cli::ParsedCommandLine& line) {
  RemoteLoaderOptions options;
  options.address = line.Get("loader");
  if (!line.Has("store")) RETURN_IF_ERROR(RefuseConnectionOptions(line, "store", false));
  ASSIGN_OR_RETURN(options.auth_token, ConnectionToken(line, "loader"));
  ASSIGN_OR_RETURN(options.tls, ConnectionTls(line, "loader"));
  return RemoteLoader::Connect(options);
}

absl::StatusOr<LoaderHandle> OpenLoader(const cli::ParsedCommandLine& line) {
  LoaderHandle handle;
  if (line.Has("loader")) {
    ASSIGN_OR_RETURN(handle.loader, ConnectLoader(line));
    return handle;
  }
  ASSIGN_OR_RETURN(handle.store, OpenStore(line, false));
  handle.loader = std::make_unique<LocalLoader>(*handle.store);
  return handle;
}

absl::StatusOr<ServiceClient> ServiceClientFor(const cli::ParsedCommandLine& line) {
  ServiceClient client;
  if (line.Has("loader")) {
    if (!line.Has("store")) RETURN_IF_ERROR(RefuseConnectionOptions(line, "store", false));
    client.options.address = line.Get("loader");
    ASSIGN_OR_RETURN(client.options.auth_token, ConnectionToken(line, "loader"));
    ASSIGN_OR_RETURN(client.options.tls, ConnectionTls(line, "loader"));
    client.noun = "loader";
    return client;
  }
  if (!line.Has("store")) {
    return absl::InvalidArgumentError(
        "this asks a service: pass --store=HOST:PORT (or --loader=HOST:PORT); an embedded "
        "--store_dir has no identities, every command there runs with full rights");
  }
  RETURN_IF_ERROR(RefuseConnectionOptions(line, "loader", false));
  client.options.address = line.Get("store");
  ASSIGN_OR_RETURN(client.options.auth_token, ConnectionToken(line, "store"));
  ASSIGN_OR_RETURN(client.options.tls, ConnectionTls(line, "store"));
  client.noun = "checkpoint store";
  return client;
}

absl::StatusOr<v1::VersionRef> RefWithVersion(const std::string& text) {
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(text));
  if (ref.ref_case() != v1::VersionRef::kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' must name a version number, e.g. MODEL@7"));
  }
  return ref;
}

absl::StatusOr<absl::Time> ParseTimeOption(const std::string& option, const std::string& text) {
  return ParseTimeSpec(absl::StrCat("--", option), text);
}

std::string UtcTimeText(int64_t unix_micros) {
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%E6SZ", absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}

}  // namespace ckpt
