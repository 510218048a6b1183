// S3Client's operations (see s3_client.h), each one or more Execute calls: buckets, objects
// (single and multipart puts, ranged gets, head, delete), listing, and multipart uploads. The
// transport they run on is s3_client.cc.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/s3/internal/s3_request.h"
#include "libs/s3/internal/xml_scan.h"
#include "libs/s3/s3_client.h"
#include "libs/status/status_macros.h"

namespace ckpt::s3 {

using internal::XmlElements;
using internal::XmlEscape;
using internal::XmlText;

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
                                                 int max_keys,
                                                 absl::string_view start_after) {
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
  if (!start_after.empty()) request.query.emplace_back("start-after", std::string(start_after));
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
