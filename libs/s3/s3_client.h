#ifndef CKPT_LIBS_S3_S3_CLIENT_H_
#define CKPT_LIBS_S3_S3_CLIENT_H_

// S3Client: the object-storage operations the store's S3 chunk backend needs (issue #21), over
// any S3-compatible server (AWS S3, Ceph's radosgw, MinIO), signed with SigV4 (sigv4.h says why
// this is our own code rather than a Debian package) and sent with libcurl.
//
// - Path-style addressing only: objects live at <endpoint>/<bucket>/<key>, which local servers
//   (radosgw on 127.0.0.1, MinIO) need and AWS still accepts.
// - Payloads are signed: x-amz-content-sha256 carries the SHA-256 of the body, so the server
//   refuses a body that changed on the way (XAmzContentSHA256Mismatch) even over plain http, the
//   usual way to reach a local rgw. The cost is one SHA-256 pass over each upload (OpenSSL, about
//   1-2 GB/s a core), small beside the network. `sign_payload = false` sends UNSIGNED-PAYLOAD.
// - Retries: connection errors, timeouts, HTTP 5xx, 429 and S3's 400 RequestTimeout are retried
//   up to `max_attempts` with full-jitter exponential backoff (a Retry-After header lengthens the
//   wait); other 4xx are not. Every operation here is idempotent for a content-addressed caller,
//   so a retry after a lost response is safe (PutObjectIfAbsent may then see its own object and
//   say ALREADY_EXISTS).
// - Errors map HTTP to absl codes once, with S3's error Code and Message from the XML body:
//   404 NOT_FOUND, 401/403 PERMISSION_DENIED, 412 ALREADY_EXISTS (If-None-Match) or
//   FAILED_PRECONDITION, 416 OUT_OF_RANGE, 400 INVALID_ARGUMENT, 409 ABORTED, 501 UNIMPLEMENTED,
//   other 5xx and 429 UNAVAILABLE; transport failures are UNAVAILABLE, timeouts
//   DEADLINE_EXCEEDED, a server certificate that does not verify FAILED_PRECONDITION.
//
// Configuration comes from S3ClientOptions only (never flags or the environment).
// Thread-safe: calls may run concurrently; each takes its own pooled curl handle, and the pool
// keeps connections alive between calls.
//
// Example:
//   S3ClientOptions options;
//   options.endpoint = "http://127.0.0.1:7480";
//   options.access_key = ...; options.secret_key = ...; options.bucket = "ckpt-chunks";
//   ASSIGN_OR_RETURN(std::unique_ptr<S3Client> s3, S3Client::Create(options));
//   absl::Status put = s3->PutObjectIfAbsent("chunks/ab/abcd...", bytes);
//   if (!put.ok() && !absl::IsAlreadyExists(put)) return put;
//   ASSIGN_OR_RETURN(std::string head, s3->GetObject("chunks/ab/abcd...", ByteRange{0, 4096}));

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt::s3 {

// S3's smallest part (except the last) and largest part count for multipart uploads.
inline constexpr uint64_t kMinPartSize = uint64_t{5} << 20;
inline constexpr int kMaxParts = 10000;

struct S3ClientOptions {
  // "http://HOST:PORT" or "https://HOST[:PORT]", without a path. Required.
  std::string endpoint;
  // The region in the signature's scope. rgw's is its zonegroup name ("default" on a fresh one);
  // rgw accepts any value unless zonegroups are configured. Default "us-east-1".
  std::string region = "us-east-1";
  // Credentials. Required.
  std::string access_key;
  std::string secret_key;
  // The bucket every operation addresses (CreateBucket creates it). Required.
  std::string bucket;
  // https only: a PEM file of CA certificates to trust instead of the system's
  // (/etc/ssl/certs). Default: the system's.
  std::string ca_file;
  // Limits for each attempt: establishing the connection, and the whole request (connect, send,
  // wait and receive). Defaults 10 s and 5 min; size the latter for part_size at the slowest
  // link the store should tolerate.
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Minutes(5);
  // Attempts per request, the first included (>= 1). Default 5.
  int max_attempts = 5;
  // Backoff before retry n (0-based) is uniform in [0, min(max_backoff, initial_backoff * 2^n)]
  // (libs/io/backoff.h with full jitter). Defaults 100 ms and 10 s.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  // PutObject switches to a multipart upload for objects larger than this, in parts of
  // part_size bytes (>= kMinPartSize, at most kMaxParts parts). Defaults 64 MiB and 16 MiB.
  uint64_t multipart_threshold = uint64_t{64} << 20;
  uint64_t part_size = uint64_t{16} << 20;
  // Sign the body's SHA-256 (default) or send UNSIGNED-PAYLOAD (e.g. over https to save the
  // hash pass).
  bool sign_payload = true;
  // How PutObjectIfAbsent keeps an existing object from being uploaded again:
  // kIfNoneMatch sends "If-None-Match: *" and the server refuses the write (412) when the key
  // exists: one round trip, but a server that ignores the header overwrites silently;
  // kHeadFirst asks HEAD first and uploads only on 404: works on every server, costs a round
  // trip, and two racing writers may both upload (harmless for content-addressed keys).
  enum class IfAbsentMode { kIfNoneMatch, kHeadFirst };
  IfAbsentMode if_absent_mode = IfAbsentMode::kIfNoneMatch;
};

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;  // > 0.
};

struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;  // As the server sent it, quotes included.
};

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  std::string etag;
  // When the object was last written (S3's LastModified, millisecond precision); the store's
  // garbage collector leaves objects younger than its grace period alone.
  absl::Time last_modified = absl::InfinitePast();
};

// A multipart upload that was created and neither completed nor aborted.
struct PendingUpload {
  std::string key;
  std::string upload_id;
  absl::Time initiated = absl::InfinitePast();
};

struct ListPage {
  std::vector<ListedObject> objects;  // In key order.
  // Pass to the next ListObjectsV2 call; empty on the last page.
  std::string next_continuation_token;
};

struct CompletedPart {
  int part_number = 0;  // 1-based.
  std::string etag;     // From UploadPart.
};

class S3Client {
 public:
  // INVALID_ARGUMENT when an option is missing or out of range (named in the message).
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Creates the bucket. ALREADY_EXISTS when it exists (S3's 409 BucketAlreadyOwnedByYou or
  // BucketAlreadyExists).
  absl::Status CreateBucket();

  // Stores `data` under `key`, replacing any object there; a multipart upload above
  // multipart_threshold (aborted on failure).
  absl::Status PutObject(absl::string_view key, absl::string_view data);

  // Stores `data` under `key` unless an object is there: ALREADY_EXISTS then (its bytes are not
  // compared). See IfAbsentMode. A multipart upload always asks HEAD first, so an existing large
  // object is never sent again.
  absl::Status PutObjectIfAbsent(absl::string_view key, absl::string_view data);

  // The object's bytes, or `range` of them. NOT_FOUND (NoSuchKey); OUT_OF_RANGE when
  // range->offset is at or past the end. A range reaching past the end returns what exists.
  absl::StatusOr<std::string> GetObject(absl::string_view key,
                                        std::optional<ByteRange> range = std::nullopt);

  // `range` of the object written straight into `destination` (range.length bytes): no copy
  // through a string, for reads into a tensor. Returns the bytes written, fewer than
  // range.length only when the object ends first. NOT_FOUND; OUT_OF_RANGE as GetObject.
  absl::StatusOr<uint64_t> GetObjectInto(absl::string_view key, ByteRange range, char* destination);

  // Size and ETag. NOT_FOUND.
  absl::StatusOr<ObjectInfo> HeadObject(absl::string_view key);

  // Deletes the object. OK also when there was none (S3 semantics).
  absl::Status DeleteObject(absl::string_view key);

  // One page (at most `max_keys`, 1..1000) of the objects whose keys start with `prefix`, after
  // the key `start_after` when it is not empty (S3's start-after: a follower of a log lists only
  // what is new).
  absl::StatusOr<ListPage> ListObjectsV2(absl::string_view prefix,
                                         absl::string_view continuation_token = "",
                                         int max_keys = 1000, absl::string_view start_after = "");
  // Every page of ListObjectsV2(prefix).
  absl::StatusOr<std::vector<ListedObject>> ListAllObjects(absl::string_view prefix);

  // Multipart upload steps, for callers that stream parts (PutObject does all four itself).
  // Create returns the upload id; UploadPart returns the part's ETag; Complete assembles the
  // parts in the given (ascending) order and, with `if_none_match`, refuses (ALREADY_EXISTS)
  // when the key exists on servers that support it; Abort discards the parts (NOT_FOUND
  // NoSuchUpload for an unknown id).
  absl::StatusOr<std::string> CreateMultipartUpload(absl::string_view key);
  absl::StatusOr<std::string> UploadPart(absl::string_view key, absl::string_view upload_id,
                                         int part_number, absl::string_view data);
  absl::Status CompleteMultipartUpload(absl::string_view key, absl::string_view upload_id,
                                       const std::vector<CompletedPart>& parts,
                                       bool if_none_match = false);
  absl::Status AbortMultipartUpload(absl::string_view key, absl::string_view upload_id);

  // Every multipart upload in progress whose key starts with `prefix` (all pages of
  // ListMultipartUploads), in key order: for sweeping uploads a crashed writer left behind.
  absl::StatusOr<std::vector<PendingUpload>> ListMultipartUploads(absl::string_view prefix);

  const S3ClientOptions& options() const { return options_; }

 private:
  struct Request;
  struct Response;
  explicit S3Client(S3ClientOptions options);

  absl::StatusOr<Response> Execute(const Request& request);
  absl::Status PutSingle(absl::string_view key, absl::string_view data, bool if_none_match);
  absl::Status PutMultipart(absl::string_view key, absl::string_view data, bool if_none_match);
  void* AcquireHandle();
  void ReleaseHandle(void* handle);

  const S3ClientOptions options_;
  std::string host_;  // "host:port" from the endpoint: the signed Host header.

  absl::Mutex mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(mu_);  // CURL*, connections kept alive.
};

// An S3 timestamp ("2026-12-05T00:26:53.000Z", ISO 8601 in UTC as ListObjectsV2 and
// ListMultipartUploads write it). INVALID_ARGUMENT when it is not one.
absl::StatusOr<absl::Time> ParseS3Time(absl::string_view text);

// The absl code for an HTTP error status; `if_none_match` marks requests that sent
// "If-None-Match: *", for which 412 means the object exists.
absl::StatusCode StatusCodeForHttp(long http_status, bool if_none_match);

}  // namespace ckpt::s3

#endif  // CKPT_LIBS_S3_S3_CLIENT_H_
