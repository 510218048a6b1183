#include "libs/server/run_certificate.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

struct Free {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
  void operator()(X509* cert) const { X509_free(cert); }
  void operator()(BIO* bio) const { BIO_free(bio); }
  void operator()(X509_EXTENSION* extension) const { X509_EXTENSION_free(extension); }
};

absl::Status OpenSslError(absl::string_view step) {
  char buffer[256] = "unknown error";
  if (const unsigned long code = ERR_get_error(); code != 0) {
    ERR_error_string_n(code, buffer, sizeof(buffer));
  }
  return absl::InternalError(
      absl::StrCat("making the run's TLS certificate: ", step, ": ", buffer));
}

bool IsIpAddress(const std::string& host) {
  unsigned char address[16];
  return inet_pton(AF_INET, host.c_str(), address) == 1 ||
         inet_pton(AF_INET6, host.c_str(), address) == 1;
}

absl::StatusOr<std::string> BioContents(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  if (size <= 0) return OpenSslError("PEM encoding");
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace

absl::StatusOr<RunCertificate> MakeRunCertificate(const std::string& common_name,
                                                  const std::vector<std::string>& hosts,
                                                  absl::Duration validity) {
  if (hosts.empty()) {
    return absl::InvalidArgumentError("a run certificate needs at least one host name or address");
  }
  std::unique_ptr<EVP_PKEY, Free> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("generating the key");
  std::unique_ptr<X509, Free> cert(X509_new());
  if (cert == nullptr) return OpenSslError("X509_new");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("serial number");
  serial[0] &= 0x7f;  // A positive INTEGER.
  BIGNUM* serial_number = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_set = serial_number != nullptr &&
                          BN_to_ASN1_INTEGER(serial_number, X509_get_serialNumber(cert.get()));
  BN_free(serial_number);
  if (!serial_set) return OpenSslError("serial number");
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_set_version(cert.get(), 2) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity)) == nullptr ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), name) != 1 || X509_set_pubkey(cert.get(), key.get()) != 1) {
    return OpenSslError("filling in the certificate");
  }
  std::vector<std::string> sans;
  for (const std::string& host : hosts) {
    sans.push_back(absl::StrCat(IsIpAddress(host) ? "IP:" : "DNS:", host));
  }
  X509V3_CTX context;
  X509V3_set_ctx(&context, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] :
       {std::pair<int, std::string>{NID_subject_alt_name, absl::StrJoin(sans, ",")},
        {NID_basic_constraints, "critical,CA:TRUE"}}) {
    std::unique_ptr<X509_EXTENSION, Free> extension(
        X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str()));
    if (extension == nullptr || X509_add_ext(cert.get(), extension.get(), -1) != 1) {
      return OpenSslError(absl::StrCat("extension ", value));
    }
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return OpenSslError("signing");

  RunCertificate result;
  std::unique_ptr<BIO, Free> cert_bio(BIO_new(BIO_s_mem()));
  std::unique_ptr<BIO, Free> key_bio(BIO_new(BIO_s_mem()));
  if (cert_bio == nullptr || key_bio == nullptr ||
      PEM_write_bio_X509(cert_bio.get(), cert.get()) != 1 ||
      PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) !=
          1) {
    return OpenSslError("PEM encoding");
  }
  absl::StatusOr<std::string> cert_pem = BioContents(cert_bio.get());
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = BioContents(key_bio.get());
  if (!key_pem.ok()) return key_pem.status();
  result.cert_pem = *std::move(cert_pem);
  result.key_pem = *std::move(key_pem);
  return result;
}

}  // namespace ckpt
