#include "libs/rpc/grpc_server.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server_builder.h"
#include "libs/io/read_file.h"
#include "libs/rpc/reflection_v1_service.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// "host:port" with a numeric port; the host part is what the address dials on.
absl::Status ValidateListenAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", address, "' must be HOST:PORT, e.g. 127.0.0.1:0 (port 0 picks one)"));
  }
  return absl::OkStatus();
}

// Reads `path` (named by `what`) and checks that it holds a PEM block, so that a wrong file fails
// at start-up rather than at every handshake.
absl::Status CheckPemFile(const std::string& path, absl::string_view what) {
  ASSIGN_OR_RETURN(const std::string pem, ReadSmallFile(path, what));
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, "=", path, " holds no PEM block"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const ServerTlsOptions& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty() && tls.client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both the server's certificate (tls_cert_file) and its key (tls_key_file)");
  }
  if (tls.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("the TLS reload interval must be at least 1s");
  }
  RETURN_IF_ERROR(CheckPemFile(tls.cert_file, "tls_cert_file"));
  RETURN_IF_ERROR(CheckPemFile(tls.key_file, "tls_key_file"));
  if (!tls.client_ca_file.empty()) {
    RETURN_IF_ERROR(CheckPemFile(tls.client_ca_file, "tls_client_ca_file"));
  }
  const auto interval = static_cast<unsigned int>(absl::ToInt64Seconds(tls.reload_interval));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace

bool IsLoopbackHost(absl::string_view host) {
  return absl::StartsWith(host, "127.") || host == "localhost" || host == "[::1]" || host == "::1";
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, std::vector<ServiceBinding> services) {
  RETURN_IF_ERROR(ValidateListenAddress(options.listen_address));
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be positive, got ", options.max_message_bytes));
  }
  if (services.empty()) {
    return absl::InvalidArgumentError("a gRPC server needs at least one service to serve");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   ServerCredentials(options.tls));
  // Process-wide switches; must be set before the first server is built.
  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &bound_port);
  // SO_REUSEPORT would let a second server bind a port already serving, splitting traffic
  // between two stores; fail loudly instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // The clients' keepalive pings (wire_constants.h), with or without calls in flight; gRPC's
  // default answers pings more often than every 5 minutes with GOAWAY ("too_many_pings").
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveIntervalMs / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  for (const ServiceBinding& binding : services) builder.RegisterService(binding.service);
  std::unique_ptr<ReflectionV1Service> reflection_v1;
  if (options.reflection) {
    std::vector<std::string> names = {"grpc.health.v1.Health",
                                      "grpc.reflection.v1.ServerReflection",
                                      "grpc.reflection.v1alpha.ServerReflection"};
    for (const ServiceBinding& binding : services) names.push_back(binding.name);
    reflection_v1 = std::make_unique<ReflectionV1Service>(std::move(names));
    builder.RegisterService(reflection_v1.get());
  }

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     ": the port is in use, or the host is not an address of this machine"));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(true);
    for (const ServiceBinding& binding : services) health->SetServingStatus(binding.name, true);
  }
  const std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  if (options.tls.cert_file.empty() && !IsLoopbackHost(host)) {
    std::fprintf(stderr,
                 "WARNING: serving %s:%d in PLAINTEXT on an address other machines can reach.\n"
                 "WARNING: anyone on the network can read the calls, their tensors and bearer "
                 "tokens, and forge calls.\n"
                 "WARNING: give the server a TLS certificate and key (and a client CA for "
                 "mutual TLS), or listen on 127.0.0.1.\n",
                 host.c_str(), bound_port);
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(reflection_v1), std::move(server),
                                                    bound_port,
                                                    absl::StrCat(host, ":", bound_port)));
}

GrpcServer::GrpcServer(std::unique_ptr<ReflectionV1Service> reflection_v1,
                       std::unique_ptr<grpc::Server> server, int port, std::string address)
    : reflection_v1_(std::move(reflection_v1)),
      server_(std::move(server)),
      port_(port),
      address_(std::move(address)) {}

GrpcServer::~GrpcServer() {
  Shutdown(absl::ZeroDuration());
  server_->Wait();
}

void GrpcServer::Wait() { server_->Wait(); }

void GrpcServer::SetServing(const std::string& service, bool serving) {
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(service, serving);
  }
}

void GrpcServer::Shutdown(absl::Duration grace) {
  std::call_once(shutdown_once_, [&] {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->Shutdown();  // Everything NOT_SERVING, and it stays so.
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  });
}

}  // namespace ckpt
