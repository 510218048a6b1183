#ifndef CKPT_LIBS_CONSOLE_CALLER_STORES_H_
#define CKPT_LIBS_CONSOLE_CALLER_STORES_H_

// CallerStores: store clients that act for the console's callers. Each is a RemoteCheckpointStore
// whose calls carry one caller's credentials -- its bearer token, or under mutual TLS the names
// of its verified client certificate as ckpt-forwarded-certificate metadata (the console's own
// certificate, which the store must list as a forwarding front end, carries them; see
// libs/auth/access_policy.h) -- so the store authorizes the caller, never the console (which has
// no token or role of its own). Kept for reuse by credentials, at most `capacity` of them; the
// least recently used is dropped first.
//
// Thread-safe.
//
// Example:
//   CallerStores stores(options);   // options.address: the store service; no auth_token
//   ConsoleApi api([&](const CallerCredentials& caller) { return stores.For(caller); }, address,
//                  [&](const CallerCredentials& caller, const v1::WhoAmIRequest& request) {
//                    return stores.WhoAmI(caller, request);
//                  });

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/console/console_api.h"
#include "libs/rpc/client_channel.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/identity.pb.h"

namespace ckpt {

class CallerStores {
 public:
  // `options` say where the store is and how to reach it (TLS, and the console's own certificate
  // for forwarding); their auth_token and forwarded names are the caller's, set per caller.
  explicit CallerStores(ClientOptions options, size_t capacity = 64)
      : options_(std::move(options)), capacity_(capacity == 0 ? 1 : capacity) {}

  // The store client for `caller` (no credentials: a caller who sent none). Errors of
  // RemoteCheckpointStore::Connect (UNAVAILABLE when the store does not answer; INVALID_ARGUMENT
  // for a token that cannot be sent as a header).
  absl::StatusOr<std::shared_ptr<CheckpointStore>> For(const CallerCredentials& caller);

  // The store's ckpt.v1.Identity/WhoAmI answer for `caller` (UNIMPLEMENTED from a store that
  // predates it).
  absl::StatusOr<v1::WhoAmIResponse> WhoAmI(const CallerCredentials& caller,
                                            const v1::WhoAmIRequest& request);

 private:
  using Recency = std::list<std::string>;  // keys, most recently used first.
  struct Entry {
    std::shared_ptr<CheckpointStore> store;
    Recency::iterator position;
  };

  const ClientOptions options_;
  const size_t capacity_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> stores_ ABSL_GUARDED_BY(mu_);
  Recency recency_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt

#endif  // CKPT_LIBS_CONSOLE_CALLER_STORES_H_
