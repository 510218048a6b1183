#ifndef CKPT_LIBS_CLIENT_OPEN_STORE_H_
#define CKPT_LIBS_CLIENT_OPEN_STORE_H_

// One way for every binary (ckpt, the loader, the trainer) to open "the store" a user named:
// an embedded RocksDB directory, or the address of a checkpoint_store service. Both are a
// CheckpointStore, so what follows does not care which.
//
// Example:
//   StoreLocation location;
//   location.directory = "ckpt-data";
//   ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenCheckpointStore(location));

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/rpc/client_channel.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/chunk_backend.h"

namespace ckpt {

struct StoreLocation {
  // HOST:PORT of a checkpoint_store service.
  std::string address;
  // With address: the bearer token the service wants (empty: none).
  std::string auth_token;
  // With address: TLS towards the service (CA, and a client certificate for mutual TLS);
  // plaintext when tls.ca_file is empty.
  ClientTlsOptions tls;
  // A RocksDB store directory, opened in this process (no other process may have it open).
  std::string directory;
  // With directory: create an empty store when there is none.
  bool create_if_missing = false;
  // With directory: where its chunk bytes live (StoreOptions::chunk_backend); null: pack files.
  std::shared_ptr<ChunkBackend> chunk_backend;

  // "DIR" or "HOST:PORT", for messages.
  std::string ToString() const { return address.empty() ? directory : address; }
};

// The store-client flags as given (libs/server/service_flags.h: --store, --store_dir,
// --store_auth_token_file, --store_tls_*); empty strings are flags not given.
struct StoreClientFlags {
  std::string store;
  std::string store_dir;
  std::string auth_token_file;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // The binary's default --store_dir ("ckpt-data" for the trainer, none for the loader): a
  // --store given beside a store_dir other than this names two stores.
  std::string store_dir_default;
};

// The location `flags` name: the service --store names when given (its token read from the
// file), else the directory --store_dir names. INVALID_ARGUMENT unless exactly one of them is
// given (a default --store_dir yields to --store), or for --store_auth_token_file or
// --store_tls_* without --store; the errors of ReadAuthTokenFile.
absl::StatusOr<StoreLocation> StoreLocationFromFlags(const StoreClientFlags& flags);

// A directory's store comes wrapped in an AuditedStore (libs/store/audited_store.h) naming this
// process's user, "local:<user name>" from peer "local", so changes made in-process are audited as
// a server audits its callers; a remote store is returned as it is (its server audits).
//
// INVALID_ARGUMENT unless exactly one of address and directory is given, or for an auth_token
// without an address; otherwise the errors of RocksDbCheckpointStore::Open (NOT_FOUND for a
// directory without a store and !create_if_missing) or RemoteCheckpointStore::Connect
// (UNAVAILABLE naming the address).
absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenCheckpointStore(const StoreLocation& location);

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_OPEN_STORE_H_
