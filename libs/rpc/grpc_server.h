#ifndef CKPT_LIBS_RPC_GRPC_SERVER_H_
#define CKPT_LIBS_RPC_GRPC_SERVER_H_

// GrpcServer: a running gRPC server as a handle, shared by every ckpt service's main.cc and by
// tests. It registers the standard grpc.health.v1.Health service and reports each registered
// service as SERVING until shutdown begins, serves reflection, and speaks TLS or mutual TLS when
// given certificates (ServerTlsOptions).
//
// Example:
//   StoreService service(&store);
//   ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,
//                    GrpcServer::Start({.listen_address = "127.0.0.1:0"},
//                                      {{&service, v1::CheckpointStore::service_full_name()}}));
//   std::cout << "listening on " << server->address();
//   server->Wait();
//
// Thread-safe: Shutdown may be called from any thread (e.g. a signal watcher) while another
// thread is in Wait.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"

namespace ckpt {

class ReflectionV1Service;

// TLS for a server: its certificate and key, and for mutual TLS the CA its clients' certificates
// must chain to. The files are watched and re-read every reload_interval, so a rotated
// certificate is served to new connections without a restart.
struct ServerTlsOptions {
  // PEM certificate chain and private key of the server. Setting them turns TLS on.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle. When set, every client must present a certificate that chains to it (mutual
  // TLS); the certificate's subject and SANs become the caller's identity (access_policy.h).
  std::string client_ca_file;
  // How often the files are checked for changes. At least 1 s. Default 60 s.
  absl::Duration reload_interval = absl::Seconds(60);
};

struct GrpcServerOptions {
  // host:port to listen on. Port 0 picks a free port; read it back with port(). Loopback by
  // default: serving other machines is an explicit choice ("0.0.0.0:50051").
  std::string listen_address = "127.0.0.1:0";
  // Largest message received or sent, in bytes. Tensor bytes stream in pieces of at most 1 MiB,
  // so the default leaves room for large manifests.
  int max_message_bytes = 16 << 20;
  // TLS / mutual TLS; plaintext when tls.cert_file is empty. A plaintext server on an address
  // other than loopback starts, but says loudly on stderr that anyone on the network can read
  // and forge its calls.
  ServerTlsOptions tls;
  // Serve gRPC server reflection, grpc.reflection.v1 and v1alpha (reflection_v1_service.h), so
  // grpcurl and other standard tools can list and call the services without their .proto files.
  bool reflection = true;
};

// Whether `host` (the part of a listen address before the port) only accepts connections from
// this machine: 127.0.0.0/8, ::1, localhost.
bool IsLoopbackHost(absl::string_view host);

// A service to serve, with its full name for health reporting ("ckpt.v1.CheckpointStore";
// generated classes have it as Service::service_full_name()). Not owned.
struct ServiceBinding {
  grpc::Service* service;
  std::string name;
};

class GrpcServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT for bad options or no services, UNAVAILABLE when the
  // address cannot be bound (in use, not local, unresolvable). Two servers never share a port.
  // NOT_FOUND / INVALID_ARGUMENT naming the file for an unreadable or non-PEM TLS file.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           std::vector<ServiceBinding> services);

  ~GrpcServer();  // Shuts down at once if Shutdown was not called.
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // The bound port (never 0) and "host:port" to dial.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Blocks until Shutdown completes.
  void Wait();

  // Marks every service NOT_SERVING (so load balancers drain), stops accepting calls, lets
  // in-flight calls finish for up to `grace`, then cancels the rest. Idempotent.
  void Shutdown(absl::Duration grace);

  // What grpc.health.v1 says of `service` (a full name): a standby store reports its write
  // service NOT_SERVING, so clients balancing over several addresses with health checks send
  // their calls to the writer. No effect after Shutdown.
  void SetServing(const std::string& service, bool serving);

 private:
  GrpcServer(std::unique_ptr<ReflectionV1Service> reflection_v1,
             std::unique_ptr<grpc::Server> server, int port, std::string address);

  std::unique_ptr<ReflectionV1Service> reflection_v1_;  // outlives server_; null without.
  std::unique_ptr<grpc::Server> server_;
  int port_;
  std::string address_;
  std::once_flag shutdown_once_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_GRPC_SERVER_H_
