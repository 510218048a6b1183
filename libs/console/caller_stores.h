#ifndef CKPT_LIBS_CONSOLE_CALLER_STORES_H_
#define CKPT_LIBS_CONSOLE_CALLER_STORES_H_

// CallerStores: store clients that act for the console's callers. Each is a RemoteCheckpointStore
// whose calls carry one caller's bearer token, so the store authorizes the caller, never the
// console (which has no token of its own). Kept for reuse by token, at most `capacity` of them;
// the least recently used is dropped first.
//
// Thread-safe.
//
// Example:
//   CallerStores stores(options);   // options.address: the store service; no auth_token
//   ConsoleApi api([&](const std::string& token) { return stores.For(token); });

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/rpc/client_channel.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt {

class CallerStores {
 public:
  // `options` say where the store is and how to reach it (TLS); their auth_token is ignored.
  explicit CallerStores(ClientOptions options, size_t capacity = 64)
      : options_(std::move(options)), capacity_(capacity == 0 ? 1 : capacity) {}

  // The client for the holder of `token` (empty: a caller who sent none). Errors of
  // RemoteCheckpointStore::Connect (UNAVAILABLE when the store does not answer; INVALID_ARGUMENT
  // for a token that cannot be sent as a header).
  absl::StatusOr<std::shared_ptr<CheckpointStore>> For(const std::string& token);

 private:
  using Recency = std::list<std::string>;  // tokens, most recently used first.
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
