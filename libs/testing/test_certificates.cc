#include "libs/testing/test_certificates.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/testing/child_process.h"

namespace ckpt::testing {
namespace {

absl::Status Run(const std::string& command) {
  const ShellResult result = RunShell(command + " 2>&1");
  if (result.exit_code != 0) {
    return absl::InternalError(absl::StrCat("`", command, "` failed: ", result.output));
  }
  return absl::OkStatus();
}

constexpr char kKeyOptions[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

absl::StatusOr<std::string> MakeCa(const std::string& dir, const std::string& name) {
  const std::string base = absl::StrCat(dir, "/", name);
  if (absl::Status made = Run(absl::StrCat("openssl req -x509 ", kKeyOptions, " -keyout ", base,
                                           ".key -out ", base, ".pem -days 30 -subj /CN=", name));
      !made.ok()) {
    return made;
  }
  return base + ".pem";
}

}  // namespace

absl::StatusOr<CertificateFiles> IssueCertificate(const std::string& dir, const std::string& ca,
                                                  const std::string& name,
                                                  const std::string& subject,
                                                  const std::string& san, int days) {
  const std::string base = absl::StrCat(dir, "/", name);
  const std::string ca_key = absl::StrCat(absl::StripSuffix(ca, ".pem"), ".key");
  std::string extensions;
  if (!san.empty()) {
    extensions = absl::StrCat(" -extfile ", base, ".ext");
    WriteTextFile(base + ".ext", absl::StrCat("subjectAltName=", san, "\n"));
  }
  absl::Status made = Run(absl::StrCat("openssl req ", kKeyOptions, " -keyout ", base, ".key -out ",
                                       base, ".csr -subj ", subject));
  if (made.ok()) {
    made = Run(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", ca, " -CAkey ", ca_key,
                            " -CAcreateserial -out ", base, ".pem -days ", days, extensions));
  }
  if (!made.ok()) return made;
  return CertificateFiles{base + ".pem", base + ".key"};
}

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  TestCertificates certs;
  absl::StatusOr<std::string> ca = MakeCa(dir, "ckpt-test-ca");
  if (!ca.ok()) return ca.status();
  certs.ca = *ca;
  absl::StatusOr<std::string> other = MakeCa(dir, "other-ca");
  if (!other.ok()) return other.status();
  certs.other_ca = *other;
  struct Issue {
    CertificateFiles* files;
    std::string ca, name, subject, san;
    int days;
  };
  for (const Issue& issue : std::initializer_list<Issue>{
           {&certs.server, certs.ca, "server", "/CN=ckpt-test-server", "DNS:localhost,IP:127.0.0.1",
            30},
           {&certs.client, certs.ca, "client", "/CN=team-a", "DNS:team-a.example", 30},
           {&certs.ops, certs.ca, "ops", "/CN=ops", "", 30},
           {&certs.foreign_client, certs.other_ca, "foreign-client", "/CN=team-a",
            "DNS:team-a.example", 30},
           {&certs.expired_client, certs.ca, "expired-client", "/CN=team-a", "DNS:team-a.example",
            -1},
       }) {
    absl::StatusOr<CertificateFiles> files =
        IssueCertificate(dir, issue.ca, issue.name, issue.subject, issue.san, issue.days);
    if (!files.ok()) return files.status();
    *issue.files = *files;
  }
  return certs;
}

}  // namespace ckpt::testing
