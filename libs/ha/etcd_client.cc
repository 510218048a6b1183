#include "libs/ha/etcd_client.h"

#include <unistd.h>

#include <curl/curl.h>

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace ckpt::ha {

namespace {

using Json = nlohmann::json;

size_t AppendToString(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// The gateway writes int64s as strings.
int64_t JsonInt(const Json& json, const char* name) {
  if (!json.contains(name)) return 0;
  const Json& value = json[name];
  if (value.is_number_integer()) return value.get<int64_t>();
  int64_t parsed = 0;
  if (value.is_string() && absl::SimpleAtoi(value.get<std::string>(), &parsed)) return parsed;
  return 0;
}

absl::StatusOr<Json> ParseAnswer(const std::string& body, absl::string_view what) {
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InternalError(absl::StrCat("etcd answered ", what, " with ", body));
  }
  if (json.contains("error") || json.contains("code")) {
    const std::string message = json.value("message", json.value("error", body));
    // gRPC codes, as the gateway passes them on.
    const int code = json.value("code", 2);
    if (code == 5) return absl::NotFoundError(absl::StrCat(what, ": ", message));
    if (code == 14 || code == 4) return absl::UnavailableError(absl::StrCat(what, ": ", message));
    return absl::FailedPreconditionError(absl::StrCat(what, ": etcd says ", message));
  }
  return json;
}

std::string Base64(absl::string_view bytes) { return absl::Base64Escape(bytes); }

absl::StatusOr<EtcdValue> DecodeKeyValue(const Json& kv) {
  EtcdValue value;
  std::string decoded;
  if (!absl::Base64Unescape(kv.value("value", ""), &decoded)) {
    return absl::InternalError("etcd sent a value that is not base64");
  }
  value.value = std::move(decoded);
  value.lease = JsonInt(kv, "lease");
  value.create_revision = JsonInt(kv, "create_revision");
  return value;
}

}  // namespace

absl::StatusOr<EtcdClient> EtcdClient::Create(EtcdClientOptions options) {
  std::vector<std::string> endpoints;
  for (absl::string_view endpoint : absl::StrSplit(options.endpoints, ',', absl::SkipEmpty())) {
    endpoint = absl::StripAsciiWhitespace(endpoint);
    if (!absl::StartsWith(endpoint, "http://") && !absl::StartsWith(endpoint, "https://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", endpoint, "' is not an http:// or https:// URL"));
    }
    endpoints.emplace_back(absl::StripSuffix(endpoint, "/"));
  }
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoint given");
  const bool tls_files =
      !options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty();
  if (tls_files) {
    for (const std::string& endpoint : endpoints) {
      if (!absl::StartsWith(endpoint, "https://")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "etcd TLS files are given but endpoint '", endpoint,
            "' is plain http://: use https:// for every member"));
      }
    }
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "an etcd client certificate needs both its cert_file and its key_file");
  }
  for (const std::string* file : {&options.ca_file, &options.cert_file, &options.key_file}) {
    if (!file->empty() && ::access(file->c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot read the etcd TLS file ", *file));
    }
  }
  static const CURLcode initialized = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)initialized;
  return EtcdClient(std::move(endpoints), std::move(options));
}

absl::StatusOr<std::string> EtcdClient::Post(absl::string_view path, const std::string& body) {
  std::vector<std::string> failures;
  for (const std::string& endpoint : endpoints_) {
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
    const std::string url = absl::StrCat(endpoint, path);
    std::string answer;
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &AppendToString);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (!options_.cert_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, options_.cert_file.c_str());
      curl_easy_setopt(curl, CURLOPT_SSLKEY, options_.key_file.c_str());
    }
    const CURLcode result = curl_easy_perform(curl);
    long http_status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http_status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (result != CURLE_OK) {
      failures.push_back(absl::StrCat(endpoint, ": ", curl_easy_strerror(result)));
      continue;
    }
    if (http_status >= 500 && http_status != 503) {
      // 503 carries etcd's own error (no leader, lease not found ...) as JSON: pass it on.
      failures.push_back(absl::StrCat(endpoint, ": HTTP ", http_status, " ", answer));
      continue;
    }
    return answer;
  }
  return absl::UnavailableError(
      absl::StrCat("no etcd endpoint answered ", path, " (", absl::StrJoin(failures, "; "), ")"));
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(ttl));
  ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/grant", Json{{"TTL", seconds}}.dump()));
  ASSIGN_OR_RETURN(Json json, ParseAnswer(body, "granting a lease"));
  const int64_t id = JsonInt(json, "ID");
  if (id == 0) return absl::InternalError(absl::StrCat("etcd granted no lease: ", body));
  return id;
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) {
  ASSIGN_OR_RETURN(std::string body,
                   Post("/v3/lease/keepalive", Json{{"ID", absl::StrCat(lease)}}.dump()));
  ASSIGN_OR_RETURN(Json json, ParseAnswer(body, "renewing the writer's lease"));
  const Json result = json.contains("result") ? json["result"] : json;
  const int64_t ttl = JsonInt(result, "TTL");
  if (ttl <= 0) return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  return absl::Seconds(ttl);
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  ASSIGN_OR_RETURN(std::string body,
                   Post("/v3/lease/revoke", Json{{"ID", absl::StrCat(lease)}}.dump()));
  absl::StatusOr<Json> json = ParseAnswer(body, "revoking a lease");
  if (absl::IsNotFound(json.status())) return absl::OkStatus();
  return json.status();
}

absl::StatusOr<bool> EtcdClient::CreateIfAbsent(absl::string_view key, absl::string_view value,
                                                int64_t lease, EtcdValue* holder) {
  const std::string encoded_key = Base64(key);
  Json txn = {
      {"compare", Json::array({{{"target", "CREATE"}, {"key", encoded_key}, {"createRevision", "0"}}})},
      {"success", Json::array({{{"requestPut",
                                 {{"key", encoded_key},
                                  {"value", Base64(value)},
                                  {"lease", absl::StrCat(lease)}}}}})},
      {"failure", Json::array({{{"requestRange", {{"key", encoded_key}}}}})},
  };
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/txn", txn.dump()));
  ASSIGN_OR_RETURN(Json json, ParseAnswer(body, absl::StrCat("creating ", key)));
  if (json.value("succeeded", false)) return true;
  if (holder != nullptr) {
    *holder = EtcdValue();
    for (const Json& response : json.value("responses", Json::array())) {
      const Json range = response.value("response_range", Json::object());
      for (const Json& kv : range.value("kvs", Json::array())) {
        ASSIGN_OR_RETURN(*holder, DecodeKeyValue(kv));
      }
    }
  }
  return false;
}

absl::StatusOr<std::optional<EtcdValue>> EtcdClient::Get(absl::string_view key) {
  ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", Json{{"key", Base64(key)}}.dump()));
  ASSIGN_OR_RETURN(Json json, ParseAnswer(body, absl::StrCat("reading ", key)));
  for (const Json& kv : json.value("kvs", Json::array())) {
    ASSIGN_OR_RETURN(EtcdValue value, DecodeKeyValue(kv));
    return std::optional<EtcdValue>(std::move(value));
  }
  return std::optional<EtcdValue>();
}

}  // namespace ckpt::ha
