#include "libs/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::s3 {
namespace {

bool IsUnreserved(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

// SigV4's header value rule: trim, and collapse each inner run of spaces to one.
std::string TrimAndCollapse(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  std::string out;
  out.reserve(value.size());
  bool in_space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      if (!in_space) out.push_back(' ');
      in_space = true;
    } else {
      out.push_back(c);
      in_space = false;
    }
  }
  return out;
}

}  // namespace

std::string HexEncode(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return HexEncode(absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

std::string UriEncode(absl::string_view text, bool encode_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (IsUnreserved(c) || (c == '/' && !encode_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 0xf]);
    }
  }
  return out;
}

std::string AmzDate(absl::Time time) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", time, absl::UTCTimeZone());
}

std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(UriEncode(name, true), UriEncode(value, true));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", absl::PairFormatter("="));
}

std::string CanonicalRequest(const SigV4Request& request, std::string* signed_headers) {
  std::vector<std::pair<std::string, std::string>> headers;
  headers.reserve(request.headers.size());
  for (const auto& [name, value] : request.headers) {
    headers.emplace_back(absl::AsciiStrToLower(name), TrimAndCollapse(value));
  }
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers;
  std::vector<absl::string_view> names;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&canonical_headers, name, ":", value, "\n");
    names.push_back(name);
  }
  std::string signed_list = absl::StrJoin(names, ";");
  std::string out = absl::StrCat(request.method, "\n", request.canonical_uri, "\n",
                                 CanonicalQueryString(request.query), "\n", canonical_headers, "\n",
                                 signed_list, "\n", request.payload_hash);
  if (signed_headers != nullptr) *signed_headers = std::move(signed_list);
  return out;
}

std::string CredentialScope(absl::string_view amz_date, const SigV4Credentials& credentials) {
  return absl::StrCat(amz_date.substr(0, 8), "/", credentials.region, "/", credentials.service,
                      "/aws4_request");
}

std::string StringToSign(absl::string_view amz_date, absl::string_view scope,
                         absl::string_view canonical_request) {
  return absl::StrCat("AWS4-HMAC-SHA256\n", amz_date, "\n", scope, "\n",
                      Sha256Hex(canonical_request));
}

std::string SigningKey(absl::string_view secret_key, absl::string_view date,
                       absl::string_view region, absl::string_view service) {
  const std::string date_key = HmacSha256(absl::StrCat("AWS4", secret_key), date);
  const std::string region_key = HmacSha256(date_key, region);
  const std::string service_key = HmacSha256(region_key, service);
  return HmacSha256(service_key, "aws4_request");
}

std::string AuthorizationHeader(const SigV4Request& request, const SigV4Credentials& credentials,
                                absl::string_view amz_date) {
  std::string signed_headers;
  const std::string canonical = CanonicalRequest(request, &signed_headers);
  const std::string scope = CredentialScope(amz_date, credentials);
  const std::string key = SigningKey(credentials.secret_key, amz_date.substr(0, 8),
                                     credentials.region, credentials.service);
  const std::string signature =
      HexEncode(HmacSha256(key, StringToSign(amz_date, scope, canonical)));
  return absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key, "/", scope,
                      ",SignedHeaders=", signed_headers, ",Signature=", signature);
}

}  // namespace ckpt::s3
