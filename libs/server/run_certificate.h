#ifndef CKPT_LIBS_SERVER_RUN_CERTIFICATE_H_
#define CKPT_LIBS_SERVER_RUN_CERTIFICATE_H_

// A throwaway self-signed certificate for one run: when a trainer lends its embedded store to
// ranks on other machines, rank 0 serves TLS with a certificate made here and sends it (the
// certificate, never the key) to the other ranks over the process group, which trust exactly it.
// No CA, nothing to distribute beforehand, nothing valid after the run.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt {

struct RunCertificate {
  std::string cert_pem;
  std::string key_pem;
};

// An EC P-256 key and a self-signed certificate for `common_name`, with subject alternative names
// `hosts` (IP addresses become IP SANs, anything else DNS SANs), valid from a minute ago for
// `validity`. INTERNAL when OpenSSL fails; INVALID_ARGUMENT for no hosts.
absl::StatusOr<RunCertificate> MakeRunCertificate(const std::string& common_name,
                                                  const std::vector<std::string>& hosts,
                                                  absl::Duration validity);

}  // namespace ckpt

#endif  // CKPT_LIBS_SERVER_RUN_CERTIFICATE_H_
