#include "libs/console/console_api.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/io/proto_json.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_filter_text.h"
#include "libs/store/version_ref.h"
#include "nlohmann/json.hpp"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {
namespace {

constexpr absl::string_view kPrefix = "/api/v1/";

// The version page's manifest: everything but the chunk lists, which only a reader of bytes needs
// (a large model's run to megabytes of addresses).
v1::Manifest WithoutChunks(v1::Manifest manifest) {
  for (v1::TensorMeta& meta : *manifest.mutable_tensors()) meta.clear_chunks();
  for (v1::TensorMeta& meta : *manifest.mutable_state_tensors()) meta.clear_chunks();
  return manifest;
}

// The version filter of a /versions request's query (`ckpt ls`'s options by their names).
absl::StatusOr<VersionFilterText> FilterOf(const std::multimap<std::string, std::string>& query) {
  VersionFilterText text;
  for (const auto& [name, value] : query) {
    if (name == "tag") {
      text.tags.push_back(value);
    } else if (name == "label") {
      text.labels.push_back(value);
    } else if (name == "where") {
      text.where.push_back(value);
    } else if ((name == "since" || name == "until") && query.count(name) > 1) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' may be given once"));
    } else if (name == "since") {
      text.since = value;
    } else if (name == "until") {
      text.until = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown query parameter '", name,
                       "' (the filters are tag, label, where, since, until)"));
    }
  }
  return text;
}

}  // namespace

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnimplemented:
      return 405;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

ApiResponse ErrorResponse(const absl::Status& status) {
  ApiResponse response;
  response.status = HttpStatusOf(status.code());
  // nlohmann escapes the message (a model name in it may hold quotes or markup).
  const nlohmann::json body = {{"error",
                                {{"code", absl::StatusCodeToString(status.code())},
                                 {"message", std::string(status.message())}}}};
  response.body = body.dump();
  return response;
}

ApiResponse ConsoleApi::Handle(const ApiRequest& request) const {
  absl::StatusOr<std::string> body = Route(request);
  if (!body.ok()) return ErrorResponse(body.status());
  ApiResponse response;
  response.body = *std::move(body);
  return response;
}

absl::StatusOr<std::string> ConsoleApi::Route(const ApiRequest& request) const {
  absl::string_view path = request.path;
  if (!absl::ConsumePrefix(&path, kPrefix)) {
    return absl::NotFoundError(
        absl::StrCat("no API at ", request.path, " (the API is under ", kPrefix, ")"));
  }
  const std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  const bool models = !parts.empty() && parts[0] == "models";
  const bool known = models && (parts.size() == 1 ||
                                (parts.size() >= 3 && parts.size() <= 4 && parts[2] == "versions"));
  if (!known) return absl::NotFoundError(absl::StrCat("no API at ", request.path));
  if (request.method != "GET") {
    return absl::UnimplementedError(
        absl::StrCat(request.method, " is not allowed on ", request.path, " (GET is)"));
  }
  ASSIGN_OR_RETURN(const std::shared_ptr<CheckpointStore> store,
                   store_for_caller_(request.bearer_token));
  if (parts.size() == 1) {
    ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> listed, store->ListModels());
    v1::ListModelsResponse response;
    for (v1::ModelInfo& info : listed) *response.add_models() = std::move(info);
    return ProtoToJson(response);
  }
  const std::string& model = parts[1];
  if (parts.size() == 3) {
    ASSIGN_OR_RETURN(const VersionFilterText text, FilterOf(request.query));
    std::vector<v1::VersionInfo> listed;
    if (text.empty()) {
      ASSIGN_OR_RETURN(listed, store->ListVersions(model));
    } else {
      ASSIGN_OR_RETURN(const v1::VersionFilter filter, VersionFilterFromText(text));
      ASSIGN_OR_RETURN(listed, store->FindVersions(model, filter));
    }
    v1::ListVersionsResponse response;
    for (v1::VersionInfo& info : listed) *response.add_versions() = std::move(info);
    return ProtoToJson(response);
  }
  ASSIGN_OR_RETURN(const v1::VersionRef ref, ParseVersionRef(absl::StrCat(model, "@", parts[3])));
  ASSIGN_OR_RETURN(v1::Manifest manifest, store->GetManifest(ref));
  return ProtoToJson(WithoutChunks(std::move(manifest)));
}

}  // namespace ckpt
