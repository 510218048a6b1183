#include "libs/rpc/client_channel.h"

#include <arpa/inet.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "libs/auth/metadata.h"
#include "libs/io/read_file.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// The longest wait between retries, and between reconnection attempts.
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);

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
  for (const std::string& name : options.forwarded_certificate_names) {
    for (char c : name) {
      if (c < 0x20 || c > 0x7e) {
        return absl::InvalidArgumentError(
            "client options: a forwarded certificate name holds control or non-ASCII characters");
      }
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

// One HOST:PORT of a list: the IP family (4 or 6) of its literal host, 0 when it is none.
int FamilyOfEntry(absl::string_view entry) {
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos) return 0;
  int port = 0;
  if (!absl::SimpleAtoi(entry.substr(colon + 1), &port) || port < 1 || port > 65535) return 0;
  absl::string_view host = entry.substr(0, colon);
  unsigned char address[16];
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
    return inet_pton(AF_INET6, std::string(host).c_str(), address) == 1 ? 6 : 0;
  }
  return inet_pton(AF_INET, std::string(host).c_str(), address) == 1 ? 4 : 0;
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

absl::StatusOr<ChannelTarget> ChannelTargetFor(absl::string_view address,
                                               absl::string_view health_service) {
  ChannelTarget result;
  // round_robin with client-side health checks (gRFC A17), and nothing else: no retryPolicy
  // (see the header), so gRPC's retry machinery stays out of every call.
  const std::string balanced_config =
      absl::StrCat(R"({"loadBalancingConfig":[{"round_robin":{}}],)",
                   R"("healthCheckConfig":{"serviceName":")", health_service, R"("}})");
  if (absl::StartsWith(address, "dns:")) {
    result.target = std::string(address);
    result.service_config = balanced_config;
    result.balanced = true;
    return result;
  }
  if (!absl::StrContains(address, ',')) {
    result.target = std::string(address);  // one server: pick_first, as always.
    return result;
  }
  std::vector<std::string> entries;
  int family = 0;
  for (absl::string_view entry : absl::StrSplit(address, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const int entry_family = FamilyOfEntry(entry);
    if (entry_family == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client options: address list entry '", entry,
          "' is not IP:PORT or [IPv6]:PORT (a list names servers by IP; for a host name that "
          "resolves to several servers use dns:///NAME:PORT)"));
    }
    if (family != 0 && entry_family != family) {
      return absl::InvalidArgumentError(
          absl::StrCat("client options: address list '", address, "' mixes IPv4 and IPv6 servers"));
    }
    family = entry_family;
    entries.emplace_back(entry);
  }
  result.target = absl::StrCat(family == 4 ? "ipv4:" : "ipv6:", absl::StrJoin(entries, ","));
  result.service_config = balanced_config;
  result.balanced = true;
  return result;
}

Backoff ClientChannel::RetryBackoff(absl::Time deadline) const {
  return Backoff(BackoffPolicy{options_.initial_backoff, kMaxBackoff, 2.0, 0.2}, deadline);
}

absl::StatusOr<std::shared_ptr<ClientChannel>> ClientChannel::Open(const ClientOptions& options,
                                                                   const ServiceSpec& service) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(const ChannelTarget target,
                   ChannelTargetFor(options.address, service.full_name));
  if (target.balanced && !absl::StartsWith(target.target, "dns:") && !options.tls.ca_file.empty() &&
      options.tls.server_name.empty()) {
    return absl::InvalidArgumentError(
        "client options: TLS to a list of servers needs tls.server_name (the name their "
        "certificates carry)");
  }
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
  // A paused or cut-off server fails its calls within ~2 s instead of at their deadlines, and a
  // list of servers moves on without it (wire_constants.h).
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveIntervalMs);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // No service config and no retries by gRPC: with them on, gRPC runs every call through its
  // retry machinery, and a 256 MiB Download streamed 10-45% slower (docs/benchmarks/history.md,
  // paired R4 runs). Read-only calls and streams are retried by RestartOnUnavailable instead.
  arguments.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (!target.service_config.empty()) arguments.SetServiceConfigJSON(target.service_config);
  // A DNS TXT record never brings in a service config (and with it, say, a retryPolicy).
  arguments.SetInt(GRPC_ARG_SERVICE_CONFIG_DISABLE_RESOLUTION, 1);
  std::shared_ptr<ClientChannel> channel(new ClientChannel(
      options, service, grpc::CreateCustomChannel(target.target, credentials, arguments)));
  RETURN_IF_ERROR(channel->WaitUntilConnected(absl::Now() + options.connect_timeout));
  return channel;
}

ClientChannel::ClientChannel(ClientOptions options, ServiceSpec service,
                             std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), service_(std::move(service)), channel_(std::move(channel)) {}

std::string ClientChannel::ServerName() const {
  return absl::StrCat(service_.noun, " at ", options_.address);
}

std::unique_ptr<grpc::ClientContext> ClientChannel::NewContext(absl::Time deadline) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!options_.auth_token.empty()) {
    context->AddMetadata(kAuthorizationMetadata, absl::StrCat(kBearerPrefix, options_.auth_token));
  }
  for (const std::string& name : options_.forwarded_certificate_names) {
    context->AddMetadata(kForwardedCertificateMetadata, name);
  }
  return context;
}

absl::Status ClientChannel::WaitUntilConnected(absl::Time deadline) const {
  const absl::Time limit = std::min(deadline, absl::Now() + options_.connect_timeout);
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY ||
      channel_->WaitForConnected(absl::ToChronoTime(limit))) {
    return absl::OkStatus();
  }
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
  Backoff backoff = RetryBackoff(deadline);
  for (int retry = 0;; ++retry) {
    // A restart first waits (up to connect_timeout) for the channel to reconnect, so a server
    // that is restarting is found and one that stays down is reported as UNAVAILABLE.
    if (retry > 0) RETURN_IF_ERROR(WaitUntilConnected(deadline));
    absl::Status status = attempt(NewContext(deadline));
    if (!absl::IsUnavailable(status) || retry >= options_.max_retries || !backoff.Wait()) {
      return status;
    }
  }
}

absl::Status ClientChannel::CallUnary(
    absl::string_view method, absl::Duration timeout,
    const std::function<grpc::Status(grpc::ClientContext* context)>& call) const {
  const std::vector<std::string>& retried = service_.retried_methods;
  if (std::find(retried.begin(), retried.end(), method) != retried.end()) {
    return RestartOnUnavailable(timeout, [&](std::unique_ptr<grpc::ClientContext> context) {
      return FromCall(call(context.get()));
    });
  }
  // Sent once: it may change the server, so it waits for the connection rather than failing
  // fast on a channel that is still connecting.
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(WaitUntilConnected(deadline));
  return FromCall(call(NewContext(deadline).get()));
}

}  // namespace ckpt
