// S3Client against a real HTTP server: testdata/fake_s3_server.py under /usr/bin/python3, which
// verifies each SigV4 signature with its own implementation of the spec, keeps objects in memory
// and injects 5xx, 429, slow responses and dropped connections on request.

#include "libs/s3/s3_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/s3/sigv4.h"
#include "libs/s3/testing/fake_s3_server.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"
#include "libs/testing/test_certificates.h"
#include "nlohmann/json.hpp"

namespace ckpt::s3 {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr const char* kBucket = testing::FakeS3Server::kBucket;
constexpr const char* kAccessKey = testing::FakeS3Server::kAccessKey;
constexpr const char* kSecretKey = testing::FakeS3Server::kSecretKey;

// An OK absl::StatusOr<std::string> holding `expected` (compared whole, without printing
// megabytes on a mismatch).
MATCHER_P(Holds, expected, "") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  if (*arg != expected) {
    *result_listener << "holding " << arg->size() << " bytes, not the expected "
                     << std::string(expected).size();
    return false;
  }
  return true;
}

// The fake, with the request timeout these tests use.
class FakeS3 : public testing::FakeS3Server {
 public:
  using FakeS3Server::FakeS3Server;
  S3ClientOptions Options() const {
    S3ClientOptions options = ClientOptions();
    options.request_timeout = absl::Seconds(20);
    return options;
  }
};

std::unique_ptr<S3Client> MakeClient(const S3ClientOptions& options) {
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Every byte value, `size` bytes, varying with `seed`.
std::string Bytes(size_t size, int seed = 0) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i)
    out[i] = static_cast<char>((i * 31 + seed * 7 + i / 251) & 0xff);
  return out;
}

TEST(S3ClientTest, PutGetHeadDeleteRoundTripAKeyThatNeedsEncoding) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  // Spaces, '+', '=', '$', UTF-8 and slashes: the fake decodes the path and re-encodes it by the
  // spec, so a wrong encoding shows as SignatureDoesNotMatch.
  const std::string key = "chunks/ab cd/x+y=z$\xc3\xa9~.bin";
  const std::string data = Bytes(70000);

  ASSERT_OK(s3->PutObject(key, data));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, s3->HeadObject(key));
  EXPECT_EQ(info.size, data.size());
  EXPECT_EQ(info.etag.front(), '"');
  ASSERT_OK_AND_ASSIGN(std::string read, s3->GetObject(key));
  EXPECT_TRUE(read == data) << "read back " << read.size() << " bytes, wrote " << data.size();

  ASSERT_OK(s3->DeleteObject(key));
  EXPECT_THAT(s3->GetObject(key), StatusIs(absl::StatusCode::kNotFound, "NoSuchKey"));
  EXPECT_THAT(s3->HeadObject(key), StatusIs(absl::StatusCode::kNotFound, "HTTP 404"));
  EXPECT_OK(s3->DeleteObject(key));  // S3 deletes are idempotent.

  // The body's SHA-256 went in x-amz-content-sha256 (the fake compares it with the body).
  for (const nlohmann::json& entry : server.Log()) {
    if (entry["method"] == "PUT") {
      EXPECT_EQ(entry["headers"]["x-amz-content-sha256"], Sha256Hex(data));
      EXPECT_FALSE(entry["headers"].contains("expect"));
    }
  }
}

TEST(S3ClientTest, EmptyObjectsRoundTrip) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  ASSERT_OK(s3->PutObject("empty", ""));
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, s3->HeadObject("empty"));
  EXPECT_EQ(info.size, 0u);
  EXPECT_THAT(s3->GetObject("empty"), Holds(std::string()));
}

TEST(S3ClientTest, UnsignedPayloadIsSentWhenAsked) {
  FakeS3 server;
  S3ClientOptions options = server.Options();
  options.sign_payload = false;
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  ASSERT_OK(s3->PutObject("k", "hello"));
  EXPECT_THAT(s3->GetObject("k"), Holds(std::string("hello")));
  EXPECT_EQ(server.Log()[0]["headers"]["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
}

TEST(S3ClientTest, RangedGetReturnsExactlyTheRequestedBytes) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  const std::string data = Bytes(1000, 3);
  ASSERT_OK(s3->PutObject("obj", data));

  EXPECT_THAT(s3->GetObject("obj", ByteRange{100, 50}), Holds(data.substr(100, 50)));
  EXPECT_THAT(s3->GetObject("obj", ByteRange{0, 1}), Holds(data.substr(0, 1)));
  // Past the end: what exists; at the end: OUT_OF_RANGE.
  EXPECT_THAT(s3->GetObject("obj", ByteRange{990, 100}), Holds(data.substr(990)));
  EXPECT_THAT(s3->GetObject("obj", ByteRange{1000, 1}),
              StatusIs(absl::StatusCode::kOutOfRange, "InvalidRange"));
  EXPECT_THAT(s3->GetObject("obj", ByteRange{5, 0}), StatusIs(absl::StatusCode::kInvalidArgument));

  std::vector<std::string> ranges;
  for (const nlohmann::json& entry : server.Log()) {
    if (entry["headers"].contains("range")) ranges.push_back(entry["headers"]["range"]);
  }
  EXPECT_THAT(ranges, ::testing::ElementsAre("bytes=100-149", "bytes=0-0", "bytes=990-1089",
                                             "bytes=1000-1000"));
}

TEST(S3ClientTest, PutIfAbsentRefusesAnExistingObjectWithIfNoneMatch) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  ASSERT_OK(s3->PutObjectIfAbsent("chunk", "first"));
  EXPECT_THAT(s3->PutObjectIfAbsent("chunk", "second"),
              StatusIs(absl::StatusCode::kAlreadyExists, "PreconditionFailed"));
  EXPECT_THAT(s3->GetObject("chunk"), Holds(std::string("first")));
  EXPECT_EQ(server.Count("PUT"), 2);
  EXPECT_EQ(server.Count("HEAD"), 0);  // One round trip each.
  for (const nlohmann::json& entry : server.Log()) {
    if (entry["method"] == "PUT") {
      EXPECT_EQ(entry["headers"]["if-none-match"], "*");
    }
  }
}

// A server that ignores If-None-Match overwrites; HEAD-first mode is what keeps an existing
// object from being uploaded again there.
TEST(S3ClientTest, HeadFirstModeNeverUploadsAnExistingObjectToAServerIgnoringIfNoneMatch) {
  FakeS3 server({"--ignore_if_none_match"});
  std::unique_ptr<S3Client> if_none_match = MakeClient(server.Options());
  ASSERT_OK(if_none_match->PutObjectIfAbsent("chunk", "first"));
  EXPECT_OK(if_none_match->PutObjectIfAbsent("chunk", "second"));  // Not refused by this server.
  EXPECT_THAT(if_none_match->GetObject("chunk"), Holds(std::string("second")));

  S3ClientOptions options = server.Options();
  options.if_absent_mode = S3ClientOptions::IfAbsentMode::kHeadFirst;
  std::unique_ptr<S3Client> head_first = MakeClient(options);
  const int puts_before = server.Count("PUT");
  EXPECT_THAT(head_first->PutObjectIfAbsent("chunk", "third"),
              StatusIs(absl::StatusCode::kAlreadyExists, "exists (6 bytes)"));
  EXPECT_EQ(server.Count("PUT"), puts_before);
  ASSERT_OK(head_first->PutObjectIfAbsent("other", "new"));
  EXPECT_EQ(server.Count("PUT"), puts_before + 1);
  EXPECT_THAT(head_first->GetObject("chunk"), Holds(std::string("second")));
}

TEST(S3ClientTest, RetriesServerErrorsAndThrottlingThenSucceeds) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  server.Fault({{"method", "PUT"}, {"status", 503}, {"code", "SlowDown"}, {"count", 2}});
  server.Fault({{"method", "PUT"}, {"status", 429}, {"code", "TooManyRequests"}, {"count", 1}});
  ASSERT_OK(s3->PutObject("k", "v"));
  EXPECT_EQ(server.Count("PUT"), 4);
  server.Fault({{"method", "GET"}, {"status", 500}, {"code", "InternalError"}, {"count", 1}});
  EXPECT_THAT(s3->GetObject("k"), Holds(std::string("v")));
  EXPECT_EQ(server.Count("GET"), 2);
}

TEST(S3ClientTest, GivesUpAfterMaxAttemptsWithUnavailableAndS3sMessage) {
  FakeS3 server;
  S3ClientOptions options = server.Options();
  options.max_attempts = 3;
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  server.Fault({{"method", "PUT"}, {"status", 500}, {"code", "InternalError"}, {"count", 100}});
  EXPECT_THAT(s3->PutObject("k", "v"),
              StatusIs(absl::StatusCode::kUnavailable,
                       "HTTP 500 InternalError: injected by the test (request id"));
  EXPECT_THAT(s3->PutObject("k2", "v"), StatusIs(absl::StatusCode::kUnavailable, "(3 attempts)"));
  EXPECT_EQ(server.Count("PUT"), 6);
}

TEST(S3ClientTest, DoesNotRetryClientErrors) {
  FakeS3 server;
  S3ClientOptions options = server.Options();
  options.secret_key = "not-the-secret";
  std::unique_ptr<S3Client> wrong_secret = MakeClient(options);
  EXPECT_THAT(wrong_secret->PutObject("k", "v"),
              StatusIs(absl::StatusCode::kPermissionDenied, "HTTP 403 SignatureDoesNotMatch"));
  EXPECT_THAT(wrong_secret->PutObject("k", "v"),
              StatusIs(absl::StatusCode::kPermissionDenied, "(1 attempt)"));
  EXPECT_EQ(server.Count("PUT"), 2);

  options = server.Options();
  options.access_key = "AKIDOTHER";
  EXPECT_THAT(MakeClient(options)->GetObject("k"),
              StatusIs(absl::StatusCode::kPermissionDenied, "InvalidAccessKeyId"));
  options = server.Options();
  options.bucket = "no-such-bucket";
  EXPECT_THAT(MakeClient(options)->GetObject("k"),
              StatusIs(absl::StatusCode::kNotFound, "NoSuchBucket"));
  EXPECT_EQ(server.Count("GET"), 2);
}

TEST(S3ClientTest, RetriesAfterATimeoutAndReportsDeadlineExceededWhenOutOfAttempts) {
  FakeS3 server;
  S3ClientOptions options = server.Options();
  options.request_timeout = absl::Milliseconds(300);
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  ASSERT_OK(s3->PutObject("k", "v"));
  server.Fault({{"method", "GET"}, {"delay_s", 2}, {"count", 1}});
  EXPECT_THAT(s3->GetObject("k"), Holds(std::string("v")));
  EXPECT_EQ(server.Count("GET"), 2);

  options.max_attempts = 1;
  std::unique_ptr<S3Client> one_attempt = MakeClient(options);
  server.Fault({{"method", "GET"}, {"delay_s", 2}, {"count", 1}});
  EXPECT_THAT(one_attempt->GetObject("k"),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "(1 attempt)"));
}

TEST(S3ClientTest, RetriesDroppedConnections) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  server.Fault({{"method", "PUT"}, {"drop", true}, {"count", 2}});
  ASSERT_OK(s3->PutObject("k", "v"));
  EXPECT_EQ(server.Count("PUT"), 3);
  EXPECT_THAT(s3->GetObject("k"), Holds(std::string("v")));
}

TEST(S3ClientTest, RefusedConnectionsAreUnavailableAfterEveryAttempt) {
  // A port nobody listens on: the fake's, after the fake is gone.
  S3ClientOptions options;
  {
    FakeS3 server;
    options = server.Options();
  }
  options.max_attempts = 2;
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  EXPECT_THAT(s3->GetObject("k"), StatusIs(absl::StatusCode::kUnavailable, "(2 attempts)"));
}

TEST(S3ClientTest, ListsEveryPageOfAPrefix) {
  FakeS3 server({"--page_size=2"});
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  std::vector<std::string> keys = {"p/a", "p/b b", "p/c&<>", "p/d/e", "p/f"};
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_OK(s3->PutObject(keys[i], Bytes(i + 1)));
  ASSERT_OK(s3->PutObject("q/other", "x"));
  ASSERT_OK(s3->PutObject("pp", "x"));

  ASSERT_OK_AND_ASSIGN(ListPage first, s3->ListObjectsV2("p/"));
  EXPECT_THAT(first.objects, SizeIs(2));
  EXPECT_FALSE(first.next_continuation_token.empty());

  ASSERT_OK_AND_ASSIGN(std::vector<ListedObject> all, s3->ListAllObjects("p/"));
  ASSERT_THAT(all, SizeIs(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(all[i].key, keys[i]);
    EXPECT_EQ(all[i].size, i + 1);
    EXPECT_EQ(all[i].etag.front(), '"');
  }
  EXPECT_EQ(server.Count("GET", "list-type"), 1 + 3);
  ASSERT_OK_AND_ASSIGN(std::vector<ListedObject> none, s3->ListAllObjects("zzz/"));
  EXPECT_THAT(none, SizeIs(0));
}

TEST(S3ClientTest, LargeObjectsGoUpInPartsAndReadBackWhole) {
  FakeS3 server;
  S3ClientOptions options = server.Options();
  options.multipart_threshold = 6 << 20;
  options.part_size = kMinPartSize;
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  const std::string data = Bytes((11 << 20) + 3, 5);

  ASSERT_OK(s3->PutObject("big", data));
  EXPECT_EQ(server.Count("POST", "uploads"), 1);
  EXPECT_EQ(server.Count("PUT", "partNumber"), 3);  // 5 MiB, 5 MiB, 1 MiB + 3.
  EXPECT_EQ(server.Count("POST", "uploadId"), 1);
  EXPECT_EQ(server.Count("PUT"), 3);  // No single PUT.
  ASSERT_OK_AND_ASSIGN(ObjectInfo info, s3->HeadObject("big"));
  EXPECT_EQ(info.size, data.size());
  EXPECT_THAT(info.etag, HasSubstr("-3\""));
  ASSERT_OK_AND_ASSIGN(std::string read, s3->GetObject("big"));
  EXPECT_TRUE(read == data);
  EXPECT_THAT(s3->GetObject("big", ByteRange{(5 << 20) - 2, 4}),
              Holds(data.substr((5 << 20) - 2, 4)));
  EXPECT_THAT(server.OpenUploads(), SizeIs(0));

  // IfAbsent on a large existing object asks HEAD and sends nothing.
  EXPECT_THAT(s3->PutObjectIfAbsent("big", data), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(server.Count("POST", "uploads"), 1);
}

TEST(S3ClientTest, RetriesAFailedPartAndAbortsTheUploadWhenAPartCannotGoUp) {
  FakeS3 server;
  S3ClientOptions options = server.Options();
  options.multipart_threshold = 6 << 20;
  options.part_size = kMinPartSize;
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  const std::string data = Bytes(11 << 20, 9);

  server.Fault({{"method", "PUT"}, {"query", "partNumber"}, {"status", 503}, {"count", 1}});
  ASSERT_OK(s3->PutObject("retried", data));
  EXPECT_EQ(server.Count("PUT", "partNumber"), 4);

  server.Fault({{"method", "PUT"},
                {"query", "partNumber"},
                {"status", 400},
                {"count", 1},
                {"code", "InvalidArgument"}});
  EXPECT_THAT(s3->PutObject("failed", data),
              StatusIs(absl::StatusCode::kInvalidArgument, "InvalidArgument"));
  EXPECT_EQ(server.Count("DELETE", "uploadId"), 1);
  EXPECT_THAT(server.OpenUploads(), SizeIs(0));
  EXPECT_THAT(s3->HeadObject("failed"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(S3ClientTest, MultipartStepsReportUnknownUploads) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  EXPECT_THAT(s3->UploadPart("k", "nope", 1, "x"),
              StatusIs(absl::StatusCode::kNotFound, "NoSuchUpload"));
  EXPECT_THAT(s3->AbortMultipartUpload("k", "nope"),
              StatusIs(absl::StatusCode::kNotFound, "NoSuchUpload"));
  EXPECT_THAT(s3->UploadPart("k", "nope", 0, "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(std::string upload_id, s3->CreateMultipartUpload("k"));
  ASSERT_OK_AND_ASSIGN(std::string etag, s3->UploadPart("k", upload_id, 1, "only part"));
  ASSERT_OK(s3->CompleteMultipartUpload("k", upload_id, {{1, etag}}));
  EXPECT_THAT(s3->GetObject("k"), Holds(std::string("only part")));
}

TEST(S3ClientTest, GetObjectIntoWritesTheRangeStraightIntoTheBuffer) {
  FakeS3 server;
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  const std::string data = Bytes(300000, 3);
  ASSERT_OK(s3->PutObject("obj", data));
  // Guard bytes either side: nothing outside the range may be touched.
  std::string buffer(1000 + 2, '#');
  ASSERT_OK_AND_ASSIGN(uint64_t got, s3->GetObjectInto("obj", ByteRange{123457, 1000}, &buffer[1]));
  EXPECT_EQ(got, 1000u);
  EXPECT_EQ(buffer.substr(1, 1000), data.substr(123457, 1000));
  EXPECT_EQ(buffer.front(), '#');
  EXPECT_EQ(buffer.back(), '#');
  // A range past the end returns what exists; at the end, OUT_OF_RANGE; a missing key NOT_FOUND
  // with S3's error document (which must not land in the buffer).
  std::string tail(500, '\0');
  ASSERT_OK_AND_ASSIGN(got, s3->GetObjectInto("obj", ByteRange{data.size() - 100, 500}, &tail[0]));
  EXPECT_EQ(got, 100u);
  EXPECT_EQ(tail.substr(0, 100), data.substr(data.size() - 100));
  EXPECT_THAT(s3->GetObjectInto("obj", ByteRange{data.size(), 10}, &tail[0]),
              StatusIs(absl::StatusCode::kOutOfRange));
  std::string untouched(64, '#');
  EXPECT_THAT(s3->GetObjectInto("missing", ByteRange{0, 64}, &untouched[0]),
              StatusIs(absl::StatusCode::kNotFound, "NoSuchKey"));
  EXPECT_EQ(untouched, std::string(64, '#'));
  EXPECT_THAT(s3->GetObjectInto("obj", ByteRange{0, 0}, &tail[0]),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(S3ClientTest, ListingsCarryLastModifiedAndPendingUploadsTheirInitiatedTime) {
  FakeS3 server({"--page_size=2"});
  std::unique_ptr<S3Client> s3 = MakeClient(server.Options());
  const absl::Time before = absl::Now() - absl::Seconds(1);
  ASSERT_OK(s3->PutObject("p/a", "x"));
  ASSERT_OK_AND_ASSIGN(std::vector<ListedObject> objects, s3->ListAllObjects("p/"));
  ASSERT_THAT(objects, SizeIs(1));
  EXPECT_GE(objects[0].last_modified, before);
  EXPECT_LE(objects[0].last_modified, absl::Now() + absl::Seconds(1));

  // Five uploads over three pages (page size 2), one under another prefix.
  std::vector<std::string> ids;
  for (const char* key : {"p/k1", "p/k2", "p/k2", "p/k3", "q/other"}) {
    ASSERT_OK_AND_ASSIGN(ids.emplace_back(), s3->CreateMultipartUpload(key));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<PendingUpload> pending, s3->ListMultipartUploads("p/"));
  ASSERT_THAT(pending, SizeIs(4));
  EXPECT_EQ(pending[0].key, "p/k1");
  EXPECT_EQ(pending[3].key, "p/k3");
  for (const PendingUpload& upload : pending) {
    EXPECT_GE(upload.initiated, before) << upload.key;
    EXPECT_NE(std::find(ids.begin(), ids.end(), upload.upload_id), ids.end()) << upload.upload_id;
  }
  ASSERT_OK(s3->AbortMultipartUpload(pending[0].key, pending[0].upload_id));
  ASSERT_OK_AND_ASSIGN(pending, s3->ListMultipartUploads("p/"));
  EXPECT_THAT(pending, SizeIs(3));
}

TEST(S3ClientTest, ParsesS3TimestampsAndRefusesOthers) {
  ASSERT_OK_AND_ASSIGN(absl::Time time, ParseS3Time("2026-12-05T00:26:53.250Z"));
  EXPECT_EQ(time, absl::FromUnixMillis(1796430413250));
  ASSERT_OK_AND_ASSIGN(time, ParseS3Time("2026-12-05T00:26:53Z"));
  EXPECT_EQ(time, absl::FromUnixSeconds(1796430413));
  EXPECT_THAT(ParseS3Time("yesterday"), StatusIs(absl::StatusCode::kInvalidArgument, "yesterday"));
}

TEST(S3ClientTest, HttpsVerifiesTheServerAgainstTheCaFile) {
  const std::string cert_dir = testing::TestCaseDir() + "-certs";
  ASSERT_EQ(mkdir(cert_dir.c_str(), 0755), 0);
  ASSERT_OK_AND_ASSIGN(testing::TestCertificates certs, testing::MakeTestCertificates(cert_dir));
  FakeS3 server({"--tls_cert=" + certs.server.cert, "--tls_key=" + certs.server.key},
                /*tls=*/true);
  S3ClientOptions options = server.Options();
  options.ca_file = certs.ca;
  std::unique_ptr<S3Client> s3 = MakeClient(options);
  ASSERT_OK(s3->PutObject("k", "over tls"));
  EXPECT_THAT(s3->GetObject("k"), Holds(std::string("over tls")));

  options.ca_file = certs.other_ca;
  EXPECT_THAT(MakeClient(options)->GetObject("k"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "(1 attempt)"));
  options.ca_file = "";  // The system's CAs do not know the test CA either.
  EXPECT_THAT(MakeClient(options)->GetObject("k"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(S3ClientTest, CreateRejectsIncompleteOrInvalidOptions) {
  S3ClientOptions good;
  good.endpoint = "http://127.0.0.1:1";
  good.access_key = "a";
  good.secret_key = "s";
  good.bucket = "b";
  EXPECT_OK(S3Client::Create(good));

  S3ClientOptions options = good;
  options.endpoint = "127.0.0.1:1";
  EXPECT_THAT(S3Client::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, "http://"));
  options.endpoint = "http://127.0.0.1:1/bucket";
  EXPECT_THAT(S3Client::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, "path"));
  options = good;
  options.bucket = "";
  EXPECT_THAT(S3Client::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, "bucket"));
  options = good;
  options.secret_key = "";
  EXPECT_THAT(S3Client::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, "secret"));
  options = good;
  options.part_size = kMinPartSize - 1;
  EXPECT_THAT(S3Client::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, "part_size"));
  options = good;
  options.max_attempts = 0;
  EXPECT_THAT(S3Client::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_attempts"));
}

TEST(S3ClientTest, MapsHttpStatusesToAbslCodes) {
  EXPECT_EQ(StatusCodeForHttp(404, false), absl::StatusCode::kNotFound);
  EXPECT_EQ(StatusCodeForHttp(403, false), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusCodeForHttp(412, true), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(StatusCodeForHttp(412, false), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(StatusCodeForHttp(416, false), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(StatusCodeForHttp(429, false), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeForHttp(503, false), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusCodeForHttp(501, false), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ckpt::s3
