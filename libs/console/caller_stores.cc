#include "libs/console/caller_stores.h"

#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_macros.h"

namespace ckpt {

absl::StatusOr<std::shared_ptr<CheckpointStore>> CallerStores::For(const std::string& token) {
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(token);
    if (it != stores_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second.position);
      return it->second.store;
    }
  }
  // Connecting waits for the channel: not under the lock, so one slow caller holds up no other.
  ClientOptions options = options_;
  options.auth_token = token;
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteCheckpointStore> connected,
                   RemoteCheckpointStore::Connect(options));
  std::shared_ptr<CheckpointStore> store = std::move(connected);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = stores_.try_emplace(token);
  if (!inserted) {  // another request for the same caller connected first: use its client.
    recency_.splice(recency_.begin(), recency_, it->second.position);
    return it->second.store;
  }
  recency_.push_front(token);
  it->second = Entry{store, recency_.begin()};
  while (stores_.size() > capacity_) {
    stores_.erase(recency_.back());
    recency_.pop_back();
  }
  return store;
}

}  // namespace ckpt
