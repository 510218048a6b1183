#include "libs/console/caller_stores.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/client/who_am_i.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// What the caller's credentials become on the wire: certificate names that metadata cannot carry
// (control or non-ASCII characters) are left out, as no listed certificate could match them
// there anyway.
ClientOptions CallerOptions(ClientOptions options, const CallerCredentials& caller) {
  options.auth_token = caller.bearer_token;
  options.forwarded_certificate_names.clear();
  for (const std::string& name : caller.certificate_names) {
    if (std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c <= 0x7e; })) {
      options.forwarded_certificate_names.push_back(name);
    }
  }
  return options;
}

// The cache key: each part length-prefixed, so that no token or name can pose as another split.
std::string CallerKey(const CallerCredentials& caller) {
  std::string key = absl::StrCat(caller.bearer_token.size(), ":", caller.bearer_token);
  for (const std::string& name : caller.certificate_names) {
    absl::StrAppend(&key, name.size(), ":", name);
  }
  return key;
}

}  // namespace

absl::StatusOr<std::shared_ptr<CheckpointStore>> CallerStores::For(
    const CallerCredentials& caller) {
  const std::string key = CallerKey(caller);
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(key);
    if (it != stores_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second.position);
      return it->second.store;
    }
  }
  // Connecting waits for the channel: not under the lock, so one slow caller holds up no other.
  ASSIGN_OR_RETURN(std::shared_ptr<CheckpointStore> store,
                   RemoteCheckpointStore::Connect(CallerOptions(options_, caller)));
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = stores_.try_emplace(key);
  if (!inserted) {  // another request for the same caller connected first: use its client.
    recency_.splice(recency_.begin(), recency_, it->second.position);
    return it->second.store;
  }
  recency_.push_front(key);
  it->second = Entry{store, recency_.begin()};
  while (stores_.size() > capacity_) {
    stores_.erase(recency_.back());
    recency_.pop_back();
  }
  return store;
}

absl::StatusOr<v1::WhoAmIResponse> CallerStores::WhoAmI(const CallerCredentials& caller,
                                                        const v1::WhoAmIRequest& request) {
  // A channel of its own, opened when asked (the page asks once per view): against a store that
  // predates ckpt.v1.Identity this call alone fails (UNIMPLEMENTED), nothing else.
  return ckpt::WhoAmI(CallerOptions(options_, caller), request, "checkpoint store");
}

}  // namespace ckpt
