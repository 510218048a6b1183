#include "libs/console/console_api.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/io/proto_json.h"
#include "libs/registry/promotion.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_diff.h"
#include "libs/store/version_filter.h"
#include "libs/store/version_filter_text.h"
#include "libs/store/version_lineage.h"
#include "libs/store/version_ref.h"
#include "nlohmann/json.hpp"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {
namespace {

constexpr absl::string_view kPrefix = "/api/v1/";

// Marks a status as "this method is not allowed on this path" (the payload: the allowed method).
constexpr absl::string_view kMethodNotAllowedPayload = "ckpt.console/method-not-allowed";

// The version page's manifest: everything but the chunk lists, which only a reader of bytes needs
// (a large model's run to megabytes of addresses).
v1::Manifest WithoutChunks(v1::Manifest manifest) {
  for (v1::TensorMeta& meta : *manifest.mutable_tensors()) meta.clear_chunks();
  for (v1::TensorMeta& meta : *manifest.mutable_state_tensors()) meta.clear_chunks();
  return manifest;
}

// 400 for a query parameter `allowed` does not name, or one given twice.
absl::Status CheckQuery(const std::multimap<std::string, std::string>& query,
                        const std::vector<absl::string_view>& allowed,
                        const std::vector<absl::string_view>& repeatable = {}) {
  for (const auto& [name, value] : query) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown query parameter '", name, "' (this request takes ",
                       allowed.empty() ? "none" : absl::StrJoin(allowed, ", "), ")"));
    }
    if (query.count(name) > 1 &&
        std::find(repeatable.begin(), repeatable.end(), name) == repeatable.end()) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' may be given once"));
    }
  }
  return absl::OkStatus();
}

std::string QueryValue(const std::multimap<std::string, std::string>& query,
                       const std::string& name) {
  auto it = query.find(name);
  return it == query.end() ? "" : it->second;
}

// A non-negative integer parameter; `fallback` when absent.
absl::StatusOr<int64_t> QueryCount(const std::multimap<std::string, std::string>& query,
                                   const std::string& name, int64_t fallback) {
  const std::string text = QueryValue(query, name);
  if (text.empty()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' must be a non-negative integer, got '", text, "'"));
  }
  return value;
}

// How long a watch stays quiet before a keep-alive comment: also how soon a page that went away
// is noticed (only a write finds out) and its watch slot given back.
constexpr absl::Duration kWatchKeepAlive = absl::Seconds(5);

// The longest page a history or audit request gets: the page's next_after_sequence continues it.
constexpr int64_t kMaxPage = 1000;

// since, after and limit of a paged listing (HistoryQuery, AuditQuery) from the query; a page
// holds 1 to kMaxPage records.
template <typename Query>
absl::Status ReadPage(const std::multimap<std::string, std::string>& query, Query& page) {
  if (const std::string since = QueryValue(query, "since"); !since.empty()) {
    ASSIGN_OR_RETURN(page.since, ParseTimeSpec("since", since));
  }
  ASSIGN_OR_RETURN(page.after_sequence, QueryCount(query, "after", 0));
  ASSIGN_OR_RETURN(page.limit, QueryCount(query, "limit", kMaxPage));
  page.limit = std::clamp<int64_t>(page.limit, 1, kMaxPage);
  return absl::OkStatus();
}

// A full page's last sequence number, where the next page begins; 0 when this page was the last.
template <typename Record>
int64_t NextAfter(const std::vector<Record>& records, int64_t limit) {
  return static_cast<int64_t>(records.size()) == limit ? records.back().sequence() : 0;
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
      return 501;
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

absl::Status MethodNotAllowed(absl::string_view method, absl::string_view path,
                              absl::string_view allowed) {
  absl::Status status = absl::InvalidArgumentError(
      absl::StrCat(method, " is not allowed on ", path, " (", allowed, " is)"));
  status.SetPayload(kMethodNotAllowedPayload, absl::Cord(allowed));
  return status;
}

ApiResponse ErrorResponse(const absl::Status& status) {
  ApiResponse response;
  // A method the path does not have is the request's fault, not a missing feature: 405.
  const bool method_not_allowed = status.GetPayload(kMethodNotAllowedPayload).has_value();
  response.status = method_not_allowed ? 405 : HttpStatusOf(status.code());
  // nlohmann escapes the message (a model name in it may hold quotes or markup).
  const nlohmann::json body = {
      {"error",
       {{"code", method_not_allowed ? std::string("METHOD_NOT_ALLOWED")
                                    : absl::StatusCodeToString(status.code())},
        {"message", std::string(status.message())}}}};
  response.body = body.dump();
  return response;
}

namespace {

// PERMISSION_DENIED for a request a page of another site made (see ApiRequest::fetch_site).
absl::Status CheckSameSite(const ApiRequest& request) {
  if (request.fetch_site.empty() || request.fetch_site == "same-origin" ||
      request.fetch_site == "none") {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("a request from a page of another site (Sec-Fetch-Site: ", request.fetch_site,
                   ") is refused; open the console itself"));
}

}  // namespace

ApiResponse ConsoleApi::Handle(const ApiRequest& request) const {
  if (absl::Status same_site = CheckSameSite(request); !same_site.ok()) {
    return ErrorResponse(same_site);
  }
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
  const bool console = parts.size() == 1 && parts[0] == "console";
  const bool me = parts.size() == 1 && parts[0] == "me";
  const bool models = !parts.empty() && parts[0] == "models";
  const bool versions = parts.size() >= 3 && parts[2] == "versions";
  // Changes (POST, a JSON body): promote and roll back an alias, annotate a version.
  const bool change =
      models && ((parts.size() == 3 && (parts[2] == "promote" || parts[2] == "rollback")) ||
                 (versions && parts.size() == 5 && parts[4] == "annotations"));
  const bool known =
      console || me || change ||
      (models && (parts.size() == 1 || (versions && parts.size() <= 4) ||
                  (versions && parts.size() == 5 && parts[4] == "lineage") ||
                  (parts.size() == 3 &&
                   (parts[2] == "history" || parts[2] == "audit" || parts[2] == "diff"))));
  if (!known) return absl::NotFoundError(absl::StrCat("no API at ", request.path));
  const char* const allowed = change ? "POST" : "GET";
  if (request.method != allowed) return MethodNotAllowed(request.method, request.path, allowed);
  if (console) {
    // The page signs in without a token when the browser presented a certificate, and asks for
    // none when the store has no identities: it then takes a call without credentials as
    // "anonymous" (asked here, so the page makes no call it expects to be refused).
    bool store_open = false;
    if (identity_for_caller_) {
      const absl::StatusOr<v1::WhoAmIResponse> anonymous =
          identity_for_caller_(CallerCredentials{}, v1::WhoAmIRequest());
      store_open = anonymous.ok() && anonymous->identity() == "anonymous";
    }
    return nlohmann::json({{"store", store_address_},
                           {"client_certificate", request.certificate_names},
                           {"store_open", store_open}})
        .dump();
  }
  if (me) return Me(request);
  ASSIGN_OR_RETURN(const std::shared_ptr<CheckpointStore> store,
                   store_for_caller_(request.caller()));
  if (parts.size() == 1) {
    RETURN_IF_ERROR(CheckQuery(request.query, {}));
    ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> listed, store->ListModels());
    v1::ListModelsResponse response;
    for (v1::ModelInfo& info : listed) *response.add_models() = std::move(info);
    return ProtoToJson(response);
  }
  const std::string& model = parts[1];
  if (parts[2] == "promote" || parts[2] == "rollback") {
    return Change(*store, model, parts[2], request);
  }
  if (parts[2] == "history") return History(*store, model, request.query);
  if (parts[2] == "audit") return Audit(*store, model, request.query);
  if (parts[2] == "diff") return Diff(*store, model, request.query);
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
  RETURN_IF_ERROR(CheckQuery(request.query, {}));
  ASSIGN_OR_RETURN(const v1::VersionRef ref, ParseVersionRef(absl::StrCat(model, "@", parts[3])));
  if (parts.size() == 5 && parts[4] == "annotations") return Annotate(*store, ref, request);
  if (parts.size() == 5) return Lineage(*store, ref);
  ASSIGN_OR_RETURN(v1::Manifest manifest, store->GetManifest(ref));
  return ProtoToJson(WithoutChunks(std::move(manifest)));
}
absl::StatusOr<std::string> ConsoleApi::Me(const ApiRequest& request) const {
  RETURN_IF_ERROR(CheckQuery(request.query, {"model", "method"}, {"method"}));
  if (identity_for_caller_ == nullptr) {
    return absl::UnimplementedError("this console cannot ask the store who its callers are");
  }
  v1::WhoAmIRequest asked;
  asked.set_model(QueryValue(request.query, "model"));
  if (!asked.model().empty()) RETURN_IF_ERROR(ValidateModelName(asked.model()));
  const auto methods = request.query.equal_range("method");
  for (auto it = methods.first; it != methods.second; ++it) asked.add_methods(it->second);
  if (asked.methods().empty()) {
    // What the page offers: promote and rollback move an alias; annotate.
    asked.add_methods("SetAlias");
    asked.add_methods("AnnotateVersion");
  }
  ASSIGN_OR_RETURN(const v1::WhoAmIResponse who, identity_for_caller_(request.caller(), asked));
  return ProtoToJson(who);
}

absl::StatusOr<std::string> ConsoleApi::History(
    CheckpointStore& store, const std::string& model,
    const std::multimap<std::string, std::string>& query) {
  RETURN_IF_ERROR(CheckQuery(query, {"alias", "since", "after", "limit"}));
  HistoryQuery history;
  history.model = model;
  history.alias = QueryValue(query, "alias");
  RETURN_IF_ERROR(ReadPage(query, history));
  ASSIGN_OR_RETURN(std::vector<v1::RegistryEvent> events, store.ListHistory(history));
  v1::ListHistoryResponse response;
  response.set_next_after_sequence(NextAfter(events, history.limit));
  for (v1::RegistryEvent& event : events) *response.add_events() = std::move(event);
  return ProtoToJson(response);
}

absl::StatusOr<std::string> ConsoleApi::Audit(
    CheckpointStore& store, const std::string& model,
    const std::multimap<std::string, std::string>& query) {
  RETURN_IF_ERROR(CheckQuery(query, {"since", "after", "limit"}));
  AuditQuery audit;
  audit.model = model;
  RETURN_IF_ERROR(ReadPage(query, audit));
  ASSIGN_OR_RETURN(std::vector<v1::AuditRecord> records, store.ListAudit(audit));
  v1::ListAuditResponse response;
  response.set_next_after_sequence(NextAfter(records, audit.limit));
  for (v1::AuditRecord& record : records) *response.add_records() = std::move(record);
  return ProtoToJson(response);
}

absl::StatusOr<nlohmann::json> ConsoleApi::JsonBody(const ApiRequest& request) {
  // Only a JSON body with the caller's token or certificate is a change: a browser cannot send a
  // JSON body or an Authorization header from another site without a CORS preflight, which the
  // console never grants (its CSRF defence; it keeps no cookies either). A browser presents its
  // client certificate by itself, like a cookie, so a change whose Origin names another site is
  // refused too, whatever its content type.
  if (!request.origin.empty() && request.origin != request.own_origin) {
    return absl::PermissionDeniedError(
        absl::StrCat("a change from a page of another site (Origin ", request.origin,
                     ") is refused; this console is ", request.own_origin));
  }
  if (!absl::StartsWith(request.content_type, "application/json")) {
    return absl::InvalidArgumentError(
        absl::StrCat("a change needs a JSON body (Content-Type: application/json), got '",
                     request.content_type, "'"));
  }
  if (request.bearer_token.empty() && request.certificate_names.empty()) {
    return absl::UnauthenticatedError(
        "a change needs the caller's bearer token (Authorization: Bearer ...) or client "
        "certificate");
  }
  nlohmann::json body = nlohmann::json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return absl::InvalidArgumentError("the body is not a JSON object");
  }
  return body;
}

absl::StatusOr<std::string> ConsoleApi::Change(CheckpointStore& store, const std::string& model,
                                               const std::string& action,
                                               const ApiRequest& request) {
  ASSIGN_OR_RETURN(const nlohmann::json body, JsonBody(request));
  const auto text = [&](const char* name) -> absl::StatusOr<std::string> {
    if (!body.contains(name)) return std::string();
    if (!body[name].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' must be a string"));
    }
    return body[name].get<std::string>();
  };
  ASSIGN_OR_RETURN(const std::string reason, text("reason"));
  ASSIGN_OR_RETURN(const std::string alias, text("alias"));
  if (alias.empty()) return absl::InvalidArgumentError("'alias' is required");
  if (action == "rollback") {
    ASSIGN_OR_RETURN(const AliasMove moved, Rollback(store, model, alias, reason));
    return nlohmann::json({{"model", model},
                           {"alias", alias},
                           {"from_version", moved.from_version},
                           {"to_version", moved.to_version},
                           {"reason", moved.reason}})
        .dump();
  }
  // promote: {"version": 7 or "7" or "latest", "alias", "require": ["val_acc>=0.9"], "verify"}
  std::string version_text;
  if (body.contains("version") && body["version"].is_number_integer()) {
    version_text = std::to_string(body["version"].get<int64_t>());
  } else {
    ASSIGN_OR_RETURN(version_text, text("version"));
  }
  if (version_text.empty()) return absl::InvalidArgumentError("'version' is required");
  ASSIGN_OR_RETURN(const v1::VersionRef ref,
                   ParseVersionRef(absl::StrCat(model, "@", version_text)));
  ASSIGN_OR_RETURN(const v1::Manifest manifest, store.GetManifest(ref));
  PromotionRules rules;
  if (body.contains("require")) {
    if (!body["require"].is_array()) {
      return absl::InvalidArgumentError("'require' must be a list of conditions");
    }
    for (const nlohmann::json& condition : body["require"]) {
      if (!condition.is_string()) {
        return absl::InvalidArgumentError("each of 'require' must be a string like val_acc>=0.9");
      }
      ASSIGN_OR_RETURN(*std::back_inserter(rules.requirements),
                       ParseMetricCondition(condition.get<std::string>()));
    }
  }
  if (body.contains("verify")) {
    if (!body["verify"].is_boolean())
      return absl::InvalidArgumentError("'verify' must be true or false");
    rules.require_verified = body["verify"].get<bool>();
  }
  ASSIGN_OR_RETURN(const PromotionResult promoted,
                   Promote(store, model, manifest.version(), alias, rules, reason));
  return nlohmann::json({{"model", model},
                         {"alias", alias},
                         {"version", manifest.version()},
                         {"previous_version", promoted.previous_version},
                         {"reason", promoted.reason}})
      .dump();
}

absl::StatusOr<std::string> ConsoleApi::Annotate(CheckpointStore& store, const v1::VersionRef& ref,
                                                 const ApiRequest& request) {
  ASSIGN_OR_RETURN(const nlohmann::json body, JsonBody(request));
  nlohmann::json fields = body;
  fields.erase("reason");
  v1::AnnotationChange change;
  RETURN_IF_ERROR(JsonToProto(fields.dump(), change));
  ASSIGN_OR_RETURN(const v1::Manifest manifest, store.GetManifest(ref));
  ChangeAttribution attribution;
  if (body.contains("reason") && body["reason"].is_string()) {
    attribution.reason = body["reason"].get<std::string>();
  }
  ASSIGN_OR_RETURN(
      const v1::VersionAnnotations annotations,
      store.AnnotateVersion(manifest.model(), manifest.version(), change, attribution));
  return ProtoToJson(annotations);
}

absl::StatusOr<std::string> ConsoleApi::Lineage(CheckpointStore& store, const v1::VersionRef& ref) {
  ASSIGN_OR_RETURN(const VersionLineage lineage, LineageOf(store, ref));
  const auto links = [](const std::vector<LineageLink>& from) {
    nlohmann::json out = nlohmann::json::array();
    for (const LineageLink& link : from) {
      out.push_back({{"version", link.version},
                     {"relation", link.relation},
                     {"run_id", link.run_id},
                     {"state", link.state}});
    }
    return out;
  };
  ASSIGN_OR_RETURN(const std::string own, ProtoToJson(lineage.lineage));
  const nlohmann::json body = {{"version", lineage.version},
                               {"lineage", nlohmann::json::parse(own)},
                               {"ancestors", links(lineage.ancestors)},
                               {"children", links(lineage.children)}};
  return body.dump();
}

absl::StatusOr<std::string> ConsoleApi::Diff(CheckpointStore& store, const std::string& model,
                                             const std::multimap<std::string, std::string>& query) {
  RETURN_IF_ERROR(CheckQuery(query, {"a", "b"}));
  const std::string a = QueryValue(query, "a"), b = QueryValue(query, "b");
  if (a.empty() || b.empty()) {
    return absl::InvalidArgumentError(
        "a diff needs both versions: ?a=REF&b=REF (a number or an alias each)");
  }
  ASSIGN_OR_RETURN(const v1::VersionRef ref_a, ParseVersionRef(absl::StrCat(model, "@", a)));
  ASSIGN_OR_RETURN(const v1::VersionRef ref_b, ParseVersionRef(absl::StrCat(model, "@", b)));
  ASSIGN_OR_RETURN(const VersionDiff diff, DiffVersions(store, ref_a, ref_b));
  nlohmann::json changed = nlohmann::json::array();
  for (const TensorChange& change : diff.changed) {
    nlohmann::json entry = {{"key", change.key},
                            {"shape_a", change.shape_a},
                            {"shape_b", change.shape_b},
                            {"dtype_a", change.dtype_a},
                            {"dtype_b", change.dtype_b}};
    if (change.max_abs_difference) entry["max_abs_difference"] = *change.max_abs_difference;
    changed.push_back(std::move(entry));
  }
  const nlohmann::json body = {{"a", diff.a},
                               {"b", diff.b},
                               {"added", diff.added},
                               {"removed", diff.removed},
                               {"changed", std::move(changed)},
                               {"unchanged", diff.unchanged}};
  return body.dump();
}

bool ConsoleApi::IsWatch(const ApiRequest& request) {
  return request.method == "GET" && request.path == "/api/v1/watch";
}

absl::StatusOr<ConsoleApi::OpenedWatch> ConsoleApi::OpenWatch(const ApiRequest& request) const {
  RETURN_IF_ERROR(CheckSameSite(request));
  RETURN_IF_ERROR(CheckQuery(request.query, {"model", "alias", "after"}, {"model", "alias"}));
  v1::WatchRequest watch_request;
  for (const auto& [name, value] : request.query) {
    if (name == "model") watch_request.add_models(value);
    if (name == "alias") watch_request.add_aliases(value);
  }
  ASSIGN_OR_RETURN(const int64_t after, QueryCount(request.query, "after", 0));
  if (request.query.count("after") > 0) {
    watch_request.set_resume_token(after);
    watch_request.set_resume(true);
  }
  OpenedWatch opened;
  // A slot first: each open watch holds a thread of the HTTP server until it ends.
  struct Slot {
    explicit Slot(std::shared_ptr<std::atomic<int>> counter) : open(std::move(counter)) {}
    ~Slot() { open->fetch_sub(1); }
    const std::shared_ptr<std::atomic<int>> open;
  };
  if (open_watches_->fetch_add(1) >= max_watches_) {
    open_watches_->fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("this console follows at most ", max_watches_,
                     " watches at once (--max_watches); try again later"));
  }
  opened.slot = std::make_shared<const Slot>(open_watches_);
  ASSIGN_OR_RETURN(const std::shared_ptr<CheckpointStore> store,
                   store_for_caller_(request.caller()));
  ASSIGN_OR_RETURN(opened.watch, store->Watch(watch_request));
  // A refusal (no token, a model out of scope) comes with the first update: wait briefly for it,
  // so that it is answered with its status rather than inside an event stream.
  ASSIGN_OR_RETURN(opened.first, opened.watch->Next(absl::Now() + absl::Seconds(2)));
  return opened;
}

void ConsoleApi::StreamWatch(OpenedWatch opened,
                             const std::function<bool(absl::string_view)>& write,
                             const std::function<bool()>& stopping) {
  const auto send = [&](const v1::WatchResponse& update) {
    absl::StatusOr<std::string> json = ProtoToJson(update);
    if (!json.ok()) return false;
    return write(absl::StrCat("id: ", update.resume_token(), "\ndata: ", *json, "\n\n"));
  };
  // A comment first, so the client sees the stream open at once.
  if (!write(": watching\n\n")) return;
  if (opened.first && !send(*opened.first)) return;
  absl::Time quiet_since = absl::Now();
  while (!stopping()) {
    absl::StatusOr<std::optional<v1::WatchResponse>> next =
        opened.watch->Next(absl::Now() + absl::Seconds(1));
    if (!next.ok()) {
      const nlohmann::json error = {{"error",
                                     {{"code", absl::StatusCodeToString(next.status().code())},
                                      {"message", std::string(next.status().message())}}}};
      write(absl::StrCat("event: error\ndata: ", error.dump(), "\n\n"));
      return;
    }
    if (next->has_value()) {
      if (!send(**next)) return;
      quiet_since = absl::Now();
    } else if (absl::Now() - quiet_since >= kWatchKeepAlive) {
      if (!write(": keep-alive\n\n")) return;
      quiet_since = absl::Now();
    }
  }
}

}  // namespace ckpt
