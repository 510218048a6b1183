#ifndef CKPT_LIBS_HA_ETCD_CLIENT_H_
#define CKPT_LIBS_HA_ETCD_CLIENT_H_

// EtcdClient: the few etcd v3 calls a writer lease needs (issue #53), over etcd's JSON gateway
// (HTTP on the client port: POST /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke,
// /v3/kv/txn, /v3/kv/range), since Debian ships no C++ etcd client and the gateway is part of
// every etcd 3.x server. Keys and values travel base64-encoded, as the gateway wants.
//
// Several endpoints ("http://10.0.0.1:2379,http://10.0.0.2:2379"): each call tries them in turn
// until one answers, so one dead etcd member does not stop the store; etcd itself makes any
// member's answer linearizable (the gateway's range reads are, by default).
//
// TLS: https:// endpoints are verified against `ca_file` (else the system's CAs); with
// `cert_file` / `key_file` the client presents a certificate, for a cluster started with
// --client-cert-auth (who may hold the writer's lease is then who holds such a certificate).
//
// Errors: an unreachable cluster is UNAVAILABLE naming every endpoint tried; an answer that is
// not what the gateway sends is INTERNAL with its body. Thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::ha {

struct EtcdClientOptions {
  // "http://HOST:PORT" URLs, comma-separated. Required.
  std::string endpoints;
  // Per attempt; keep it below the lease TTL so a keep-alive can try another member in time.
  absl::Duration request_timeout = absl::Seconds(1);
  // PEM files for https:// endpoints: the CA that signed the members' certificates (empty: the
  // system's), and this client's certificate and key (both or neither).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// A key's value and the lease that holds it (0: none).
struct EtcdValue {
  std::string value;
  int64_t lease = 0;
  int64_t create_revision = 0;
};

class EtcdClient {
 public:
  // INVALID_ARGUMENT for no endpoint or one that is not http(s)://, TLS files with http://
  // endpoints, or only one of cert_file and key_file; NOT_FOUND naming a TLS file that cannot be
  // read.
  static absl::StatusOr<EtcdClient> Create(EtcdClientOptions options);

  // A new lease of `ttl` (whole seconds, >= 1); its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews `lease`; the TTL it has again. NOT_FOUND once it expired or was revoked.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease);
  // Ends `lease` (its keys go with it). OK when it is gone already.
  absl::Status RevokeLease(int64_t lease);

  // Creates `key` = `value` held by `lease` unless the key exists: true when this call created
  // it; false, with the holder's value in `*holder`, when it exists.
  absl::StatusOr<bool> CreateIfAbsent(absl::string_view key, absl::string_view value,
                                      int64_t lease, EtcdValue* holder);
  // The key's value; nullopt when absent.
  absl::StatusOr<std::optional<EtcdValue>> Get(absl::string_view key);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  EtcdClient(std::vector<std::string> endpoints, EtcdClientOptions options)
      : endpoints_(std::move(endpoints)), timeout_(options.request_timeout),
        options_(std::move(options)) {}
  // POSTs `body` to `path` on the first endpoint that answers; the parsed body's text.
  absl::StatusOr<std::string> Post(absl::string_view path, const std::string& body);

  std::vector<std::string> endpoints_;
  absl::Duration timeout_;
  EtcdClientOptions options_;  // its TLS files.
};

}  // namespace ckpt::ha

#endif  // CKPT_LIBS_HA_ETCD_CLIENT_H_
