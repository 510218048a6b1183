#include "libs/client/open_store.h"

#include <utility>

#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_macros.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {

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
    ASSIGN_OR_RETURN(std::unique_ptr<RemoteCheckpointStore> store,
                     RemoteCheckpointStore::Connect(options));
    return std::unique_ptr<CheckpointStore>(std::move(store));
  }
  if (!location.auth_token.empty()) {
    return absl::InvalidArgumentError(
        "an auth token goes with a store service's address, not a store directory");
  }
  StoreOptions options;
  options.db_path = location.directory;
  options.create_if_missing = location.create_if_missing;
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(options));
  return std::unique_ptr<CheckpointStore>(std::move(store));
}

}  // namespace ckpt
