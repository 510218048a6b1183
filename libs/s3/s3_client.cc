#include "libs/s3/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "libs/rpc/backoff.h"
#include "libs/s3/internal/xml_scan.h"
#include "libs/s3/sigv4.h"
#include "libs/status/status_macros.h"

namespace ckpt::s3 {

using internal::XmlElements;
using internal::XmlEscape;
using internal::XmlText;

struct S3Client::Request {
  std::string method;  // GET, HEAD, PUT, POST or DELETE.
  std::string key;     // Empty: the bucket itself.
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;  // Sent and signed.
  absl::string_view body;
  bool if_none_match = false;
  // CompleteMultipartUpload can answer 200 and still fail, with an <Error> document as the body.
  bool error_in_ok_body = false;
  // GetObjectInto: a 206 (partial content) body goes here, at most `sink_capacity` bytes, instead
  // of into Response::body. Any other status's body (an error document, or a whole object from a
  // server that ignored Range) still goes to Response::body.
  char* sink = nullptr;
  size_t sink_capacity = 0;
};

struct S3Client::Response {
  long status = 0;
  std::string body;
  size_t sink_bytes = 0;                                     // Written to Request::sink.
  std::vector<std::pair<std::string, std::string>> headers;  // Names lowercased.

  std::string Header(absl::string_view name) const;
};

namespace {

std::string FindHeader(const std::vector<std::pair<std::string, std::string>>& headers,
                       absl::string_view name) {
  for (const auto& [header, value] : headers) {
    if (header == name) return value;
  }
  return "";
}

// One attempt's outcome: a transport failure (`transport` not OK) or an HTTP response.
struct Attempt {
  absl::Status transport;
  bool retryable = false;
  long status = 0;
  std::string body;
  size_t sink_bytes = 0;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct UploadCursor {
  const char* data;
  size_t remaining;
};

size_t ReadBody(char* buffer, size_t size, size_t count, void* user) {
  auto* cursor = static_cast<UploadCursor*>(user);
  const size_t n = std::min(size * count, cursor->remaining);
  std::memcpy(buffer, cursor->data, n);
  cursor->data += n;
  cursor->remaining -= n;
  return n;
}

size_t WriteBody(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// Where a GetObjectInto attempt's body goes: a 206 body into the caller's buffer, anything else
// into `body` (the status is known by the time the first body byte arrives).
struct SinkTarget {
  CURL* curl;
  char* destination;
  size_t capacity;
  size_t* written;
  std::string* body;
  bool overrun = false;  // the server sent more than the range: the transfer was stopped.
};

size_t WriteSink(char* data, size_t size, size_t count, void* user) {
  auto* target = static_cast<SinkTarget*>(user);
  const size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(target->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status != 206) {
    target->body->append(data, n);
    return n;
  }
  // More than the range asked for: a broken server; fail the transfer rather than overrun.
  if (n > target->capacity - *target->written) {
    target->overrun = true;
    return 0;
  }
  std::memcpy(target->destination + *target->written, data, n);
  *target->written += n;
  return n;
}

size_t WriteHeader(char* data, size_t size, size_t count, void* user) {
  auto* headers = static_cast<std::vector<std::pair<std::string, std::string>>*>(user);
  const absl::string_view line(data, size * count);
  if (absl::StartsWith(line, "HTTP/")) {
    headers->clear();  // A new response (after a 100 Continue): forget the previous one's.
    return line.size();
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    headers->emplace_back(absl::AsciiStrToLower(line.substr(0, colon)),
                          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return line.size();
}

absl::Status TransportError(CURLcode code, const char* detail, bool* retryable) {
  const std::string message =
      absl::StrCat(curl_easy_strerror(code), *detail != '\0' ? absl::StrCat(": ", detail) : "");
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      *retryable = true;
      return absl::DeadlineExceededError(message);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_ISSUER_ERROR:
      *retryable = false;
      return absl::FailedPreconditionError(message);
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      *retryable = false;
      return absl::InvalidArgumentError(message);
    default:  // Refused, reset, closed early, DNS, TLS handshake: the next try may get through.
      *retryable = true;
      return absl::UnavailableError(message);
  }
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

std::string S3Client::Response::Header(absl::string_view name) const {
  return FindHeader(headers, name);
}

absl::StatusOr<absl::Time> ParseS3Time(absl::string_view text) {
  absl::Time time;
  std::string error;
  // %E*S takes the optional fraction ("53.000"); S3 always writes UTC with a 'Z'.
  if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E*SZ", text, absl::UTCTimeZone(), &time, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an S3 timestamp: \"", text, "\" (", error, ")"));
  }
  return time;
}

absl::StatusCode StatusCodeForHttp(long http_status, bool if_none_match) {
  switch (http_status) {
    case 400:
      return absl::StatusCode::kInvalidArgument;
    case 401:
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kAborted;
    case 412:
      return if_none_match ? absl::StatusCode::kAlreadyExists
                           : absl::StatusCode::kFailedPrecondition;
    case 416:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kUnavailable;
    case 501:
      return absl::StatusCode::kUnimplemented;
    default:
      return http_status >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  }
}

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  absl::string_view authority = options.endpoint;
  if (!absl::ConsumePrefix(&authority, "http://") && !absl::ConsumePrefix(&authority, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 endpoint must start with http:// or https://, got \"", options.endpoint, "\""));
  }
  absl::ConsumeSuffix(&authority, "/");
  if (authority.empty() || absl::StrContains(authority, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 endpoint must be scheme://host[:port] without a path (path-style addressing), got \"",
        options.endpoint, "\""));
  }
  if (options.bucket.empty()) return absl::InvalidArgumentError("S3 bucket is empty");
  if (options.access_key.empty() || options.secret_key.empty()) {
    return absl::InvalidArgumentError("S3 access key or secret key is empty");
  }
  if (options.region.empty()) return absl::InvalidArgumentError("S3 region is empty");
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 max_attempts must be >= 1, got ", options.max_attempts));
  }
  if (options.part_size < kMinPartSize) {
    return absl::InvalidArgumentError(absl::StrCat("S3 part_size must be >= ", kMinPartSize,
                                                   " bytes (S3's minimum), got ",
                                                   options.part_size));
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("S3 connect_timeout and request_timeout must be positive");
  }
  InitCurlOnce();
  std::string host(authority);
  if (absl::EndsWith(options.endpoint, "/")) options.endpoint.pop_back();
  auto client = std::unique_ptr<S3Client>(new S3Client(std::move(options)));
  client->host_ = std::move(host);
  return client;
}

S3Client::S3Client(S3ClientOptions options) : options_(std::move(options)) {}

S3Client::~S3Client() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* S3Client::AcquireHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_handles_.empty()) {
      void* handle = idle_handles_.back();
      idle_handles_.pop_back();
      return handle;
    }
  }
  return curl_easy_init();
}

void S3Client::ReleaseHandle(void* handle) {
  // Reset clears the options but keeps the handle's live connections for the next request.
  curl_easy_reset(static_cast<CURL*>(handle));
  absl::MutexLock lock(&mu_);
  idle_handles_.push_back(handle);
}

absl::StatusOr<S3Client::Response> S3Client::Execute(const Request& request) {
  const std::string canonical_uri =
      absl::StrCat("/", UriEncode(options_.bucket, true), request.key.empty() ? "" : "/",
                   UriEncode(request.key, false));
  const std::string query = CanonicalQueryString(request.query);
  const std::string url =
      absl::StrCat(options_.endpoint, canonical_uri, query.empty() ? "" : "?", query);
  const std::string what = absl::StrCat(request.method, " ", url);
  const bool has_body = request.method == "PUT" || request.method == "POST";
  const std::string payload_hash =
      !has_body ? std::string(kEmptyPayloadSha256)
                : (options_.sign_payload ? Sha256Hex(request.body) : std::string(kUnsignedPayload));
  const SigV4Credentials credentials{options_.access_key, options_.secret_key, options_.region,
                                     "s3"};

  absl::Status last;
  // Full jitter (AWS's advice for throttled clients); attempts are bounded by max_attempts.
  Backoff backoff(BackoffPolicy{options_.initial_backoff, options_.max_backoff, 2.0, 1.0});
  absl::Duration wait;
  int attempts = 0;
  while (true) {
    if (attempts > 0) absl::SleepFor(wait);
    wait = *backoff.Next();
    ++attempts;

    // Signed anew for each attempt: the signature covers x-amz-date.
    const std::string amz_date = AmzDate(absl::Now());
    SigV4Request signed_request;
    signed_request.method = request.method;
    signed_request.canonical_uri = canonical_uri;
    signed_request.query = request.query;
    signed_request.headers = {
        {"host", host_}, {"x-amz-content-sha256", payload_hash}, {"x-amz-date", amz_date}};
    signed_request.headers.insert(signed_request.headers.end(), request.headers.begin(),
                                  request.headers.end());
    signed_request.payload_hash = payload_hash;
    const std::string authorization = AuthorizationHeader(signed_request, credentials, amz_date);

    curl_slist* header_list = nullptr;
    for (const auto& [name, value] : signed_request.headers) {
      header_list = curl_slist_append(header_list, absl::StrCat(name, ": ", value).c_str());
    }
    header_list = curl_slist_append(header_list, ("Authorization: " + authorization).c_str());
    // No 100-continue round trip, and no form Content-Type on POST bodies (they are XML).
    header_list = curl_slist_append(header_list, "Expect:");
    header_list = curl_slist_append(header_list, "Content-Type:");

    Attempt attempt;
    CURL* curl = static_cast<CURL*>(AcquireHandle());
    if (curl == nullptr) {
      curl_slist_free_all(header_list);
      return absl::ResourceExhaustedError(absl::StrCat(what, ": curl_easy_init failed"));
    }
    char error_buffer[CURL_ERROR_SIZE] = {0};
    UploadCursor cursor{request.body.data(), request.body.size()};
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, header_list);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout)));
    SinkTarget sink{curl, request.sink, request.sink_capacity, &attempt.sink_bytes, &attempt.body};
    if (request.sink != nullptr) {
      curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteSink);
      curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    } else {
      curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
      curl_easy_setopt(curl, CURLOPT_WRITEDATA, &attempt.body);
    }
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, WriteHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &attempt.headers);
    if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (request.method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (request.method == "PUT") {
      curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
      curl_easy_setopt(curl, CURLOPT_READDATA, &cursor);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    } else if (request.method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    } else if (request.method == "DELETE") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    const CURLcode code = curl_easy_perform(curl);
    if (sink.overrun) {
      // Not a transport hiccup: the server answered a range with more bytes than it covers, and
      // asking again would get the same. Whatever it sent cannot be trusted to be the range.
      ReleaseHandle(curl);
      curl_slist_free_all(header_list);
      return absl::DataLossError(absl::StrCat(
          what, ": the server sent more than the ", request.sink_capacity,
          " bytes of the range asked for (", FindHeader(request.headers, "range"), ")"));
    }
    if (code != CURLE_OK) {
      attempt.transport = TransportError(code, error_buffer, &attempt.retryable);
    } else {
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &attempt.status);
    }
    ReleaseHandle(curl);
    curl_slist_free_all(header_list);

    if (!attempt.transport.ok()) {
      last = attempt.transport;
      if (!attempt.retryable || attempts >= options_.max_attempts) break;
      continue;
    }
    long status = attempt.status;
    if (status >= 200 && status < 300 && request.error_in_ok_body &&
        !XmlElements(attempt.body, "Error").empty()) {
      status = 500;  // S3 documents these as retryable (e.g. InternalError while assembling).
    }
    if (status >= 200 && status < 300) {
      Response response;
      response.status = attempt.status;
      response.body = std::move(attempt.body);
      response.sink_bytes = attempt.sink_bytes;
      response.headers = std::move(attempt.headers);
      return response;
    }
    const std::string s3_code = XmlText(attempt.body, "Code").value_or("");
    const std::string s3_message = XmlText(attempt.body, "Message").value_or("");
    const std::string request_id = XmlText(attempt.body, "RequestId").value_or("");
    last = absl::Status(
        StatusCodeForHttp(status, request.if_none_match),
        absl::StrCat("HTTP ", status, s3_code.empty() ? "" : " ", s3_code,
                     s3_message.empty() ? "" : ": ", s3_message,
                     request_id.empty() ? "" : absl::StrCat(" (request id ", request_id, ")")));
    const bool retryable =
        status >= 500 || status == 429 || (status == 400 && s3_code == "RequestTimeout");
    if (!retryable || attempts >= options_.max_attempts) break;
    // A server that says when to come back (429, 503 SlowDown) is waited for, within max_backoff.
    int64_t retry_after_seconds = 0;
    if (absl::SimpleAtoi(FindHeader(attempt.headers, "retry-after"), &retry_after_seconds) &&
        retry_after_seconds > 0) {
      wait = std::max(wait, std::min(absl::Seconds(retry_after_seconds), options_.max_backoff));
    }
  }
  return absl::Status(last.code(), absl::StrCat(what, ": ", last.message(), " (", attempts,
                                                attempts == 1 ? " attempt)" : " attempts)"));
}

absl::Status S3Client::CreateBucket() {
  Request request;
  request.method = "PUT";
  absl::StatusOr<Response> response = Execute(request);
  if (absl::IsAborted(response.status()) &&
      (absl::StrContains(response.status().message(), "BucketAlreadyOwnedByYou") ||
       absl::StrContains(response.status().message(), "BucketAlreadyExists"))) {
    return absl::AlreadyExistsError(response.status().message());
  }
  return response.status();
}

absl::Status S3Client::PutSingle(absl::string_view key, absl::string_view data,
                                 bool if_none_match) {
  Request request;
  request.method = "PUT";
  request.key = std::string(key);
  request.body = data;
  request.if_none_match = if_none_match;
  if (if_none_match) request.headers.emplace_back("if-none-match", "*");
  return Execute(request).status();
}

absl::Status S3Client::PutMultipart(absl::string_view key, absl::string_view data,
                                    bool if_none_match) {
  // Grow the parts when the object would need more than S3's 10000.
  const uint64_t part_size =
      std::max<uint64_t>(options_.part_size, (data.size() + kMaxParts - 1) / kMaxParts);
  ASSIGN_OR_RETURN(const std::string upload_id, CreateMultipartUpload(key));
  std::vector<CompletedPart> parts;
  absl::Status status;
  for (uint64_t offset = 0; offset < data.size() && status.ok(); offset += part_size) {
    const int part_number = static_cast<int>(parts.size()) + 1;
    absl::StatusOr<std::string> etag =
        UploadPart(key, upload_id, part_number, data.substr(offset, part_size));
    if (etag.ok()) {
      parts.push_back(CompletedPart{part_number, *std::move(etag)});
    } else {
      status = etag.status();
    }
  }
  if (status.ok()) status = CompleteMultipartUpload(key, upload_id, parts, if_none_match);
  if (!status.ok()) {
    // Uploaded parts are stored (and billed) until aborted. If the abort fails too, the parts
    // stay until a bucket lifecycle rule (AbortIncompleteMultipartUpload) or a later sweep.
    AbortMultipartUpload(key, upload_id).IgnoreError();
  }
  return status;
}

absl::Status S3Client::PutObject(absl::string_view key, absl::string_view data) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  if (data.size() > options_.multipart_threshold) return PutMultipart(key, data, false);
  return PutSingle(key, data, false);
}

absl::Status S3Client::PutObjectIfAbsent(absl::string_view key, absl::string_view data) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  const bool multipart = data.size() > options_.multipart_threshold;
  if (multipart || options_.if_absent_mode == S3ClientOptions::IfAbsentMode::kHeadFirst) {
    absl::StatusOr<ObjectInfo> existing = HeadObject(key);
    if (existing.ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("s3://", options_.bucket, "/", key, " exists (", existing->size, " bytes)"));
    }
    if (!absl::IsNotFound(existing.status())) return existing.status();
  }
  const bool if_none_match = options_.if_absent_mode == S3ClientOptions::IfAbsentMode::kIfNoneMatch;
  return multipart ? PutMultipart(key, data, if_none_match) : PutSingle(key, data, if_none_match);
}

absl::StatusOr<std::string> S3Client::GetObject(absl::string_view key,
                                                std::optional<ByteRange> range) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  if (range.has_value() && range->length == 0) {
    return absl::InvalidArgumentError(absl::StrCat("empty byte range at ", range->offset));
  }
  Request request;
  request.method = "GET";
  request.key = std::string(key);
  if (range.has_value()) {
    request.headers.emplace_back(
        "range", absl::StrCat("bytes=", range->offset, "-", range->offset + range->length - 1));
  }
  ASSIGN_OR_RETURN(Response response, Execute(request));
  if (range.has_value() && response.status == 200) {
    // A server that ignores Range sends everything: keep the asked-for slice.
    if (range->offset >= response.body.size()) {
      return absl::OutOfRangeError(absl::StrCat("GET s3://", options_.bucket, "/", key, ": offset ",
                                                range->offset, " at or past the end (",
                                                response.body.size(), " bytes)"));
    }
    return response.body.substr(range->offset, range->length);
  }
  return std::move(response.body);
}

absl::StatusOr<uint64_t> S3Client::GetObjectInto(absl::string_view key, ByteRange range,
                                                 char* destination) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  if (range.length == 0) {
    return absl::InvalidArgumentError(absl::StrCat("empty byte range at ", range.offset));
  }
  Request request;
  request.method = "GET";
  request.key = std::string(key);
  request.headers.emplace_back(
      "range", absl::StrCat("bytes=", range.offset, "-", range.offset + range.length - 1));
  request.sink = destination;
  request.sink_capacity = range.length;
  ASSIGN_OR_RETURN(Response response, Execute(request));
  if (response.status == 206) return static_cast<uint64_t>(response.sink_bytes);
  // A server that ignores Range sends everything (200): keep the asked-for slice.
  if (range.offset >= response.body.size()) {
    return absl::OutOfRangeError(absl::StrCat("GET s3://", options_.bucket, "/", key, ": offset ",
                                              range.offset, " at or past the end (",
                                              response.body.size(), " bytes)"));
  }
  const size_t n = std::min<size_t>(range.length, response.body.size() - range.offset);
  std::memcpy(destination, response.body.data() + range.offset, n);
  return static_cast<uint64_t>(n);
}

absl::StatusOr<ObjectInfo> S3Client::HeadObject(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  Request request;
  request.method = "HEAD";
  request.key = std::string(key);
  ASSIGN_OR_RETURN(Response response, Execute(request));
  ObjectInfo info;
  if (!absl::SimpleAtoi(response.Header("content-length"), &info.size)) {
    return absl::UnknownError(absl::StrCat("HEAD s3://", options_.bucket, "/", key,
                                           ": no Content-Length in the response"));
  }
  info.etag = response.Header("etag");
  return info;
}

absl::Status S3Client::DeleteObject(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  Request request;
  request.method = "DELETE";
  request.key = std::string(key);
  return Execute(request).status();
}

absl::StatusOr<ListPage> S3Client::ListObjectsV2(absl::string_view prefix,
                                                 absl::string_view continuation_token,
                                                 int max_keys) {
  if (max_keys < 1 || max_keys > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("max_keys must be 1..1000, got ", max_keys));
  }
  Request request;
  request.method = "GET";
  request.query = {
      {"list-type", "2"}, {"prefix", std::string(prefix)}, {"max-keys", absl::StrCat(max_keys)}};
  if (!continuation_token.empty()) {
    request.query.emplace_back("continuation-token", std::string(continuation_token));
  }
  ASSIGN_OR_RETURN(Response response, Execute(request));
  ListPage page;
  for (absl::string_view contents : XmlElements(response.body, "Contents")) {
    ListedObject object;
    object.key = XmlText(contents, "Key").value_or("");
    object.etag = XmlText(contents, "ETag").value_or("");
    if (std::optional<std::string> modified = XmlText(contents, "LastModified")) {
      ASSIGN_OR_RETURN(object.last_modified, ParseS3Time(*modified));
    }
    if (object.key.empty() ||
        !absl::SimpleAtoi(XmlText(contents, "Size").value_or(""), &object.size)) {
      return absl::UnknownError(absl::StrCat("ListObjectsV2 s3://", options_.bucket, "/", prefix,
                                             ": an entry without Key or Size: ", contents));
    }
    page.objects.push_back(std::move(object));
  }
  if (XmlText(response.body, "IsTruncated").value_or("false") == "true") {
    page.next_continuation_token = XmlText(response.body, "NextContinuationToken").value_or("");
    if (page.next_continuation_token.empty()) {
      return absl::UnknownError(absl::StrCat("ListObjectsV2 s3://", options_.bucket, "/", prefix,
                                             ": truncated page without NextContinuationToken"));
    }
  }
  return page;
}

absl::StatusOr<std::vector<ListedObject>> S3Client::ListAllObjects(absl::string_view prefix) {
  std::vector<ListedObject> all;
  std::string token;
  do {
    ASSIGN_OR_RETURN(ListPage page, ListObjectsV2(prefix, token));
    std::move(page.objects.begin(), page.objects.end(), std::back_inserter(all));
    token = std::move(page.next_continuation_token);
  } while (!token.empty());
  return all;
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  Request request;
  request.method = "POST";
  request.key = std::string(key);
  request.query = {{"uploads", ""}};
  ASSIGN_OR_RETURN(Response response, Execute(request));
  std::string upload_id = XmlText(response.body, "UploadId").value_or("");
  if (upload_id.empty()) {
    return absl::UnknownError(absl::StrCat("CreateMultipartUpload s3://", options_.bucket, "/", key,
                                           ": no UploadId in the response"));
  }
  return upload_id;
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view key, absl::string_view upload_id,
                                                 int part_number, absl::string_view data) {
  if (part_number < 1 || part_number > kMaxParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("part number must be 1..", kMaxParts, ", got ", part_number));
  }
  Request request;
  request.method = "PUT";
  request.key = std::string(key);
  request.query = {{"partNumber", absl::StrCat(part_number)}, {"uploadId", std::string(upload_id)}};
  request.body = data;
  ASSIGN_OR_RETURN(Response response, Execute(request));
  std::string etag = response.Header("etag");
  if (etag.empty()) {
    return absl::UnknownError(absl::StrCat("UploadPart ", part_number, " of s3://", options_.bucket,
                                           "/", key, ": no ETag in the response"));
  }
  return etag;
}

absl::Status S3Client::CompleteMultipartUpload(absl::string_view key, absl::string_view upload_id,
                                               const std::vector<CompletedPart>& parts,
                                               bool if_none_match) {
  std::string body = "<CompleteMultipartUpload>";
  for (const CompletedPart& part : parts) {
    absl::StrAppend(&body, "<Part><PartNumber>", part.part_number, "</PartNumber><ETag>",
                    XmlEscape(part.etag), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  Request request;
  request.method = "POST";
  request.key = std::string(key);
  request.query = {{"uploadId", std::string(upload_id)}};
  request.body = body;
  request.error_in_ok_body = true;
  request.if_none_match = if_none_match;
  if (if_none_match) request.headers.emplace_back("if-none-match", "*");
  return Execute(request).status();
}

absl::StatusOr<std::vector<PendingUpload>> S3Client::ListMultipartUploads(
    absl::string_view prefix) {
  std::vector<PendingUpload> all;
  std::string key_marker, upload_id_marker;
  while (true) {
    Request request;
    request.method = "GET";
    request.query = {{"uploads", ""}, {"prefix", std::string(prefix)}};
    if (!key_marker.empty()) {
      request.query.emplace_back("key-marker", key_marker);
      request.query.emplace_back("upload-id-marker", upload_id_marker);
    }
    ASSIGN_OR_RETURN(Response response, Execute(request));
    for (absl::string_view upload : XmlElements(response.body, "Upload")) {
      PendingUpload pending;
      pending.key = XmlText(upload, "Key").value_or("");
      pending.upload_id = XmlText(upload, "UploadId").value_or("");
      if (pending.key.empty() || pending.upload_id.empty()) {
        return absl::UnknownError(absl::StrCat("ListMultipartUploads s3://", options_.bucket, "/",
                                               prefix,
                                               ": an entry without Key or UploadId: ", upload));
      }
      if (std::optional<std::string> initiated = XmlText(upload, "Initiated")) {
        ASSIGN_OR_RETURN(pending.initiated, ParseS3Time(*initiated));
      }
      all.push_back(std::move(pending));
    }
    if (XmlText(response.body, "IsTruncated").value_or("false") != "true") break;
    key_marker = XmlText(response.body, "NextKeyMarker").value_or("");
    upload_id_marker = XmlText(response.body, "NextUploadIdMarker").value_or("");
    if (key_marker.empty()) {
      return absl::UnknownError(absl::StrCat("ListMultipartUploads s3://", options_.bucket, "/",
                                             prefix, ": truncated page without NextKeyMarker"));
    }
  }
  return all;
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view key, absl::string_view upload_id) {
  Request request;
  request.method = "DELETE";
  request.key = std::string(key);
  request.query = {{"uploadId", std::string(upload_id)}};
  return Execute(request).status();
}

}  // namespace ckpt::s3
