#include "libs/rpc/client_channel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "libs/io/read_file.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// gRPC makes at most this many attempts of one call, whatever the service config asks
// (gRFC A6: maxAttempts above 5 is treated as 5).
constexpr int kGrpcMaxAttempts = 5;
// The longest wait between retries, and between reconnection attempts.
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);

std::string JsonSeconds(absl::Duration duration) {
  // gRPC rejects a zero initialBackoff; a millisecond is the shortest wait worth writing.
  return absl::StrFormat("%.3fs", std::max(absl::ToDoubleSeconds(duration), 0.001));
}

absl::Status ValidateOptions(const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("client options: address is empty (want HOST:PORT)");
  }
  for (char c : options.auth_token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "client options: auth_token holds whitespace, control or non-ASCII characters");
    }
  }
  if (options.deadline <= absl::ZeroDuration() || options.stream_deadline <= absl::ZeroDuration() ||
      options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "client options: deadline, stream_deadline and connect_timeout must be positive");
  }
  if (options.max_retries < 0 || options.initial_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "client options: max_retries and initial_backoff must not be negative");
  }
  if (options.max_receive_message_bytes <= 0) {
    return absl::InvalidArgumentError("client options: max_receive_message_bytes must be positive");
  }
  const ClientTlsOptions& tls = options.tls;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "client options: a client certificate needs both tls.cert_file and tls.key_file");
  }
  if (tls.ca_file.empty() && (!tls.cert_file.empty() || !tls.server_name.empty())) {
    return absl::InvalidArgumentError(
        "client options: tls.cert_file, tls.key_file and tls.server_name need tls.ca_file (the "
        "CA that signed the server's certificate)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const ClientTlsOptions& tls) {
  if (tls.ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(tls.ca_file, "tls.ca_file"));
  if (!tls.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadSmallFile(tls.cert_file, "tls.cert_file"));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadSmallFile(tls.key_file, "tls.key_file"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

std::string RetryServiceConfig(const ClientOptions& options, const ServiceSpec& service) {
  const int attempts = std::min(options.max_retries + 1, kGrpcMaxAttempts);
  if (attempts < 2 || service.retried_methods.empty()) return "{}";
  std::vector<std::string> names;
  for (const std::string& method : service.retried_methods) {
    names.push_back(
        absl::StrFormat(R"({"service":"%s","method":"%s"})", service.full_name, method));
  }
  return absl::StrFormat(
      R"({"methodConfig":[{"name":[%s],"waitForReady":false,"retryPolicy":{"maxAttempts":%d,)"
      R"("initialBackoff":"%s","maxBackoff":"%s","backoffMultiplier":2,)"
      R"("retryableStatusCodes":["UNAVAILABLE"]}}]})",
      absl::StrJoin(names, ","), attempts, JsonSeconds(options.initial_backoff),
      JsonSeconds(kMaxBackoff));
}

absl::StatusOr<std::shared_ptr<ClientChannel>> ClientChannel::Open(const ClientOptions& options,
                                                                   const ServiceSpec& service) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, Credentials(options.tls));
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  // Reconnect about as fast as calls retry, so a restarted server is found within the retries.
  const int backoff_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.initial_backoff), 10, 1000));
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, backoff_ms);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                   static_cast<int>(absl::ToInt64Milliseconds(kMaxBackoff)));
  if (!options.tls.server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls.server_name);
  }
  // Streams get a channel without the retry service config: with one, a 256 MiB Download
  // streamed at 0.9-1.5 GiB/s instead of 1.6-1.8 GiB/s (BENCHMARKS.md, paired R4 runs).
  grpc::ChannelArguments stream_arguments = arguments;
  // Its own connection, not one shared with the unary channel through gRPC's global pool.
  stream_arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::Channel> stream_channel =
      grpc::CreateCustomChannel(options.address, credentials, stream_arguments);
  arguments.SetServiceConfigJSON(RetryServiceConfig(options, service));
  std::shared_ptr<grpc::Channel> unary_channel =
      grpc::CreateCustomChannel(options.address, credentials, arguments);
  std::shared_ptr<ClientChannel> channel(
      new ClientChannel(options, service, std::move(unary_channel), std::move(stream_channel)));
  RETURN_IF_ERROR(channel->WaitUntilConnected(absl::Now() + options.connect_timeout));
  return channel;
}

ClientChannel::ClientChannel(ClientOptions options, ServiceSpec service,
                             std::shared_ptr<grpc::Channel> channel,
                             std::shared_ptr<grpc::Channel> stream_channel)
    : options_(std::move(options)),
      service_(std::move(service)),
      channel_(std::move(channel)),
      stream_channel_(std::move(stream_channel)) {}

std::string ClientChannel::ServerName() const {
  return absl::StrCat(service_.noun, " at ", options_.address);
}

std::unique_ptr<grpc::ClientContext> ClientChannel::NewContext(absl::Time deadline) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.auth_token));
  }
  return context;
}

absl::Status ClientChannel::WaitUntilConnected(absl::Time deadline) const {
  const absl::Time limit = std::min(deadline, absl::Now() + options_.connect_timeout);
  bool connected = true;
  for (const std::shared_ptr<grpc::Channel>& channel : {channel_, stream_channel_}) {
    if (channel->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) continue;
    connected = connected && channel->WaitForConnected(absl::ToChronoTime(limit));
  }
  if (connected) return absl::OkStatus();
  std::string why = absl::StrCat("cannot connect to the ", ServerName(), " within ",
                                 absl::FormatDuration(options_.connect_timeout));
  if (!options_.tls.ca_file.empty()) {
    // A TLS handshake that fails looks the same to the channel as a server that is down.
    absl::StrAppend(&why, " (TLS: check that the server's certificate is signed by ",
                    options_.tls.ca_file, " and names the host",
                    options_.tls.cert_file.empty()
                        ? ", and whether it requires a client certificate"
                        : ", and that it accepts this client's certificate",
                    ")");
  }
  return absl::UnavailableError(why);
}

absl::Status ClientChannel::FromCall(const grpc::Status& status) const {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return FromGrpcStatus(status);
  return absl::UnavailableError(absl::StrCat(ServerName(), ": ", status.error_message()));
}

absl::Status ClientChannel::RestartOnUnavailable(
    absl::Duration timeout,
    const std::function<absl::Status(std::unique_ptr<grpc::ClientContext> context)>& attempt)
    const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = options_.initial_backoff;
  for (int retry = 0;; ++retry) {
    // A restart first waits (up to connect_timeout) for the channel to reconnect, so a server
    // that is restarting is found and one that stays down is reported as UNAVAILABLE.
    if (retry > 0) RETURN_IF_ERROR(WaitUntilConnected(deadline));
    absl::Status status = attempt(NewContext(deadline));
    if (!absl::IsUnavailable(status) || retry >= options_.max_retries ||
        absl::Now() + backoff >= deadline) {
      return status;
    }
    absl::SleepFor(backoff);
    backoff *= 2;
  }
}

}  // namespace ckpt
