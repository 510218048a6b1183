#include "libs/rpc/grpc_server.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, std::vector<ServiceBinding> services) {
  if (absl::Status valid = ValidateListenAddress(options.listen_address); !valid.ok()) {
    return valid;
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be positive, got ", options.max_message_bytes));
  }
  if (services.empty()) {
    return absl::InvalidArgumentError("a gRPC server needs at least one service to serve");
  }
  // Process-wide switch; must be set before the first server is built.
  grpc::EnableDefaultHealthCheckService(true);

  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(), &bound_port);
  // SO_REUSEPORT would let a second server bind a port already serving, splitting traffic
  // between two stores; fail loudly instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (const ServiceBinding& binding : services) builder.RegisterService(binding.service);

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
  return std::unique_ptr<GrpcServer>(
      new GrpcServer(std::move(server), bound_port, absl::StrCat(host, ":", bound_port)));
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::string address)
    : server_(std::move(server)), port_(port), address_(std::move(address)) {}

GrpcServer::~GrpcServer() {
  Shutdown(absl::ZeroDuration());
  server_->Wait();
}

void GrpcServer::Wait() { server_->Wait(); }

void GrpcServer::Shutdown(absl::Duration grace) {
  std::call_once(shutdown_once_, [&] {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->Shutdown();  // Everything NOT_SERVING, and it stays so.
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  });
}

}  // namespace ckpt
