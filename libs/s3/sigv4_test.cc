#include "libs/s3/sigv4.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::s3 {
namespace {

// The worked examples of the S3 API reference, "Signature Calculations for the Authorization
// Header: Transferring Payload in a Single Chunk (AWS Signature Version 4)"
// (https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html): bucket
// examplebucket in us-east-1, 2013-05-24T00:00:00Z, these example credentials.
constexpr char kDocsAccessKey[] = "AKIAIOSFODNN7EXAMPLE";
constexpr char kDocsSecretKey[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr char kDocsHost[] = "examplebucket.s3.amazonaws.com";
constexpr char kDocsAmzDate[] = "20130524T000000Z";

SigV4Credentials DocsCredentials() {
  return SigV4Credentials{kDocsAccessKey, kDocsSecretKey, "us-east-1", "s3"};
}

std::string SignatureOf(const std::string& authorization) {
  const size_t at = authorization.find("Signature=");
  return at == std::string::npos ? "" : authorization.substr(at + 10);
}

// "Example: GET Object": the first 10 bytes of test.txt, payload hash of the empty body.
TEST(SigV4Test, ReproducesTheS3GetObjectExample) {
  SigV4Request request;
  request.method = "GET";
  request.canonical_uri = "/test.txt";
  request.headers = {{"Host", kDocsHost},
                     {"Range", "bytes=0-9"},
                     {"x-amz-content-sha256", std::string(kEmptyPayloadSha256)},
                     {"x-amz-date", kDocsAmzDate}};
  request.payload_hash = std::string(kEmptyPayloadSha256);

  std::string signed_headers;
  const std::string canonical = CanonicalRequest(request, &signed_headers);
  EXPECT_EQ(
      canonical,
      "GET\n"
      "/test.txt\n"
      "\n"
      "host:examplebucket.s3.amazonaws.com\n"
      "range:bytes=0-9\n"
      "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
      "x-amz-date:20130524T000000Z\n"
      "\n"
      "host;range;x-amz-content-sha256;x-amz-date\n"
      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(signed_headers, "host;range;x-amz-content-sha256;x-amz-date");

  const std::string scope = CredentialScope(kDocsAmzDate, DocsCredentials());
  EXPECT_EQ(scope, "20130524/us-east-1/s3/aws4_request");
  EXPECT_EQ(StringToSign(kDocsAmzDate, scope, canonical),
            "AWS4-HMAC-SHA256\n"
            "20130524T000000Z\n"
            "20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");

  EXPECT_EQ(AuthorizationHeader(request, DocsCredentials(), kDocsAmzDate),
            "AWS4-HMAC-SHA256 "
            "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

// "Example: PUT Object": a signed payload, a '$' in the key (encoded once: %24), a Date header
// and x-amz-storage-class among the signed headers.
TEST(SigV4Test, ReproducesTheS3PutObjectExampleWithSignedPayload) {
  const std::string body = "Welcome to Amazon S3.";
  const std::string payload_hash = Sha256Hex(body);
  EXPECT_EQ(payload_hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");

  SigV4Request request;
  request.method = "PUT";
  request.canonical_uri = "/" + UriEncode("test$file.text", /*encode_slash=*/false);
  EXPECT_EQ(request.canonical_uri, "/test%24file.text");
  request.headers = {{"Host", kDocsHost},
                     {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                     {"x-amz-date", kDocsAmzDate},
                     {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                     {"x-amz-content-sha256", payload_hash}};
  request.payload_hash = payload_hash;

  const std::string authorization = AuthorizationHeader(request, DocsCredentials(), kDocsAmzDate);
  EXPECT_THAT(authorization,
              ::testing::HasSubstr(",SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;"
                                   "x-amz-storage-class,"));
  EXPECT_EQ(SignatureOf(authorization),
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

// "Example: GET Bucket Lifecycle": a query parameter without a value signs as "lifecycle=".
TEST(SigV4Test, ReproducesTheS3GetBucketLifecycleExample) {
  SigV4Request request;
  request.method = "GET";
  request.canonical_uri = "/";
  request.query = {{"lifecycle", ""}};
  request.headers = {{"Host", kDocsHost},
                     {"x-amz-content-sha256", std::string(kEmptyPayloadSha256)},
                     {"x-amz-date", kDocsAmzDate}};
  request.payload_hash = std::string(kEmptyPayloadSha256);

  EXPECT_EQ(CanonicalQueryString(request.query), "lifecycle=");
  EXPECT_EQ(SignatureOf(AuthorizationHeader(request, DocsCredentials(), kDocsAmzDate)),
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

// "Example: Get Bucket (List Objects)": given out of order, the query is signed sorted.
TEST(SigV4Test, ReproducesTheS3ListObjectsExampleFromUnsortedQuery) {
  SigV4Request request;
  request.method = "GET";
  request.canonical_uri = "/";
  request.query = {{"prefix", "J"}, {"max-keys", "2"}};
  request.headers = {{"Host", kDocsHost},
                     {"x-amz-content-sha256", std::string(kEmptyPayloadSha256)},
                     {"x-amz-date", kDocsAmzDate}};
  request.payload_hash = std::string(kEmptyPayloadSha256);

  EXPECT_EQ(CanonicalQueryString(request.query), "max-keys=2&prefix=J");
  EXPECT_EQ(SignatureOf(AuthorizationHeader(request, DocsCredentials(), kDocsAmzDate)),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

// "Examples of how to derive a signing key for Signature Version 4" in the AWS General Reference
// (https://docs.aws.amazon.com/general/latest/gr/signature-v4-examples.html): kSigning for
// secret wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY, 20120215, us-east-1, iam.
TEST(SigV4Test, DerivesThePublishedSigningKey) {
  EXPECT_EQ(HexEncode(SigningKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215",
                                 "us-east-1", "iam")),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

TEST(SigV4Test, UriEncodeKeepsOnlyUnreservedBytesAndOptionallySlashes) {
  EXPECT_EQ(UriEncode("AZaz09-._~", true), "AZaz09-._~");
  EXPECT_EQ(UriEncode("a b+c*d=e&f", true), "a%20b%2Bc%2Ad%3De%26f");
  EXPECT_EQ(UriEncode("dir/sub/file", false), "dir/sub/file");
  EXPECT_EQ(UriEncode("dir/sub/file", true), "dir%2Fsub%2Ffile");
  // UTF-8 is encoded byte by byte, in uppercase hex.
  EXPECT_EQ(UriEncode("\xc3\xa9", false), "%C3%A9");
  // An already-encoded sequence is encoded again: callers encode raw keys exactly once.
  EXPECT_EQ(UriEncode("%20", false), "%2520");
}

TEST(SigV4Test, CanonicalQueryEncodesSlashesAndSpacesAndSortsByEncodedName) {
  EXPECT_EQ(CanonicalQueryString({{"prefix", "chunks/a b"},
                                  {"list-type", "2"},
                                  {"continuation-token", "1/x=="},
                                  {"uploads", ""}}),
            "continuation-token=1%2Fx%3D%3D&list-type=2&prefix=chunks%2Fa%20b&uploads=");
  EXPECT_EQ(CanonicalQueryString({}), "");
}

TEST(SigV4Test, CanonicalHeadersAreLowercasedTrimmedAndCollapsed) {
  SigV4Request request;
  request.method = "PUT";
  request.canonical_uri = "/b/k";
  request.headers = {{"X-Amz-Meta-Note", "  two   words  "}, {"HOST", "h:1"}};
  request.payload_hash = std::string(kUnsignedPayload);
  std::string signed_headers;
  EXPECT_EQ(CanonicalRequest(request, &signed_headers),
            "PUT\n/b/k\n\nhost:h:1\nx-amz-meta-note:two words\n\nhost;x-amz-meta-note\n"
            "UNSIGNED-PAYLOAD");
  EXPECT_EQ(signed_headers, "host;x-amz-meta-note");
}

TEST(SigV4Test, AmzDateIsBasicIso8601InUtc) {
  EXPECT_EQ(AmzDate(absl::FromUnixSeconds(1369353600)), "20130524T000000Z");
}

}  // namespace
}  // namespace ckpt::s3
