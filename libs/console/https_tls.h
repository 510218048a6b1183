#ifndef CKPT_LIBS_CONSOLE_HTTPS_TLS_H_
#define CKPT_LIBS_CONSOLE_HTTPS_TLS_H_

// HttpsTls: TLS and mutual TLS for the console's HTTPS server (cpp-httplib's SSLServer, which
// hands us its OpenSSL SSL_CTX to set up), from the files and flags the gRPC servers take
// (ServerTlsOptions: --tls_cert_file, --tls_key_file, --tls_client_ca_file,
// --tls_reload_interval) and with their behaviour: TLS 1.2 or later; with a client CA, every
// client must present a certificate that chains to it; the files are re-read when they change
// (checked at most once per reload_interval, on a handshake), so a rotated certificate or CA
// reaches new connections without a restart, and a broken rotation keeps the previous files with
// a message on stderr.
//
// PeerCertificateNames gives the names of a connection's verified client certificate as gRPC
// names a peer's (SANs, common name, RFC 2253 subject), so that the store's identities file
// ("certificate": ...) matches a certificate the console forwards exactly as one presented to
// the store itself (libs/auth/access_policy.h, "Forwarded certificates").
//
// Thread-safe: the SSL_CTX may serve handshakes on any number of threads.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<HttpsTls> tls, HttpsTls::Load(options));
//   httplib::SSLServer server([&](SSL_CTX& context) { return tls->Configure(context); });
//   ... in a handler: PeerCertificateNames(request.ssl)

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/rpc/grpc_server.h"

namespace ckpt {

class HttpsTls {
 public:
  // Reads the files once. INVALID_ARGUMENT naming the flag for a missing certificate or key, a
  // file that does not hold PEM of its kind, or a key that does not match the certificate;
  // NOT_FOUND naming the flag for a file that cannot be read.
  static absl::StatusOr<std::unique_ptr<HttpsTls>> Load(ServerTlsOptions options);
  ~HttpsTls();

  // Sets up `context` (SSLServer's): protocol versions, the certificate chosen per handshake, and
  // for mutual TLS the required client certificate. Returns true (SSLServer's contract).
  bool Configure(SSL_CTX& context);

  // Whether clients must present a certificate.
  bool mutual() const { return !options_.client_ca_file.empty(); }

 private:
  struct Material;
  explicit HttpsTls(ServerTlsOptions options);

  // Called by OpenSSL at each handshake (SSL_CTX_set_cert_cb): re-reads changed files when the
  // interval is up, then sets this connection's certificate, key and client CAs.
  static int SelectCertificate(SSL* ssl, void* self);
  std::shared_ptr<const Material> Current();
  static absl::StatusOr<std::shared_ptr<const Material>> ReadMaterial(
      const ServerTlsOptions& options);

  const ServerTlsOptions options_;
  absl::Mutex mu_;
  std::shared_ptr<const Material> material_ ABSL_GUARDED_BY(mu_);
  int64_t loaded_mtimes_ns_ ABSL_GUARDED_BY(mu_) = 0;  // sum of the files' mtimes when read
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The names the verified client certificate of `ssl` goes by: each subject alternative name
// (DNS, URI, email, IP), the common name, and the subject in RFC 2253 form ("CN=alice,O=Example"),
// as gRPC lists a peer's. Empty when the client presented none, or it did not verify.
std::vector<std::string> PeerCertificateNames(const SSL* ssl);

}  // namespace ckpt

#endif  // CKPT_LIBS_CONSOLE_HTTPS_TLS_H_
