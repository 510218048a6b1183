#ifndef CKPT_LIBS_S3_INTERNAL_S3_REQUEST_H_
#define CKPT_LIBS_S3_INTERNAL_S3_REQUEST_H_

// S3Client's request and response, private to its files: s3_client.cc (the transport: curl
// handles, signing, retries, Execute) and s3_client_objects.cc (the S3 operations built on
// Execute: objects, listing, multipart uploads).

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "libs/s3/s3_client.h"

namespace ckpt::s3 {

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

}  // namespace ckpt::s3

#endif  // CKPT_LIBS_S3_INTERNAL_S3_REQUEST_H_
