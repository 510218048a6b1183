#ifndef CKPT_LIBS_S3_SIGV4_H_
#define CKPT_LIBS_S3_SIGV4_H_

// AWS Signature Version 4 for S3 requests sent with an Authorization header, as specified in
// "Authenticating Requests: Using the Authorization Header (AWS Signature Version 4)" of the S3
// API reference. Pure functions over strings (OpenSSL's SHA-256 and HMAC); no I/O. Thread-safe.
//
// Why our own signer: Debian 12 packages no maintained C or C++ S3 client that signs with SigV4.
// There is no aws-sdk-cpp or minio-cpp package, and libs3-dev 2.0 signs with the retired
// Signature Version 2 ("Authorization: AWS key:signature"), which current S3 regions and Ceph
// deployments can refuse. SigV4 for one service over one HTTP library is small, and pinning it to
// the published vectors (sigv4_test.cc) is cheaper than vendoring a large SDK into an offline
// build; DuckDB's httpfs extension makes the same choice over its own HTTP client.
//
// S3 differs from the generic SigV4 rules in two ways that matter here:
// - the canonical URI is the path as sent, encoded once ("/bucket/a%20b"), not encoded twice;
// - every request carries x-amz-content-sha256, which is signed (see `payload_hash` below).
//
// Example:
//   SigV4Request request;
//   request.method = "GET";
//   request.canonical_uri = "/bucket/" + UriEncode("chunks/ab cd", /*encode_slash=*/false);
//   request.headers = {{"host", "127.0.0.1:7480"}, {"x-amz-date", AmzDate(absl::Now())},
//                      {"x-amz-content-sha256", kEmptyPayloadSha256}};
//   request.payload_hash = kEmptyPayloadSha256;
//   std::string authorization = AuthorizationHeader(request, credentials, amz_date);

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::s3 {

// SHA-256 of the empty string, the payload hash of GET, HEAD and DELETE.
inline constexpr absl::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// The payload hash that tells S3 the body is not covered by the signature.
inline constexpr absl::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

struct SigV4Credentials {
  std::string access_key;
  std::string secret_key;
  std::string
      region;  // "us-east-1"; Ceph's rgw accepts any region unless zonegroups say otherwise.
  std::string service = "s3";
};

// One request as the signer sees it.
struct SigV4Request {
  std::string method;  // "GET", "PUT", ...
  // The path exactly as it goes on the wire, already URI-encoded once (see UriEncode).
  std::string canonical_uri;
  // Query parameters, not encoded; the order does not matter. A parameter without a value
  // ("?uploads") has an empty value.
  std::vector<std::pair<std::string, std::string>> query;
  // Headers to sign, any case; must include host, x-amz-date and (for S3) x-amz-content-sha256.
  // Every header given here is signed. Values are trimmed and inner runs of spaces collapsed.
  std::vector<std::pair<std::string, std::string>> headers;
  // Lowercase hex SHA-256 of the body, or kUnsignedPayload.
  std::string payload_hash;
};

// Lowercase hex.
std::string HexEncode(absl::string_view bytes);
// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);
// Raw 32-byte HMAC-SHA256 of `data` under `key`.
std::string HmacSha256(absl::string_view key, absl::string_view data);

// Percent-encodes every byte except the unreserved A-Z a-z 0-9 - . _ ~ as %XY (uppercase hex),
// and '/' too unless `encode_slash` is false (object key paths keep their slashes).
std::string UriEncode(absl::string_view text, bool encode_slash);

// "20130524T000000Z" (ISO 8601 basic, UTC), the x-amz-date value.
std::string AmzDate(absl::Time time);

// Names and values encoded with UriEncode(..., true), sorted by encoded name then value, joined
// as name=value with '&'. Also the query string the client sends, so the two cannot differ.
std::string CanonicalQueryString(const std::vector<std::pair<std::string, std::string>>& query);

// The canonical request: method, URI, query, sorted lowercase headers, the signed header list
// and the payload hash, one per line. Sets `signed_headers` ("host;range;x-amz-date...") when
// non-null.
std::string CanonicalRequest(const SigV4Request& request, std::string* signed_headers = nullptr);

// "20130524/us-east-1/s3/aws4_request" for `amz_date` "20130524T000000Z".
std::string CredentialScope(absl::string_view amz_date, const SigV4Credentials& credentials);

// "AWS4-HMAC-SHA256\n<amz_date>\n<scope>\n<hex SHA-256 of canonical_request>".
std::string StringToSign(absl::string_view amz_date, absl::string_view scope,
                         absl::string_view canonical_request);

// HMAC chain "AWS4"+secret -> date (YYYYMMDD) -> region -> service -> "aws4_request"; raw bytes.
std::string SigningKey(absl::string_view secret_key, absl::string_view date,
                       absl::string_view region, absl::string_view service);

// The Authorization header value: "AWS4-HMAC-SHA256 Credential=<key>/<scope>,
// SignedHeaders=<list>,Signature=<hex>" (no spaces after the commas, as in the S3 examples).
// `amz_date` must equal the request's x-amz-date header.
std::string AuthorizationHeader(const SigV4Request& request, const SigV4Credentials& credentials,
                                absl::string_view amz_date);

}  // namespace ckpt::s3

#endif  // CKPT_LIBS_S3_SIGV4_H_
