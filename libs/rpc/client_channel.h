#ifndef CKPT_LIBS_RPC_CLIENT_CHANNEL_H_
#define CKPT_LIBS_RPC_CLIENT_CHANNEL_H_

// The one way ckpt's clients (RemoteCheckpointStore, RemoteLoader) reach a service: options of
// one shape, channel credentials (plaintext or TLS / mutual TLS), the bearer token, deadlines,
// and retries.
//
// Retries are ours, written once here (RestartOnUnavailable), for unary calls and streams alike:
//  - Unary calls that only read (the methods the ServiceSpec names in retried_methods) are
//    retried on UNAVAILABLE by CallUnary, up to max_retries times with backoff. They stay
//    fail-fast (no wait_for_ready): a server that is down gives UNAVAILABLE naming it and its
//    address once the retries are spent, not DEADLINE_EXCEEDED a minute later. Calls that change
//    the server are sent once, after WaitUntilConnected.
//  - Streams whose partial result the client throws away (a Load, an Export, a Download before
//    its manifest) are restarted from the beginning the same way: gRPC cannot retry a stream
//    once a response has arrived.
// A restart waits for the channel to reconnect first.
//
// Why not gRPC's own retries (a `retryPolicy` in a service config, gRFC A6): with one, gRPC runs
// every call on the channel through its retry machinery, streams included, and that cost a
// 256 MiB Download 10-45% of its throughput (docs/benchmarks/history.md, paired R4 runs); a second
// channel for streams only won part of it back. So the channel has no service config and gRPC's
// retries are switched off (GRPC_ARG_ENABLE_RETRIES = 0): one channel carries every call.
//
// Several servers of one service (a loader fleet): `address` may list them, HOST:PORT,HOST:PORT
// (IP literals), or name them in DNS, dns:///NAME:PORT. The channel then spreads calls over them
// with gRPC's own round_robin policy and client-side health checking (gRFC A17): a server whose
// grpc.health.v1 status for the service is not SERVING (draining, or reported so) gets no new
// calls, and one that goes away is dropped from the rotation when its connection breaks. That is
// the only service config the channel ever has: no retryPolicy, retries stay off as above. A
// single HOST:PORT keeps pick_first and no service config, as before.
//
// Example:
//   ClientOptions options;
//   options.address = "store.example.com:7070";
//   options.tls.ca_file = "/etc/ckpt/ca.pem";
//   ASSIGN_OR_RETURN(std::shared_ptr<ClientChannel> channel,
//                    ClientChannel::Open(options, {"ckpt.v1.CheckpointStore", "checkpoint store",
//                                                  {"GetManifest", "ListVersions"}}));
//   auto stub = v1::CheckpointStore::NewStub(channel->channel());
//   v1::Manifest manifest;
//   RETURN_IF_ERROR(channel->CallUnary("GetManifest", options.deadline,
//                                      [&](grpc::ClientContext* context) {
//                                        manifest.Clear();
//                                        return stub->GetManifest(context, request, &manifest);
//                                      }));

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
#include "libs/io/backoff.h"

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
  // HOST:PORT of the server. Required. Or several servers of the service, round-robin with
  // health checks (see above): HOST:PORT,HOST:PORT,... with IP literals of one family
  // ("10.0.0.1:7070,10.0.0.2:7070", "[::1]:7070,[::1]:7071"), or dns:///NAME:PORT (every
  // address NAME resolves to). With TLS and a list, tls.server_name is required (the list is no
  // host name a certificate can carry).
  std::string address;
  // Sent with every call as "authorization: Bearer <auth_token>"; empty sends none. Printable
  // ASCII without spaces.
  std::string auth_token;
  // For a front end that terminates its users' mutual TLS (the console): the names of the user's
  // verified certificate, sent with every call as ckpt-forwarded-certificate metadata so that the
  // server treats the call as that user's (libs/auth/access_policy.h, "Forwarded certificates").
  // Printable ASCII. Empty: none.
  std::vector<std::string> forwarded_certificate_names;
  // TLS (and the client's certificate for mutual TLS); plaintext by default.
  ClientTlsOptions tls;
  // Deadline of each unary call, retries included. Default 60 s.
  absl::Duration deadline = absl::Seconds(60);
  // Deadline of calls whose duration grows with the data: streams (so also the lifetime of an
  // upload session or reader) and long maintenance calls, restarts included. Default 1 hour.
  absl::Duration stream_deadline = absl::Hours(1);
  // Retries of a read-only call or a restartable stream that failed with UNAVAILABLE (0: none).
  // Default 3.
  int max_retries = 3;
  // Wait before the first retry; doubles for each further one, up to 5 s, each wait shortened by
  // up to a fifth at random (RetryBackoff). Default 100 ms.
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
  // Unary methods safe to send again (they only read), e.g. "GetManifest": CallUnary retries
  // these on UNAVAILABLE and sends every other method once.
  std::vector<std::string> retried_methods;
};

// What ClientChannel::Open dials for `address` (ClientOptions::address).
struct ChannelTarget {
  // The gRPC target: `address` itself for one HOST:PORT or a dns:/// name, else
  // "ipv4:A:P,B:Q" / "ipv6:[A]:P,[B]:Q".
  std::string target;
  // Empty for one HOST:PORT (pick_first, no service config). For a list or a DNS name: JSON
  // selecting round_robin with health checks of `health_service` -- and no retryPolicy.
  std::string service_config;
  // Whether `target` stands for several servers (a list or a DNS name).
  bool balanced = false;
};

// INVALID_ARGUMENT naming the entry for an empty entry, a list entry that is not an IP literal
// with a port (use dns:///NAME:PORT for names), or a list mixing IPv4 and IPv6.
absl::StatusOr<ChannelTarget> ChannelTargetFor(absl::string_view address,
                                               absl::string_view health_service);

class ClientChannel {
 public:
  // Checks `options` (INVALID_ARGUMENT naming the field; NOT_FOUND / INVALID_ARGUMENT for
  // unreadable TLS files), opens the channel and waits up to connect_timeout for it:
  // UNAVAILABLE naming the server and its address when it does not connect.
  static absl::StatusOr<std::shared_ptr<ClientChannel>> Open(const ClientOptions& options,
                                                             const ServiceSpec& service);

  const ClientOptions& options() const { return options_; }
  // For every call, unary and streaming. gRPC's retries are off; no service config but the
  // round-robin one of a list or DNS name (ChannelTargetFor).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // "checkpoint store at HOST:PORT" (the list, or the dns:/// name, for several).
  std::string ServerName() const;

  // The pacing of this client's retries and resumptions that must end by `deadline`:
  // initial_backoff, doubling up to 5 s, jittered (libs/io/backoff.h). Every retry loop over
  // this channel (unary calls, the loader's stream resumptions, the watch's reconnects) uses it.
  Backoff RetryBackoff(absl::Time deadline) const;

  // A context for one call that must end by `deadline`, carrying the bearer token.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const;

  // OK once the channel is connected; UNAVAILABLE naming the server when it is not within
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

  // One unary call of the service's method `method` (e.g. "GetManifest"), all attempts within
  // `timeout` from now: `call` makes it with the context it is given and returns its status
  // (and must discard what an earlier attempt received). A method in retried_methods goes
  // through RestartOnUnavailable; any other is sent once, after WaitUntilConnected. The result
  // is FromCall's.
  absl::Status CallUnary(
      absl::string_view method, absl::Duration timeout,
      const std::function<grpc::Status(grpc::ClientContext* context)>& call) const;

 private:
  ClientChannel(ClientOptions options, ServiceSpec service, std::shared_ptr<grpc::Channel> channel);

  const ClientOptions options_;
  const ServiceSpec service_;
  const std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_CLIENT_CHANNEL_H_
