#ifndef CKPT_LIBS_CONSOLE_CONSOLE_API_H_
#define CKPT_LIBS_CONSOLE_CONSOLE_API_H_

// ConsoleApi: the console's HTTP/JSON API (/api/v1/...) as a function from a parsed request to a
// response, with no HTTP library in it: services/console parses the wire and writes the answer,
// tests call Handle directly.
//
// The console holds no rights of its own. Every request is answered with the store client that
// `StoreForCaller` gives for the caller's credentials (one that sends the caller's bearer token
// to the store, or under mutual TLS forwards the caller's verified certificate), so the store's
// one access policy decides what the caller may see, exactly as over gRPC: missing or wrong
// credentials are the store's UNAUTHENTICATED (401), a scope or role it lacks the store's
// NOT_FOUND or PERMISSION_DENIED (404, 403).
//
// Read endpoints (GET), JSON in protobuf's mapping with the .proto field names
// (libs/io/proto_json.h, as `ckpt ... --json` prints):
//   /api/v1/console                          {"store": the store's address,
//                                            "client_certificate": [names of the certificate
//                                            this browser presented, if any], "store_open":
//                                            whether the store takes a call with no
//                                            credentials (no identities: "anonymous")}
//   /api/v1/me                               WhoAmIResponse (proto/ckpt/v1/identity.proto): who
//                                            the store takes the caller to be, and which of
//                                            ?method= (repeatable; default SetAlias,
//                                            AnnotateVersion) it may call on ?model= -- the page
//                                            shows promote and rollback only to those who may
//   /api/v1/models                           ListModelsResponse
//   /api/v1/models/MODEL/versions            ListVersionsResponse, oldest first; filtered as
//                                            `ckpt ls` is by ?tag= &label= &where= &since= &until=
//                                            (libs/store/version_filter_text.h; each may repeat
//                                            but since and until)
//   /api/v1/models/MODEL/versions/REF        the version's manifest without its chunk lists
//                                            (REF: a number or an alias, e.g. "production")
//   /api/v1/models/MODEL/versions/REF/lineage  {version, lineage, ancestors: [{version, relation,
//                                            run_id, state}] nearest first, children: [...]}
//                                            (libs/store/version_lineage.h)
//   /api/v1/models/MODEL/history             ListHistoryResponse: commits, alias moves (who,
//                                            when, from -> to, why), annotations; ?alias= &since=
//                                            &after= &limit= (pages of at most 1000; a full page
//                                            names next_after_sequence)
//   /api/v1/models/MODEL/audit               ListAuditResponse, paged the same way (?since=
//                                            &after= &limit=)
//   /api/v1/models/MODEL/diff?a=REF&b=REF    {a, b, added, removed, changed: [{key, shape_a,
//                                            shape_b, dtype_a, dtype_b, max_abs_difference}],
//                                            unchanged} (libs/store/version_diff.h)
// A query parameter a request does not take is 400.
//
// Live updates: GET /api/v1/watch?model=M (repeatable; none: every model in scope) &alias=A
// (repeatable) &after=TOKEN, as Server-Sent Events (OpenWatch, then StreamWatch): the state first
// unless resuming, then every registry event, each "id: RESUME_TOKEN\ndata: WatchResponse JSON";
// a ": keep-alive" comment when nothing happened for 5 s (so a page that went away is noticed
// within that, and its watch slot given back). A browser's EventSource resumes by
// itself with Last-Event-ID, which counts as ?after=.
//
// Changes (POST with a JSON body, Content-Type: application/json, and the caller's token or client
// certificate: a browser cannot send a JSON body or an Authorization header from another site
// without a CORS preflight, which the console never grants, and a change whose Origin header
// names another site is refused besides, so no page elsewhere can make a signed-in user's browser
// change anything, even one that presents its certificate by itself; the console keeps no
// cookies), recorded in the store's history and audit log as the caller's:
//   /api/v1/models/MODEL/promote             {"version": 7 | "REF", "alias": "production",
//                                            "require": ["val_acc>=0.9"], "verify": true,
//                                            "reason": "..."} -> {model, alias, version,
//                                            previous_version, reason} (libs/registry/promotion.h)
//   /api/v1/models/MODEL/rollback            {"alias": "production", "reason": "..."} ->
//                                            {model, alias, from_version, to_version, reason}
//   /api/v1/models/MODEL/versions/REF/annotations  an AnnotationChange in JSON (set_metrics,
//                                            set_tags, remove_metrics, remove_tags, description)
//                                            and "reason" -> the version's annotations
// Errors: {"error": {"code": "NOT_FOUND", "message": "..."}} with the HTTP status of the code
// (400 INVALID_ARGUMENT, 401, 403, 404, 409 FAILED_PRECONDITION and ALREADY_EXISTS, 501
// UNIMPLEMENTED, 503 UNAVAILABLE, 500 otherwise); a method the path does not have is 405 with code
// "METHOD_NOT_ALLOWED" (MethodNotAllowed).
//
// Thread-safe: Handle may run on any number of threads at once.
//
// Example:
//   ConsoleApi api([&](const std::string& token) { return stores.For(token); });
//   ApiResponse response = api.Handle({"GET", "/api/v1/models", {}, "", token});

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_store.h"
#include "nlohmann/json.hpp"
#include "proto/ckpt/v1/identity.pb.h"

namespace ckpt {

// Who a request comes from, as the HTTP layer verified it.
struct CallerCredentials {
  std::string bearer_token;  // from "Authorization: Bearer ..."; empty: none sent.
  // The names of the client certificate the connection presented and TLS verified
  // (PeerCertificateNames, libs/console/https_tls.h); empty without mutual TLS.
  std::vector<std::string> certificate_names;
};

struct ApiRequest {
  std::string method;  // "GET", ...
  std::string path;    // without the query, percent-decoded segments are the caller's job
  std::multimap<std::string, std::string> query;  // a parameter may repeat (?tag=a&tag=b)
  std::string body;
  std::string bearer_token;  // from "Authorization: Bearer ..."; empty: none sent.
  std::string content_type;  // the Content-Type header
  std::vector<std::string> certificate_names;  // see CallerCredentials
  // The Origin header (empty: none sent) and the console's own origin as the request reached it
  // ("https://HOST:PORT", from the scheme and the Host header): a change from a page whose
  // origin is another is refused.
  std::string origin;
  std::string own_origin;
  // The Sec-Fetch-Site header a browser sends ("same-origin", "cross-site", ...; empty: none, as
  // from curl): a request another site's page made is refused, read or change, so that a
  // browser's client certificate (sent by itself) cannot be spent by other sites, not even on
  // holding watches open.
  std::string fetch_site;

  CallerCredentials caller() const { return {bearer_token, certificate_names}; }
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// The store client that acts for the caller with `credentials` (none: a caller who sent none).
using StoreForCaller = std::function<absl::StatusOr<std::shared_ptr<CheckpointStore>>(
    const CallerCredentials& credentials)>;
// The store's answer to ckpt.v1.Identity/WhoAmI for that caller.
using IdentityForCaller = std::function<absl::StatusOr<v1::WhoAmIResponse>(
    const CallerCredentials& credentials, const v1::WhoAmIRequest& request)>;

// The HTTP status for `code` (see the file comment).
int HttpStatusOf(absl::StatusCode code);
// The error for `method` on `path`, which takes only `allowed`: ErrorResponse makes it a 405.
absl::Status MethodNotAllowed(absl::string_view method, absl::string_view path,
                              absl::string_view allowed);
// {"error": {"code": ..., "message": ...}} for `status` (not OK).
ApiResponse ErrorResponse(const absl::Status& status);

class ConsoleApi {
 public:
  static constexpr int kDefaultMaxWatches = 64;

  // `store_address`: where callers reach the store themselves (for the page's "load it" lines).
  // Without `identity_for_caller`, /api/v1/me is 501. `max_watches`: watches open at once at
  // most (each page following a model holds one, and the HTTP server a thread for it); one more
  // is 429 RESOURCE_EXHAUSTED.
  explicit ConsoleApi(StoreForCaller store_for_caller, std::string store_address = "",
                      IdentityForCaller identity_for_caller = nullptr,
                      int max_watches = kDefaultMaxWatches)
      : store_for_caller_(std::move(store_for_caller)),
        store_address_(std::move(store_address)),
        identity_for_caller_(std::move(identity_for_caller)),
        max_watches_(max_watches) {}

  // Answers one request under /api/v1/ (404 for any other path), except a watch.
  ApiResponse Handle(const ApiRequest& request) const;

  // A watch request (GET /api/v1/watch): opened here so that its errors are answered as any
  // request's (401, 403, 400), then streamed by StreamWatch.
  static bool IsWatch(const ApiRequest& request);
  struct OpenedWatch {
    std::unique_ptr<RegistryWatch> watch;
    std::optional<v1::WatchResponse> first;  // the first update, read while opening.
    std::shared_ptr<const void> slot;        // one of max_watches, given back when destroyed.
  };
  absl::StatusOr<OpenedWatch> OpenWatch(const ApiRequest& request) const;
  // Writes `opened`'s updates as Server-Sent Events through `write` until `write` returns false
  // (the client went away), `stopping()` turns true (checked every second), or the watch fails.
  static void StreamWatch(OpenedWatch opened, const std::function<bool(absl::string_view)>& write,
                          const std::function<bool()>& stopping);

 private:
  absl::StatusOr<std::string> Route(const ApiRequest& request) const;
  static absl::StatusOr<std::string> History(CheckpointStore& store, const std::string& model,
                                             const std::multimap<std::string, std::string>& query);
  static absl::StatusOr<std::string> Audit(CheckpointStore& store, const std::string& model,
                                           const std::multimap<std::string, std::string>& query);
  // The body of a change, refused unless it is a JSON object sent as JSON with a token.
  static absl::StatusOr<nlohmann::json> JsonBody(const ApiRequest& request);
  static absl::StatusOr<std::string> Change(CheckpointStore& store, const std::string& model,
                                            const std::string& action, const ApiRequest& request);
  static absl::StatusOr<std::string> Annotate(CheckpointStore& store, const v1::VersionRef& ref,
                                              const ApiRequest& request);
  static absl::StatusOr<std::string> Lineage(CheckpointStore& store, const v1::VersionRef& ref);
  static absl::StatusOr<std::string> Diff(CheckpointStore& store, const std::string& model,
                                          const std::multimap<std::string, std::string>& query);

  absl::StatusOr<std::string> Me(const ApiRequest& request) const;

  const StoreForCaller store_for_caller_;
  const std::string store_address_;
  const IdentityForCaller identity_for_caller_;
  const int max_watches_;
  // Watches open now (shared with their slots, which may outlive nothing but are counted down by
  // whoever destroys the last OpenedWatch).
  const std::shared_ptr<std::atomic<int>> open_watches_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace ckpt

#endif  // CKPT_LIBS_CONSOLE_CONSOLE_API_H_
