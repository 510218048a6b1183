#include "libs/console/https_tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct StoreFree {
  void operator()(X509_STORE* store) const { X509_STORE_free(store); }
};
struct ChainFree {
  void operator()(STACK_OF(X509) * chain) const { sk_X509_pop_free(chain, X509_free); }
};
struct NamesFree {
  void operator()(STACK_OF(X509_NAME) * names) const {
    sk_X509_NAME_pop_free(names, X509_NAME_free);
  }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

// OpenSSL's reason for the last failure, for messages.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data of the expected kind";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::StatusOr<BioPtr> OpenFile(const std::string& path, const char* flag) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    ERR_clear_error();
    return absl::NotFoundError(absl::StrCat(flag, "=", path, ": cannot be read"));
  }
  return bio;
}

int64_t ModificationTimeNs(const std::string& path) {
  struct stat info;
  if (path.empty() || ::stat(path.c_str(), &info) != 0) return 0;
  return int64_t{info.st_mtim.tv_sec} * 1000000000 + info.st_mtim.tv_nsec;
}

}  // namespace

// One reading of the files, shared by the handshakes that began while it was current.
struct HttpsTls::Material {
  std::unique_ptr<X509, X509Free> cert;
  std::unique_ptr<STACK_OF(X509), ChainFree> chain;  // intermediates after the leaf
  std::unique_ptr<EVP_PKEY, KeyFree> key;
  std::unique_ptr<X509_STORE, StoreFree> client_cas;         // mutual TLS only
  std::unique_ptr<STACK_OF(X509_NAME), NamesFree> ca_names;  // sent in the CertificateRequest
};

HttpsTls::HttpsTls(ServerTlsOptions options) : options_(std::move(options)) {}
HttpsTls::~HttpsTls() = default;

absl::StatusOr<std::unique_ptr<HttpsTls>> HttpsTls::Load(ServerTlsOptions options) {
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file go together: give both or neither");
  }
  if (options.cert_file.empty()) {
    return absl::InvalidArgumentError("TLS needs --tls_cert_file and --tls_key_file");
  }
  if (options.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_interval must be at least 1s, got ",
                     absl::FormatDuration(options.reload_interval)));
  }
  std::unique_ptr<HttpsTls> tls(new HttpsTls(std::move(options)));
  absl::MutexLock lock(&tls->mu_);
  tls->loaded_mtimes_ns_ = ModificationTimeNs(tls->options_.cert_file) +
                           ModificationTimeNs(tls->options_.key_file) +
                           ModificationTimeNs(tls->options_.client_ca_file);
  ASSIGN_OR_RETURN(tls->material_, ReadMaterial(tls->options_));
  tls->last_check_ = absl::Now();
  return tls;
}

bool HttpsTls::Configure(SSL_CTX& context) {
  SSL_CTX_set_min_proto_version(&context, TLS1_2_VERSION);
  SSL_CTX_set_options(&context, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_cert_cb(&context, &HttpsTls::SelectCertificate, this);
  if (mutual()) {
    SSL_CTX_set_verify(&context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  // No session resumption: a resumed session skips the certificate callback, so it would keep a
  // client certificate the rotated CA no longer trusts; and OpenSSL refuses to resume a verified
  // session without a session id context ("session id context uninitialized", which a browser
  // reconnecting would meet). Each connection makes a full handshake instead.
  static constexpr unsigned char kSessionContext[] = "ckpt-console";
  SSL_CTX_set_session_id_context(&context, kSessionContext, sizeof(kSessionContext) - 1);
  SSL_CTX_set_session_cache_mode(&context, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(&context, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(&context, 0);
  return true;
}

std::shared_ptr<const HttpsTls::Material> HttpsTls::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - last_check_ < options_.reload_interval) return material_;
  last_check_ = now;
  const int64_t mtimes = ModificationTimeNs(options_.cert_file) +
                         ModificationTimeNs(options_.key_file) +
                         ModificationTimeNs(options_.client_ca_file);
  if (mtimes == loaded_mtimes_ns_) return material_;
  // A rotation writes the certificate and the key one after the other: a pair that does not
  // match yet is tried again at the next check, the previous pair served meanwhile.
  absl::StatusOr<std::shared_ptr<const Material>> reread = ReadMaterial(options_);
  if (!reread.ok()) {
    std::fprintf(stderr, "console: keeping the previous TLS files: %s\n",
                 std::string(reread.status().message()).c_str());
    return material_;
  }
  loaded_mtimes_ns_ = mtimes;
  material_ = *std::move(reread);
  std::fprintf(stderr, "console: TLS files re-read (%s)\n", options_.cert_file.c_str());
  return material_;
}

int HttpsTls::SelectCertificate(SSL* ssl, void* self) {
  const std::shared_ptr<const Material> material = static_cast<HttpsTls*>(self)->Current();
  // Each call takes its own reference (the "use" and "set1" functions count one up), so a
  // rotation may free the old material while this connection still holds it.
  if (SSL_use_certificate(ssl, material->cert.get()) != 1 ||
      SSL_use_PrivateKey(ssl, material->key.get()) != 1 ||
      SSL_set1_chain(ssl, material->chain.get()) != 1) {
    return 0;
  }
  if (material->client_cas != nullptr) {
    if (SSL_set1_verify_cert_store(ssl, material->client_cas.get()) != 1) return 0;
    SSL_set_client_CA_list(ssl, SSL_dup_CA_list(material->ca_names.get()));  // takes the copy
  }
  return 1;
}

absl::StatusOr<std::shared_ptr<const HttpsTls::Material>> HttpsTls::ReadMaterial(
    const ServerTlsOptions& options) {
  auto material = std::make_shared<Material>();
  {
    ASSIGN_OR_RETURN(BioPtr bio, OpenFile(options.cert_file, "--tls_cert_file"));
    material->cert.reset(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (material->cert == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_cert_file=", options.cert_file, ": not a PEM certificate (", OpenSslError(), ")"));
    }
    material->chain.reset(sk_X509_new_null());
    while (X509* next = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      sk_X509_push(material->chain.get(), next);
    }
    ERR_clear_error();  // the end of the file reads as an error
  }
  {
    ASSIGN_OR_RETURN(BioPtr bio, OpenFile(options.key_file, "--tls_key_file"));
    material->key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (material->key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_key_file=", options.key_file, ": not a PEM private key (", OpenSslError(), ")"));
    }
    if (X509_check_private_key(material->cert.get(), material->key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_key_file=", options.key_file,
                       " is not the key of --tls_cert_file=", options.cert_file));
    }
  }
  if (!options.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(BioPtr bio, OpenFile(options.client_ca_file, "--tls_client_ca_file"));
    material->client_cas.reset(X509_STORE_new());
    material->ca_names.reset(sk_X509_NAME_new_null());
    while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(material->client_cas.get(), ca);  // counts its own reference
      if (X509_NAME* name = X509_NAME_dup(X509_get_subject_name(ca))) {
        sk_X509_NAME_push(material->ca_names.get(), name);
      }
      X509_free(ca);
    }
    ERR_clear_error();
    if (sk_X509_NAME_num(material->ca_names.get()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_client_ca_file=", options.client_ca_file, ": holds no PEM certificate"));
    }
  }
  return std::shared_ptr<const Material>(std::move(material));
}

std::vector<std::string> PeerCertificateNames(const SSL* ssl) {
  std::vector<std::string> names;
  if (ssl == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return names;
  std::unique_ptr<X509, X509Free> cert(SSL_get1_peer_certificate(ssl));
  if (cert == nullptr) return names;
  // Subject alternative names, as gRPC's ssl_transport_security lists them.
  auto* alternatives = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; alternatives != nullptr && i < sk_GENERAL_NAME_num(alternatives); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(alternatives, i);
    if (name->type == GEN_DNS || name->type == GEN_URI || name->type == GEN_EMAIL) {
      const ASN1_IA5STRING* text = name->d.ia5;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)),
                         ASN1_STRING_length(text));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      char text[64] = {};
      const unsigned char* bytes = ASN1_STRING_get0_data(ip);
      const int family = ASN1_STRING_length(ip) == 4 ? AF_INET : AF_INET6;
      if ((ASN1_STRING_length(ip) == 4 || ASN1_STRING_length(ip) == 16) &&
          inet_ntop(family, bytes, text, sizeof(text)) != nullptr) {
        names.emplace_back(text);
      }
    }
  }
  GENERAL_NAMES_free(alternatives);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  const int cn = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (cn >= 0) {
    const ASN1_STRING* value = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, cn));
    unsigned char* utf8 = nullptr;
    const int length = ASN1_STRING_to_UTF8(&utf8, value);
    if (length >= 0) names.emplace_back(reinterpret_cast<char*>(utf8), length);
    OPENSSL_free(utf8);
  }
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (X509_NAME_print_ex(bio.get(), subject, 0, XN_FLAG_RFC2253) >= 0) {
    char* data = nullptr;
    const long length = BIO_get_mem_data(bio.get(), &data);
    if (length > 0) names.emplace_back(data, length);
  }
  return names;
}

}  // namespace ckpt
