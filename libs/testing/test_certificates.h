#ifndef CKPT_LIBS_TESTING_TEST_CERTIFICATES_H_
#define CKPT_LIBS_TESTING_TEST_CERTIFICATES_H_

// Real X.509 certificates for TLS tests, made with the openssl command line in test setup (no key
// or certificate is committed). testonly.
//
// Example:
//   ASSERT_OK_AND_ASSIGN(TestCertificates certs, MakeTestCertificates(::testing::TempDir()));
//   GrpcServerOptions options;
//   options.tls = {certs.server.cert, certs.server.key, certs.ca};

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::testing {

struct CertificateFiles {
  std::string cert;  // PEM certificate.
  std::string key;   // PEM private key.
};

struct TestCertificates {
  std::string ca;        // The CA every good certificate chains to.
  std::string other_ca;  // A second CA, trusted by nobody.
  // Server certificate for 127.0.0.1 and localhost (CN=ckpt-test-server).
  CertificateFiles server;
  // Client certificates: CN=team-a with SAN DNS:team-a.example, CN=ops; one from other_ca
  // (CN=team-a); one past its notAfter (CN=team-a).
  CertificateFiles client;
  CertificateFiles ops;
  CertificateFiles foreign_client;
  CertificateFiles expired_client;
};

// Makes the CAs and certificates above under `dir` (EC P-256 keys).
absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir);

// Issues another certificate signed by `ca` (its key beside it as <ca without .pem>.key), for
// `subject` ("/CN=name") with `san` ("DNS:x,IP:127.0.0.1"; may be empty), valid `days` (negative:
// already expired), written to dir/name.pem and dir/name.key.
absl::StatusOr<CertificateFiles> IssueCertificate(const std::string& dir, const std::string& ca,
                                                  const std::string& name,
                                                  const std::string& subject,
                                                  const std::string& san, int days);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_TESTING_TEST_CERTIFICATES_H_
