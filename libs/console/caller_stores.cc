#include "libs/console/caller_stores.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_macros.h"
#include "proto/ckpt/v1/identity.grpc.pb.h"

namespace ckpt {

absl::StatusOr<std::shared_ptr<CheckpointStore>> CallerStores::For(
    const CallerCredentials& caller) {
  ASSIGN_OR_RETURN(const std::shared_ptr<const Clients> clients, ClientsFor(caller));
  return clients->store;
}

absl::StatusOr<v1::WhoAmIResponse> CallerStores::WhoAmI(const CallerCredentials& caller,
                                                        const v1::WhoAmIRequest& request) {
  ASSIGN_OR_RETURN(const std::shared_ptr<const Clients> clients, ClientsFor(caller));
  auto stub = v1::Identity::NewStub(clients->identity->channel());
  v1::WhoAmIResponse response;
  RETURN_IF_ERROR(
      clients->identity->CallUnary("WhoAmI", options_.deadline, [&](grpc::ClientContext* context) {
        response.Clear();
        return stub->WhoAmI(context, request, &response);
      }));
  return response;
}

absl::StatusOr<std::shared_ptr<const CallerStores::Clients>> CallerStores::ClientsFor(
    const CallerCredentials& caller) {
  // Tokens hold no newline (ClientChannel refuses them), so the key cannot be forged by another
  // token that looks like a token plus certificate names.
  const std::string key =
      absl::StrCat(caller.bearer_token, "\n", absl::StrJoin(caller.certificate_names, "\n"));
  {
    absl::MutexLock lock(&mu_);
    auto it = clients_.find(key);
    if (it != clients_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second.position);
      return it->second.clients;
    }
  }
  // Connecting waits for the channel: not under the lock, so one slow caller holds up no other.
  ClientOptions options = options_;
  options.auth_token = caller.bearer_token;
  options.forwarded_certificate_names = caller.certificate_names;
  auto clients = std::make_shared<Clients>();
  ASSIGN_OR_RETURN(clients->store, RemoteCheckpointStore::Connect(options));
  ASSIGN_OR_RETURN(
      clients->identity,
      ClientChannel::Open(options, {"ckpt.v1.Identity", "checkpoint store", {"WhoAmI"}}));
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = clients_.try_emplace(key);
  if (!inserted) {  // another request for the same caller connected first: use its clients.
    recency_.splice(recency_.begin(), recency_, it->second.position);
    return it->second.clients;
  }
  recency_.push_front(key);
  it->second = Entry{clients, recency_.begin()};
  while (clients_.size() > capacity_) {
    clients_.erase(recency_.back());
    recency_.pop_back();
  }
  return std::shared_ptr<const Clients>(std::move(clients));
}

}  // namespace ckpt
