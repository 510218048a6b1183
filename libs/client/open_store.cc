#include "libs/client/open_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/auth/bearer_auth.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_macros.h"
#include "libs/store/audited_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

absl::StatusOr<StoreLocation> StoreLocationFromFlags(const StoreClientFlags& flags) {
  StoreLocation location;
  const bool names_directory = !flags.store_dir.empty() &&
                               (flags.store.empty() || flags.store_dir != flags.store_dir_default);
  if (flags.store.empty() == !names_directory) {
    return absl::InvalidArgumentError(
        "exactly one of --store=HOST:PORT (a checkpoint_store service) and --store_dir=DIR (an "
        "embedded store) is required");
  }
  if (flags.store.empty()) {
    if (!flags.auth_token_file.empty()) {
      return absl::InvalidArgumentError("--store_auth_token_file needs --store");
    }
    if (!(flags.tls_ca_file.empty() && flags.tls_cert_file.empty() && flags.tls_key_file.empty() &&
          flags.tls_server_name.empty())) {
      return absl::InvalidArgumentError("--store_tls_* flags need --store");
    }
    location.directory = flags.store_dir;
    return location;
  }
  location.address = flags.store;
  if (!flags.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(location.auth_token,
                     ReadAuthTokenFile(flags.auth_token_file, "--store_auth_token_file"));
  }
  location.tls.ca_file = flags.tls_ca_file;
  location.tls.cert_file = flags.tls_cert_file;
  location.tls.key_file = flags.tls_key_file;
  location.tls.server_name = flags.tls_server_name;
  return location;
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenCheckpointStore(
    const StoreLocation& location) {
  if (location.address.empty() == location.directory.empty()) {
    return absl::InvalidArgumentError(
        "a store is either a directory or the address of a checkpoint_store service: give "
        "exactly one");
  }
  if (!location.address.empty()) {
    RemoteStoreOptions options;
    options.address = location.address;
    options.auth_token = location.auth_token;
    options.tls = location.tls;
    ASSIGN_OR_RETURN(std::unique_ptr<RemoteCheckpointStore> store,
                     RemoteCheckpointStore::Connect(options));
    return std::unique_ptr<CheckpointStore>(std::move(store));
  }
  if (!location.auth_token.empty() || !location.tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "an auth token or TLS settings go with a store service's address, not a store "
        "directory");
  }
  StoreOptions options;
  options.db_path = location.directory;
  options.create_if_missing = location.create_if_missing;
  options.chunk_backend = location.chunk_backend;
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(options));
  // A remote store's server audits the calls made to it; a directory opened here has no server,
  // so this process records its own changes, as the user it runs as.
  return std::unique_ptr<CheckpointStore>(std::make_unique<AuditedStore>(
      std::move(store), AuditedStore::Actor{absl::StrCat("local:", ProcessUserName()), "local"}));
}

}  // namespace ckpt
