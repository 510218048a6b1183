#ifndef CKPT_LIBS_RPC_CLIENT_CHANNEL_H_
#define CKPT_LIBS_RPC_CLIENT_CHANNEL_H_

// The one way ckpt's clients (RemoteCheckpointStore, RemoteLoader) reach a service: options of
// one shape, channel credentials (plaintext or TLS / mutual TLS), the bearer token, deadlines,
// and retries.
//
// Retries come in two kinds, each written once here:
//  - Unary calls that only read are retried by gRPC itself, from the channel's service config
//    (a `retryPolicy` on UNAVAILABLE for the methods the client names; see gRFC A6). They stay
//    fail-fast (`waitForReady: false`): a server that is down gives UNAVAILABLE naming its
//    address once the retries are spent, not DEADLINE_EXCEEDED a minute later. Calls that change
//    the server are sent once, after WaitUntilConnected.
//  - Streams whose partial result the client throws away (a Load, an Export, a Download before
//    its manifest) are restarted from the beginning by RestartOnUnavailable: gRPC cannot retry a
//    stream once a response has arrived. A restart waits for the channel to reconnect first.
//
// Example:
//   ClientOptions options;
//   options.address = "store.example.com:7070";
//   options.tls.ca_file = "/etc/ckpt/ca.pem";
//   ASSIGN_OR_RETURN(std::shared_ptr<ClientChannel> channel,
//                    ClientChannel::Open(options, {"ckpt.v1.CheckpointStore", "checkpoint store",
//                                                  {"GetManifest", "ListVersions"}}));
//   auto stub = v1::CheckpointStore::NewStub(channel->channel());
//   std::unique_ptr<grpc::ClientContext> context = channel->NewContext(absl::Now() +
//   options.deadline);

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace ckpt {

// TLS towards the server. Plaintext when ca_file is empty.
struct ClientTlsOptions {
  // PEM file of the CA(s) that signed the server's certificate. Setting it turns TLS on.
  std::string ca_file;
  // PEM certificate chain and private key this client presents (mutual TLS). Both or neither.
  std::string cert_file;
  std::string key_file;
  // Name the server's certificate must carry when it differs from the host in `address`
  // (e.g. connecting by IP to a certificate issued for a DNS name). Empty: the address's host.
  std::string server_name;
};

// How a client reaches one server. The same shape for every ckpt client.
struct ClientOptions {
  // HOST:PORT of the server. Required.
  std::string address;
  // Sent with every call as "authorization: Bearer <auth_token>"; empty sends none. Printable
  // ASCII without spaces.
  std::string auth_token;
  // TLS (and the client's certificate for mutual TLS); plaintext by default.
  ClientTlsOptions tls;
  // Deadline of each unary call, retries included. Default 60 s.
  absl::Duration deadline = absl::Seconds(60);
  // Deadline of calls whose duration grows with the data: streams (so also the lifetime of an
  // upload session or reader) and long maintenance calls, restarts included. Default 1 hour.
  absl::Duration stream_deadline = absl::Hours(1);
  // Retries of a read-only call or a restartable stream that failed with UNAVAILABLE (0: none).
  // gRPC makes at most 5 attempts of a unary call, so unary calls retry at most 4 times.
  // Default 3.
  int max_retries = 3;
  // Wait before the first retry; doubles for each further one (gRPC jitters its waits).
  // Default 100 ms.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // How long Open, and each call that changes the server, waits for the channel to connect.
  // Default 10 s.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Largest message accepted from the server, in bytes (manifests of very large models, listing
  // pages). Default 64 MiB.
  int max_receive_message_bytes = 64 << 20;
};

// What a client tells ClientChannel about the service it calls.
struct ServiceSpec {
  // Full proto name, e.g. "ckpt.v1.CheckpointStore".
  std::string full_name;
  // How messages name the server: "checkpoint store" -> "checkpoint store at HOST:PORT: ...".
  std::string noun;
  // Unary methods safe to send again (they only read): gRPC retries these on UNAVAILABLE.
  std::vector<std::string> retried_methods;
};

// The gRPC service config for `service` under `options`: retryPolicy for its retried methods.
// Exposed for tests.
std::string RetryServiceConfig(const ClientOptions& options, const ServiceSpec& service);

class ClientChannel {
 public:
  // Checks `options` (INVALID_ARGUMENT naming the field; NOT_FOUND / INVALID_ARGUMENT for
  // unreadable TLS files), opens the channel and waits up to connect_timeout for it:
  // UNAVAILABLE naming the server and its address when it does not connect.
  static absl::StatusOr<std::shared_ptr<ClientChannel>> Open(const ClientOptions& options,
                                                             const ServiceSpec& service);

  const ClientOptions& options() const { return options_; }
  // For unary calls: carries the retry service config.
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // For streams (Upload, Download, Load, Export): the same server without the retry service
  // config, which costs streams throughput (gRPC then runs every call through its retry
  // machinery); streams restart through RestartOnUnavailable instead.
  const std::shared_ptr<grpc::Channel>& stream_channel() const { return stream_channel_; }
  // "checkpoint store at HOST:PORT".
  std::string ServerName() const;

  // A context for one call that must end by `deadline`, carrying the bearer token.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const;

  // OK once both channels are connected; UNAVAILABLE naming the server when they are not within
  // connect_timeout (or by `deadline`, if sooner). Nothing has been sent when this fails.
  absl::Status WaitUntilConnected(absl::Time deadline) const;

  // A call's status as an absl::Status; UNAVAILABLE names the server (gRPC's own messages, e.g.
  // "connection refused", do not).
  absl::Status FromCall(const grpc::Status& status) const;

  // Runs `attempt` with a fresh context it owns (deadline `timeout` from now, bearer token; a
  // stream that outlives the attempt keeps it) and, while it
  // returns UNAVAILABLE, runs it again from the start up to max_retries times, backing off from
  // initial_backoff, all within the deadline. Before each restart it waits up to connect_timeout
  // for the channel (UNAVAILABLE naming the server when it does not reconnect). `attempt` must
  // discard what an earlier attempt received.
  absl::Status RestartOnUnavailable(
      absl::Duration timeout,
      const std::function<absl::Status(std::unique_ptr<grpc::ClientContext> context)>& attempt)
      const;

 private:
  ClientChannel(ClientOptions options, ServiceSpec service, std::shared_ptr<grpc::Channel> channel,
                std::shared_ptr<grpc::Channel> stream_channel);

  const ClientOptions options_;
  const ServiceSpec service_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::shared_ptr<grpc::Channel> stream_channel_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_CLIENT_CHANNEL_H_
