// S3Client's transport (see s3_client.h): curl handles, one signed request with its retries
// (Execute), and the mapping of HTTP and S3 errors to statuses. The operations built on it are
// s3_client_objects.cc.

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
#include "libs/io/backoff.h"
#include "libs/s3/internal/s3_request.h"
#include "libs/s3/internal/xml_scan.h"
#include "libs/s3/sigv4.h"
#include "libs/status/status_macros.h"

namespace ckpt::s3 {

using internal::XmlElements;
using internal::XmlText;

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

}  // namespace ckpt::s3
