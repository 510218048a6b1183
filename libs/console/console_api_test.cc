#include "libs/console/console_api.h"

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "reader-token";

class ConsoleApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = std::string(std::getenv("TEST_TMPDIR")) + "/" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> opened,
                         RocksDbCheckpointStore::Open(options));
    store_ = std::move(opened);
    for (float fill : {1.0f, 2.0f}) {
      CheckpointContents contents;
      contents.model.InsertOrAssign("fc.weight", at::full({4, 3}, fill));
      contents.metadata.set_global_step(static_cast<int64_t>(fill) * 100);
      (*contents.metadata.mutable_metrics())["val_acc"] = 0.5 + fill / 10;
      ASSERT_OK(CommitCheckpoint(*store_, "resnet", contents).status());
    }
    ASSERT_OK(store_->SetAlias("resnet", "production", 1).status());
  }

  // The store acts for the holder of kToken; anyone else is refused as the store would.
  ApiResponse Get(const std::string& path, const std::string& token = kToken) const {
    ConsoleApi api([this](const CallerCredentials& caller)
                       -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
      if (caller.bearer_token != kToken)
        return absl::UnauthenticatedError("missing or unknown bearer token");
      return store_;
    });
    return api.Handle({"GET", path, {}, "", token});
  }

  std::shared_ptr<CheckpointStore> store_;
};

TEST_F(ConsoleApiTest, ListsModelsAndVersionsAsTheCliPrintsThem) {
  ApiResponse models = Get("/api/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.content_type, "application/json");
  const nlohmann::json listed = nlohmann::json::parse(models.body);
  ASSERT_EQ(listed["models"].size(), 1u);
  EXPECT_EQ(listed["models"][0]["name"], "resnet");

  ApiResponse versions = Get("/api/v1/models/resnet/versions");
  ASSERT_EQ(versions.status, 200) << versions.body;
  const nlohmann::json json = nlohmann::json::parse(versions.body);
  ASSERT_EQ(json["versions"].size(), 2u);
  EXPECT_EQ(json["versions"][0]["version"], "1");  // int64 is a string in protobuf's JSON.
  EXPECT_EQ(json["versions"][0]["aliases"][0], "production");
  // Metrics are float32 in the manifest.
  EXPECT_NEAR(json["versions"][1]["metadata"]["metrics"]["val_acc"].get<double>(), 0.7, 1e-6);
}

TEST_F(ConsoleApiTest, VersionsAreFilteredAsCkptLsFiltersThem) {
  ConsoleApi api(
      [this](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return store_;
      });
  const auto versions = [&](std::multimap<std::string, std::string> query) {
    return api.Handle({"GET", "/api/v1/models/resnet/versions", std::move(query), "", kToken});
  };
  ApiResponse good = versions({{"where", "val_acc>=0.65"}, {"since", "1h"}});
  ASSERT_EQ(good.status, 200) << good.body;
  const nlohmann::json json = nlohmann::json::parse(good.body);
  ASSERT_EQ(json["versions"].size(), 1u) << good.body;
  EXPECT_EQ(json["versions"][0]["version"], "2");
  ApiResponse none = versions({{"where", "val_acc>=0.65"}, {"where", "val_acc<=0.65"}});
  ASSERT_EQ(none.status, 200) << none.body;
  // An empty list is there, empty (a page need not know proto3 leaves defaults out).
  EXPECT_EQ(nlohmann::json::parse(none.body)["versions"], nlohmann::json::array());

  ApiResponse bad_time = versions({{"since", "last week"}});
  EXPECT_EQ(bad_time.status, 400);
  EXPECT_THAT(bad_time.body, HasSubstr("--since 'last week'"));
  EXPECT_EQ(versions({{"where", "val_acc>0.5"}}).status, 400);
  ApiResponse unknown = versions({{"sort", "desc"}});
  EXPECT_EQ(unknown.status, 400);
  EXPECT_THAT(unknown.body, HasSubstr("unknown query parameter 'sort'"));
  EXPECT_EQ(versions({{"since", "1h"}, {"since", "2h"}}).status, 400);
}

// Each open watch holds a thread of the HTTP server: beyond max_watches one is 429, and a slot
// is given back when its watch ends.
TEST_F(ConsoleApiTest, AtMostMaxWatchesAreOpenAtOnce) {
  ConsoleApi api(
      [this](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return store_;
      },
      "", nullptr, /*max_watches=*/1);
  const ApiRequest watch{"GET", "/api/v1/watch", {{"model", "resnet"}}, "", kToken};
  ASSERT_TRUE(ConsoleApi::IsWatch(watch));
  absl::StatusOr<ConsoleApi::OpenedWatch> first = api.OpenWatch(watch);
  ASSERT_OK(first.status());
  ASSERT_TRUE(first->first.has_value());
  EXPECT_TRUE(first->first->has_state());
  const absl::StatusOr<ConsoleApi::OpenedWatch> second = api.OpenWatch(watch);
  EXPECT_THAT(second.status(), StatusIs(absl::StatusCode::kResourceExhausted, "at most 1"));
  EXPECT_EQ(ErrorResponse(second.status()).status, 429);
  // A refused request (an unknown parameter) takes no slot for long either.
  EXPECT_THAT(api.OpenWatch({"GET", "/api/v1/watch", {{"modle", "resnet"}}, "", kToken}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  first = absl::CancelledError("closed");  // the first watch ends
  EXPECT_OK(api.OpenWatch(watch).status());
}

TEST_F(ConsoleApiTest, HistoryAuditAndDiff) {
  ApiResponse history = Get("/api/v1/models/resnet/history");
  ASSERT_EQ(history.status, 200) << history.body;
  const nlohmann::json events = nlohmann::json::parse(history.body)["events"];
  ASSERT_GE(events.size(), 4u) << history.body;  // created, two commits, the alias set.
  EXPECT_EQ(events.back()["kind"], "ALIAS_SET");
  EXPECT_EQ(events.back()["alias"], "production");
  EXPECT_EQ(events.back()["version"], "1");

  ConsoleApi api(
      [this](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return store_;
      });
  const auto call = [&](const std::string& path, std::multimap<std::string, std::string> query) {
    return api.Handle({"GET", path, std::move(query), "", kToken});
  };
  ApiResponse page = call("/api/v1/models/resnet/history", {{"limit", "1"}});
  ASSERT_EQ(page.status, 200) << page.body;
  const nlohmann::json first = nlohmann::json::parse(page.body);
  ASSERT_EQ(first["events"].size(), 1u);
  ApiResponse next = call("/api/v1/models/resnet/history",
                          {{"after", first["next_after_sequence"].get<std::string>()}});
  EXPECT_EQ(nlohmann::json::parse(next.body)["events"].size(), events.size() - 1);
  ApiResponse moves = call("/api/v1/models/resnet/history", {{"alias", "production"}});
  EXPECT_EQ(nlohmann::json::parse(moves.body)["events"].size(), 1u) << moves.body;
  EXPECT_EQ(call("/api/v1/models/resnet/history", {{"limit", "-1"}}).status, 400);
  EXPECT_EQ(call("/api/v1/models/resnet/audit", {}).status, 200);

  ApiResponse diff = call("/api/v1/models/resnet/diff", {{"a", "1"}, {"b", "latest"}});
  ASSERT_EQ(diff.status, 200) << diff.body;
  const nlohmann::json json = nlohmann::json::parse(diff.body);
  EXPECT_EQ(json["a"], "resnet@1");
  ASSERT_EQ(json["changed"].size(), 1u) << diff.body;
  EXPECT_EQ(json["changed"][0]["key"], "fc.weight");
  EXPECT_DOUBLE_EQ(json["changed"][0]["max_abs_difference"].get<double>(), 1.0);
  EXPECT_EQ(call("/api/v1/models/resnet/diff", {{"a", "1"}}).status, 400);
  EXPECT_EQ(call("/api/v1/models/resnet/diff", {{"a", "1"}, {"b", "9"}}).status, 404);
  EXPECT_EQ(call("/api/v1/models", {{"page", "2"}}).status, 400);
}

TEST_F(ConsoleApiTest, PromoteRollbackAndAnnotateAsTheCaller) {
  ConsoleApi api(
      [this](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return store_;
      });
  const auto post = [&](const std::string& path, const std::string& body,
                        const std::string& type = "application/json") {
    return api.Handle({"POST", path, {}, body, kToken, type});
  };
  // The rule holds for version 2 (val_acc 0.7), so production moves 1 -> 2.
  ApiResponse promoted = post("/api/v1/models/resnet/promote",
                              R"({"version": 2, "alias": "production", "require": ["val_acc>=0.65"],
                                  "reason": "weekly release"})");
  ASSERT_EQ(promoted.status, 200) << promoted.body;
  const nlohmann::json moved = nlohmann::json::parse(promoted.body);
  EXPECT_EQ(moved["previous_version"], 1);
  EXPECT_THAT(moved["reason"].get<std::string>(), HasSubstr("weekly release"));
  // A rule that fails is 409 with the store's words, and nothing moves.
  ApiResponse refused =
      post("/api/v1/models/resnet/promote",
           R"({"version": "1", "alias": "production", "require": ["val_acc>=0.65"]})");
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_THAT(refused.body, HasSubstr("val_acc"));
  ApiResponse back = post("/api/v1/models/resnet/rollback", R"({"alias": "production"})");
  ASSERT_EQ(back.status, 200) << back.body;
  EXPECT_EQ(nlohmann::json::parse(back.body)["to_version"], 1);

  ApiResponse annotated = post("/api/v1/models/resnet/versions/1/annotations",
                               R"({"set_tags": {"dataset": "imagenet"}, "set_metrics": {"f1": 0.8},
                                   "reason": "offline eval"})");
  ASSERT_EQ(annotated.status, 200) << annotated.body;
  EXPECT_EQ(nlohmann::json::parse(annotated.body)["tags"]["dataset"], "imagenet");
  ApiResponse filtered = Get("/api/v1/models/resnet/versions");
  EXPECT_THAT(filtered.body, HasSubstr("imagenet"));

  // A page of another site (its Origin) changes nothing, even with the caller's credentials (a
  // browser sends a client certificate by itself); the console's own page does.
  ApiRequest cross{"POST",
                   "/api/v1/models/resnet/versions/1/annotations",
                   {},
                   R"({"set_tags": {"checked": "yes"}})",
                   "",
                   "application/json",
                   {"alice.example"},
                   "https://evil.example",
                   "https://console.example:8443"};
  ApiResponse cross_site = api.Handle(cross);
  EXPECT_EQ(cross_site.status, 403) << cross_site.body;
  EXPECT_THAT(cross_site.body, HasSubstr("another site"));
  cross.origin = cross.own_origin;
  ApiResponse same_site = api.Handle(cross);
  EXPECT_EQ(same_site.status, 200) << same_site.body;
  // A browser says when another site's page made the request: refused, reads too.
  ApiRequest cross_read{"GET", "/api/v1/models", {}, "", kToken};
  cross_read.fetch_site = "cross-site";
  EXPECT_EQ(api.Handle(cross_read).status, 403);
  cross_read.fetch_site = "same-origin";
  EXPECT_EQ(api.Handle(cross_read).status, 200);
  // Neither a token nor a certificate: nothing to act as.
  cross.certificate_names.clear();
  EXPECT_EQ(api.Handle(cross).status, 401);

  // What is not a change as the API takes one.
  EXPECT_EQ(
      post("/api/v1/models/resnet/rollback", R"({"alias": "production"})", "text/plain").status,
      400);
  EXPECT_EQ(api.Handle({"POST",
                        "/api/v1/models/resnet/rollback",
                        {},
                        R"({"alias": "x"})",
                        "",
                        "application/json"})
                .status,
            401);
  EXPECT_EQ(post("/api/v1/models/resnet/promote", "[1]").status, 400);
  EXPECT_EQ(post("/api/v1/models/resnet/promote", R"({"version": 2})").status, 400);
  EXPECT_EQ(post("/api/v1/models/resnet/versions/1/annotations", R"({"set_color": "red"})").status,
            400);
  EXPECT_EQ(Get("/api/v1/models/resnet/promote").status, 405);
  EXPECT_EQ(post("/api/v1/models", "{}").status, 405);
}

TEST_F(ConsoleApiTest, LineageNamesParentsAndChildren) {
  CheckpointContents tuned;
  tuned.model.InsertOrAssign("fc.weight", at::zeros({4, 3}));
  tuned.metadata.mutable_lineage()->set_parent("resnet@1");
  tuned.metadata.mutable_lineage()->set_parent_relation("fine_tuned_from");
  ASSERT_OK(CommitCheckpoint(*store_, "resnet-ft", tuned).status());
  ApiResponse up = Get("/api/v1/models/resnet-ft/versions/latest/lineage");
  ASSERT_EQ(up.status, 200) << up.body;
  const nlohmann::json child = nlohmann::json::parse(up.body);
  EXPECT_EQ(child["version"], "resnet-ft@1");
  EXPECT_EQ(child["lineage"]["parent"], "resnet@1");
  ASSERT_EQ(child["ancestors"].size(), 1u);
  EXPECT_EQ(child["ancestors"][0]["version"], "resnet@1");
  EXPECT_EQ(child["ancestors"][0]["relation"], "fine_tuned_from");
  ApiResponse down = Get("/api/v1/models/resnet/versions/production/lineage");
  ASSERT_EQ(down.status, 200) << down.body;
  const nlohmann::json parent = nlohmann::json::parse(down.body);
  ASSERT_EQ(parent["children"].size(), 1u) << down.body;
  EXPECT_EQ(parent["children"][0]["version"], "resnet-ft@1");
  EXPECT_EQ(Get("/api/v1/models/resnet/versions/7/lineage").status, 404);
}

TEST_F(ConsoleApiTest, AVersionByNumberOrAliasWithoutItsChunkLists) {
  for (const char* ref : {"1", "production"}) {
    SCOPED_TRACE(ref);
    ApiResponse version = Get(std::string("/api/v1/models/resnet/versions/") + ref);
    ASSERT_EQ(version.status, 200) << version.body;
    const nlohmann::json json = nlohmann::json::parse(version.body);
    EXPECT_EQ(json["version"], "1");
    EXPECT_EQ(json["tensors"][0]["key"], "fc.weight");
    EXPECT_EQ(json["tensors"][0]["shape"], nlohmann::json::array({"4", "3"}));
    EXPECT_EQ(json["tensors"][0]["chunks"], nlohmann::json::array());  // left out: none sent
    EXPECT_THAT(version.body, Not(HasSubstr("sha256")));
    // Zero values are printed: a page reads every field without knowing the defaults.
    EXPECT_EQ(json["metadata"]["epoch"], "0");
    EXPECT_EQ(json["tensors"][0]["requires_grad"], false);
  }
}

TEST_F(ConsoleApiTest, ErrorsAreJsonWithTheStatusOfTheirCode) {
  const auto expect_error = [&](const ApiResponse& response, int status, const std::string& code,
                                const std::string& says) {
    EXPECT_EQ(response.status, status) << response.body;
    const nlohmann::json json = nlohmann::json::parse(response.body);
    EXPECT_EQ(json["error"]["code"], code) << response.body;
    EXPECT_THAT(json["error"]["message"].get<std::string>(), HasSubstr(says));
  };
  expect_error(Get("/api/v1/models/nosuch/versions"), 404, "NOT_FOUND", "nosuch");
  expect_error(Get("/api/v1/models/resnet/versions/9"), 404, "NOT_FOUND", "9");
  expect_error(Get("/api/v1/models/resnet/versions/0"), 400, "INVALID_ARGUMENT", "0");
  expect_error(Get("/api/v1/nothing"), 404, "NOT_FOUND", "/api/v1/nothing");
  expect_error(Get("/api/v1/models", ""), 401, "UNAUTHENTICATED", "token");
  ConsoleApi api(
      [this](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return store_;
      });
  expect_error(api.Handle({"DELETE", "/api/v1/models", {}, "", kToken}), 405, "METHOD_NOT_ALLOWED",
               "GET");
}

TEST(ConsoleInfoTest, SaysWhereTheStoreIsWithoutCallingIt) {
  ConsoleApi api(
      [](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return absl::InternalError("no store call expected");
      },
      "store.example:7070");
  const ApiResponse info = api.Handle({"GET", "/api/v1/console", {}, "", ""});
  ASSERT_EQ(info.status, 200) << info.body;
  EXPECT_EQ(nlohmann::json::parse(info.body)["store"], "store.example:7070");
  EXPECT_EQ(nlohmann::json::parse(info.body)["store_open"], false);  // no Identity to ask
}

// A store without identities takes a call with no credentials as "anonymous": the page then
// asks for no token. One with identities refuses it (UNAUTHENTICATED): not open.
TEST(ConsoleInfoTest, SaysWhetherTheStoreTakesCallsWithoutCredentials) {
  const auto no_store = [](const CallerCredentials&)
      -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
    return absl::InternalError("no store call expected");
  };
  for (const bool open : {true, false}) {
    ConsoleApi api(no_store, "store.example:7070",
                   [open](const CallerCredentials& caller,
                          const v1::WhoAmIRequest&) -> absl::StatusOr<v1::WhoAmIResponse> {
                     EXPECT_TRUE(caller.bearer_token.empty());
                     if (!open) return absl::UnauthenticatedError("no credentials");
                     v1::WhoAmIResponse who;
                     who.set_identity("anonymous");
                     who.set_role("admin");
                     return who;
                   });
    const ApiResponse info = api.Handle({"GET", "/api/v1/console", {}, "", "some-token"});
    ASSERT_EQ(info.status, 200) << info.body;
    EXPECT_EQ(nlohmann::json::parse(info.body)["store_open"], open);
  }
}

// /api/v1/me passes the caller's credentials and the methods asked about to the store's
// ckpt.v1.Identity (here a stand-in that answers as a scoped writer would be answered).
TEST(ConsoleMeTest, AsksTheStoreWhoTheCallerIsAndWhatItMayDo) {
  v1::WhoAmIRequest seen_request;
  CallerCredentials seen_caller;
  ConsoleApi api(
      [](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return absl::InternalError("no store call expected");
      },
      "",
      [&](const CallerCredentials& caller,
          const v1::WhoAmIRequest& request) -> absl::StatusOr<v1::WhoAmIResponse> {
        seen_caller = caller;
        seen_request = request;
        v1::WhoAmIResponse who;
        who.set_identity("team-a");
        who.set_role("writer");
        who.add_allowed_methods("SetAlias");
        return who;
      });
  ApiRequest request{"GET", "/api/v1/me", {{"model", "team-a-resnet"}}, "", "tok"};
  request.certificate_names = {"alice.example"};
  const ApiResponse me = api.Handle(request);
  ASSERT_EQ(me.status, 200) << me.body;
  const nlohmann::json json = nlohmann::json::parse(me.body);
  EXPECT_EQ(json["identity"], "team-a");
  EXPECT_EQ(json["allowed_methods"][0], "SetAlias");
  EXPECT_EQ(seen_caller.bearer_token, "tok");
  EXPECT_EQ(seen_caller.certificate_names, std::vector<std::string>{"alice.example"});
  EXPECT_EQ(seen_request.model(), "team-a-resnet");
  // By default it asks about what the page offers.
  ASSERT_EQ(seen_request.methods_size(), 2);
  EXPECT_EQ(seen_request.methods(0), "SetAlias");
  EXPECT_EQ(seen_request.methods(1), "AnnotateVersion");
  const ApiResponse listed = api.Handle(
      {"GET", "/api/v1/me", {{"method", "DeleteVersion"}, {"method", "Upload"}}, "", "tok"});
  ASSERT_EQ(listed.status, 200) << listed.body;
  EXPECT_EQ(seen_request.methods_size(), 2);
  EXPECT_EQ(seen_request.methods(0), "DeleteVersion");
  EXPECT_EQ(api.Handle({"GET", "/api/v1/me", {{"model", "<b>"}}, "", "tok"}).status, 400);
  EXPECT_EQ(api.Handle({"GET", "/api/v1/me", {{"who", "x"}}, "", "tok"}).status, 400);
  // A console that cannot ask says so.
  ConsoleApi without(
      [](const CallerCredentials&) -> absl::StatusOr<std::shared_ptr<CheckpointStore>> {
        return absl::InternalError("no store call expected");
      });
  EXPECT_EQ(without.Handle({"GET", "/api/v1/me", {}, "", "tok"}).status, 501);
}

TEST(HttpStatusTest, EachCodeHasItsStatus) {
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInternal), 500);
  // A store's own UNIMPLEMENTED is a missing feature (501), not a wrong method.
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnimplemented), 501);
  // A message with quotes and markup stays inside its JSON string.
  const ApiResponse response =
      ErrorResponse(absl::NotFoundError("model \"<img src=x onerror=alert(1)>\""));
  EXPECT_EQ(nlohmann::json::parse(response.body)["error"]["message"],
            "model \"<img src=x onerror=alert(1)>\"");
}

}  // namespace
}  // namespace ckpt
