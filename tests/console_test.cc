// The console binary over the real store service, exercised with curl as a user without a client
// would: every API endpoint, and each error as JSON with its HTTP status (no token 401, an unknown
// model 404, a bad version 400, a model outside the caller's scope 403 as through gRPC, a method
// the API does not have 405). The store decides who sees what: the console has no token of its
// own, it sends each caller's.

#include <sys/wait.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/randn.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/testing/child_process.h"
#include "libs/testing/test_certificates.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

struct Curl {
  int status = 0;
  nlohmann::json body;
  std::string text;
};

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestCaseDir();
    std::filesystem::create_directories(dir_ + "/store");
    std::filesystem::create_directories(dir_ + "/console");
    // A reader of everything, and writers scoped to their team's models (tokens by their
    // SHA-256).
    std::string identities = R"({"identities": [)";
    for (const auto& [name, token, extra] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"serving", "reader-token", R"("role": "reader")"},
             {"team-a", "team-a-token", R"("role": "writer", "models": ["team-a-*"])"},
             {"team-b", "team-b-token", R"("role": "writer", "models": ["team-b-*"])"},
             // A name that is markup: the page must show it as text (console_browser.py).
             {"<img src=x onerror=alert(1)>", "markup-token",
              R"("role": "writer", "models": ["team-a-*"])"}}) {
      const std::string sha =
          testing::RunShell("printf %s '" + token + "' | sha256sum | cut -d' ' -f1").output;
      absl::StrAppend(&identities, name == "serving" ? "" : ",", R"({"name": ")", name,
                      R"(", "token_sha256": ")", absl::StripTrailingAsciiWhitespace(sha), R"(", )",
                      extra, "}");
    }
    absl::StrAppend(&identities, "]}");
    testing::WriteTextFile(dir_ + "/identities.json", identities);
    store_ = std::make_unique<testing::ChildProcess>(
        testing::RunfilesPath("services/checkpoint_store/checkpoint_store"), dir_ + "/store");
    ASSERT_TRUE(store_->Start({"--store_dir=" + dir_ + "/db", "--listen=127.0.0.1:0",
                               "--port_file=" + dir_ + "/store.port",
                               "--identities_file=" + dir_ + "/identities.json"}));
    const int store_port = store_->WaitForPort(dir_ + "/store.port", absl::Seconds(60));
    ASSERT_GT(store_port, 0) << store_->stderr_text();
    store_address_ = absl::StrCat("127.0.0.1:", store_port);

    // Two versions of a team-a model and one of another team's, written as their writers would.
    for (const auto& [model, token] :
         std::vector<std::pair<std::string, std::string>>{{"team-a-resnet", "team-a-token"},
                                                          {"team-a-resnet", "team-a-token"},
                                                          {"team-b-bert", "team-b-token"}}) {
      RemoteStoreOptions options;
      options.address = store_address_;
      options.auth_token = token;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> client,
                           RemoteCheckpointStore::Connect(options));
      CheckpointContents contents;
      contents.model.InsertOrAssign("fc.weight", at::randn({8, 4}));
      (*contents.metadata.mutable_metrics())["val_acc"] = 0.9;
      ASSERT_OK(CommitCheckpoint(*client, model, contents).status());
    }

    console_ = std::make_unique<testing::ChildProcess>(
        testing::RunfilesPath("services/console/console"), dir_ + "/console");
    ASSERT_TRUE(console_->Start({"--store=" + store_address_, "--listen=127.0.0.1:0",
                                 "--port_file=" + dir_ + "/console.port"}));
    const int port = console_->WaitForPort(dir_ + "/console.port", absl::Seconds(60));
    ASSERT_GT(port, 0) << console_->stderr_text();
    base_ = absl::StrCat("http://127.0.0.1:", port);
  }

  // curl PATH as the holder of `token` (none when empty), with `method` (and a JSON `body`).
  Curl Call(const std::string& path, const std::string& token, const std::string& method = "GET",
            const std::string& body = "") {
    const std::string out = dir_ + "/body.json";
    std::string command = absl::StrCat("curl -s -o ", out, " -w '%{http_code}' -X ", method);
    if (!body.empty()) {
      testing::WriteTextFile(dir_ + "/request.json", body);
      absl::StrAppend(&command, " -H 'Content-Type: application/json' --data-binary @", dir_,
                      "/request.json");
    }
    if (!token.empty()) absl::StrAppend(&command, " -H 'Authorization: Bearer ", token, "'");
    absl::StrAppend(&command, " '", base_, path, "'");
    const testing::ShellResult result = testing::RunShell(command);
    Curl curl;
    EXPECT_EQ(result.exit_code, 0) << command << ": " << result.output;
    EXPECT_TRUE(absl::SimpleAtoi(result.output, &curl.status)) << result.output;
    curl.text = testing::ReadFileOrEmpty(out);
    curl.body = nlohmann::json::parse(curl.text, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(curl.body.is_discarded()) << path << ": not JSON: " << curl.text;
    return curl;
  }

  std::string dir_, store_address_, base_;
  std::unique_ptr<testing::ChildProcess> store_, console_;
};

TEST_F(ConsoleTest, EveryEndpointAnswersWithTheCallersRights) {
  const Curl models = Call("/api/v1/models", "reader-token");
  ASSERT_EQ(models.status, 200) << models.text;
  ASSERT_EQ(models.body["models"].size(), 2u) << models.text;
  EXPECT_EQ(models.body["models"][0]["name"], "team-a-resnet");
  EXPECT_EQ(models.body["models"][1]["name"], "team-b-bert");

  const Curl versions = Call("/api/v1/models/team-a-resnet/versions", "reader-token");
  ASSERT_EQ(versions.status, 200) << versions.text;
  ASSERT_EQ(versions.body["versions"].size(), 2u);
  EXPECT_EQ(versions.body["versions"][1]["version"], "2");

  for (const char* ref : {"1", "latest"}) {
    const Curl version =
        Call(absl::StrCat("/api/v1/models/team-a-resnet/versions/", ref), "reader-token");
    ASSERT_EQ(version.status, 200) << version.text;
    EXPECT_EQ(version.body["tensors"][0]["key"], "fc.weight");
    EXPECT_EQ(version.body["version"], std::string(ref) == "1" ? "1" : "2");
  }
  // Filtered as `ckpt ls --where ... --since ...` filters (URL-encoded >=).
  const Curl filtered =
      Call("/api/v1/models/team-a-resnet/versions?where=val_acc%3E%3D0.5&since=1h", "reader-token");
  ASSERT_EQ(filtered.status, 200) << filtered.text;
  EXPECT_EQ(filtered.body["versions"].size(), 2u);
  // A bad filter is 400 naming it.
  const Curl bad_filter = Call("/api/v1/models/team-a-resnet/versions?where=oops", "reader-token");
  EXPECT_EQ(bad_filter.status, 400) << bad_filter.text;
  EXPECT_EQ(bad_filter.body["error"]["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(bad_filter.body["error"]["message"].get<std::string>(), HasSubstr("oops"));
  // Who committed, in the history and the audit log: the writer's identity, not the console's.
  const Curl history = Call("/api/v1/models/team-a-resnet/history", "reader-token");
  ASSERT_EQ(history.status, 200) << history.text;
  EXPECT_EQ(history.body["events"].back()["identity"], "team-a") << history.text;
  const Curl audit = Call("/api/v1/models/team-a-resnet/audit", "reader-token");
  ASSERT_EQ(audit.status, 200) << audit.text;
  EXPECT_EQ(audit.body["records"][0]["identity"], "team-a") << audit.text;
  const Curl lineage = Call("/api/v1/models/team-a-resnet/versions/2/lineage", "reader-token");
  ASSERT_EQ(lineage.status, 200) << lineage.text;
  EXPECT_EQ(lineage.body["version"], "team-a-resnet@2");
  EXPECT_TRUE(lineage.body["ancestors"].empty());
  const Curl diff = Call("/api/v1/models/team-a-resnet/diff?a=1&b=2", "reader-token");
  ASSERT_EQ(diff.status, 200) << diff.text;
  EXPECT_EQ(diff.body["changed"][0]["key"], "fc.weight");
  // The scoped writer sees its team's model as well.
  EXPECT_EQ(Call("/api/v1/models/team-a-resnet/versions", "team-a-token").status, 200);
}

TEST_F(ConsoleTest, ThePrintedUrlServesThePageWithoutInlineScript) {
  // The line is printed just after the port file is written: wait for it.
  for (absl::Time deadline = absl::Now() + absl::Seconds(10);
       console_->stdout_text().find(base_) == std::string::npos && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
  }
  EXPECT_THAT(console_->stdout_text(), HasSubstr(base_ + "/"));
  // The page built into the binary: no copy of services/console/web is in this test's files.
  const testing::ShellResult root = testing::RunShell("curl -s -i '" + base_ + "/'");
  EXPECT_THAT(root.output, HasSubstr("<script src=\"/app.js\" defer></script>"));
  EXPECT_THAT(root.output, HasSubstr("Content-Security-Policy: default-src 'self'"));
  EXPECT_THAT(root.output, HasSubstr("Content-Type: text/html"));
  const testing::ShellResult script = testing::RunShell("curl -s -i '" + base_ + "/app.js'");
  EXPECT_THAT(script.output, HasSubstr("Content-Type: text/javascript"));
  EXPECT_THAT(script.output, HasSubstr("function token()"));
  EXPECT_THAT(testing::RunShell("curl -s -i '" + base_ + "/favicon.svg'").output,
              HasSubstr("Content-Type: image/svg+xml"));
  // A directory that is not there is a bad flag, not a console without its page.
  const testing::ShellResult bad =
      testing::RunShell(testing::RunfilesPath("services/console/console") + " --store=" +
                        store_address_ + " --listen=127.0.0.1:0 --web_dir=/no/such/dir");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("--web_dir=/no/such/dir is not a directory"));
}

// The page in a real headless Chromium: sign in, the models list, a model's page, markup in a
// description shown as text, a promotion by another caller followed live, a wrong token refused;
// screenshots in the test's outputs, and any browser console error fails it.
TEST_F(ConsoleTest, TheBrowserPageShowsTheRegistryAndFollowsAPromotion) {
  if (!std::filesystem::exists("/usr/bin/chromedriver")) {
    if (std::getenv("CKPT_CI") != nullptr) FAIL() << "chromium-driver is not installed";
    GTEST_SKIP() << "needs Debian's chromium, chromium-driver and python3-selenium "
                    "(tools/install_deps.sh)";
  }
  // A fine-tune of version 1, for the lineage graph.
  RemoteStoreOptions options;
  options.address = store_address_;
  options.auth_token = "team-a-token";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> writer,
                       RemoteCheckpointStore::Connect(options));
  CheckpointContents tuned;
  tuned.model.InsertOrAssign("fc.weight", at::randn({8, 4}));
  tuned.metadata.mutable_lineage()->set_parent("team-a-resnet@1");
  tuned.metadata.mutable_lineage()->set_parent_relation("fine_tuned_from");
  ASSERT_OK(CommitCheckpoint(*writer, "team-a-resnet-ft", tuned).status());
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string out = outputs != nullptr ? outputs : dir_ + "/screenshots";
  const testing::ShellResult browser = testing::RunShell(
      absl::StrCat("/usr/bin/python3 ", testing::RunfilesPath("tests/console_browser.py"), " ",
                   base_, " ", out, " 2>&1"));
  EXPECT_EQ(browser.exit_code, 0) << browser.output;
  EXPECT_THAT(browser.output, HasSubstr("every page checked"));
}

// A store without identities (every caller "anonymous", admin): the page asks for no token, shows
// the models at once and says the store is open.
TEST_F(ConsoleTest, TheBrowserPageOfAnOpenStoreAsksForNoToken) {
  if (!std::filesystem::exists("/usr/bin/chromedriver")) {
    if (std::getenv("CKPT_CI") != nullptr) FAIL() << "chromium-driver is not installed";
    GTEST_SKIP() << "needs Debian's chromium, chromium-driver and python3-selenium "
                    "(tools/install_deps.sh)";
  }
  std::filesystem::create_directories(dir_ + "/open-store");
  std::filesystem::create_directories(dir_ + "/open-console");
  testing::ChildProcess store(testing::RunfilesPath("services/checkpoint_store/checkpoint_store"),
                              dir_ + "/open-store");
  ASSERT_TRUE(store.Start({"--store_dir=" + dir_ + "/open-db", "--listen=127.0.0.1:0",
                           "--port_file=" + dir_ + "/open-store.port"}));
  const int store_port = store.WaitForPort(dir_ + "/open-store.port", absl::Seconds(60));
  ASSERT_GT(store_port, 0) << store.stderr_text();
  RemoteStoreOptions options;
  options.address = absl::StrCat("127.0.0.1:", store_port);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> client,
                       RemoteCheckpointStore::Connect(options));
  CheckpointContents contents;
  contents.model.InsertOrAssign("fc.weight", at::randn({2, 2}));
  ASSERT_OK(CommitCheckpoint(*client, "open-net", contents).status());
  testing::ChildProcess console(testing::RunfilesPath("services/console/console"),
                                dir_ + "/open-console");
  ASSERT_TRUE(console.Start({"--store=" + options.address, "--listen=127.0.0.1:0",
                             "--port_file=" + dir_ + "/open-console.port"}));
  const int port = console.WaitForPort(dir_ + "/open-console.port", absl::Seconds(60));
  ASSERT_GT(port, 0) << console.stderr_text();
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string out = outputs != nullptr ? outputs : dir_ + "/screenshots";
  const testing::ShellResult browser = testing::RunShell(
      absl::StrCat("/usr/bin/python3 ", testing::RunfilesPath("tests/console_browser.py"),
                   " --open http://127.0.0.1:", port, " ", out, " 2>&1"));
  EXPECT_EQ(browser.exit_code, 0) << browser.output;
  EXPECT_THAT(browser.output, HasSubstr("open store checked"));
}

TEST_F(ConsoleTest, ErrorsAreJsonWithTheirHttpStatus) {
  const auto expect = [&](const Curl& curl, int status, const std::string& code) {
    EXPECT_EQ(curl.status, status) << curl.text;
    EXPECT_EQ(curl.body["error"]["code"], code) << curl.text;
    EXPECT_FALSE(curl.body["error"]["message"].get<std::string>().empty());
  };
  expect(Call("/api/v1/models", ""), 401, "UNAUTHENTICATED");
  expect(Call("/api/v1/models", "no-such-token"), 401, "UNAUTHENTICATED");
  expect(Call("/api/v1/models/nosuch/versions", "reader-token"), 404, "NOT_FOUND");
  expect(Call("/api/v1/models/team-a-resnet/versions/0", "reader-token"), 400, "INVALID_ARGUMENT");
  expect(Call("/api/v1/models/team-a-resnet/versions/9", "reader-token"), 404, "NOT_FOUND");
  expect(Call("/api/v1/models", "reader-token", "DELETE"), 405, "METHOD_NOT_ALLOWED");
  expect(Call("/api/v2/models", "reader-token"), 404, "NOT_FOUND");
}

TEST_F(ConsoleTest, AScopedCallerSeesNothingOutsideItsScopeAsThroughGrpc) {
  // The team-a writer lists its team's model only, and a call naming team-b's model is refused
  // (403, the store's PERMISSION_DENIED), as the store answers it over gRPC
  // (libs/store/scoped_store.h).
  const Curl models = Call("/api/v1/models", "team-a-token");
  ASSERT_EQ(models.status, 200) << models.text;
  ASSERT_EQ(models.body["models"].size(), 1u) << models.text;
  EXPECT_EQ(models.body["models"][0]["name"], "team-a-resnet");
  const Curl other = Call("/api/v1/models/team-b-bert/versions", "team-a-token");
  EXPECT_EQ(other.status, 403) << other.text;
  EXPECT_EQ(other.body["error"]["code"], "PERMISSION_DENIED");
  EXPECT_THAT(other.body["error"]["message"].get<std::string>(), HasSubstr("team-a-*"));
  EXPECT_EQ(Call("/api/v1/models/team-b-bert/versions/1", "team-a-token").status, 403);
  EXPECT_EQ(Call("/api/v1/models/team-b-bert/versions", "team-b-token").status, 200);
}

TEST_F(ConsoleTest, PromotionNeedsTheWriterRoleAndIsRecordedAsTheCallers) {
  const std::string promote = R"({"version": 1, "alias": "production", "reason": "canary ok"})";
  // The reader may look but not move an alias: the store refuses it (403).
  const Curl reader = Call("/api/v1/models/team-a-resnet/promote", "reader-token", "POST", promote);
  EXPECT_EQ(reader.status, 403) << reader.text;
  // Team b's writer may not touch team a's model.
  EXPECT_EQ(Call("/api/v1/models/team-a-resnet/promote", "team-b-token", "POST", promote).status,
            403);
  const Curl writer = Call("/api/v1/models/team-a-resnet/promote", "team-a-token", "POST", promote);
  ASSERT_EQ(writer.status, 200) << writer.text;
  EXPECT_EQ(writer.body["version"], 1);
  // The alias timeline says who moved it and why.
  const Curl timeline =
      Call("/api/v1/models/team-a-resnet/history?alias=production", "reader-token");
  ASSERT_EQ(timeline.status, 200) << timeline.text;
  ASSERT_EQ(timeline.body["events"].size(), 1u);
  EXPECT_EQ(timeline.body["events"][0]["identity"], "team-a");
  EXPECT_THAT(timeline.body["events"][0]["reason"].get<std::string>(), HasSubstr("canary ok"));
  // A form post (what a page on another site could make a browser send) changes nothing.
  const testing::ShellResult form = testing::RunShell(
      absl::StrCat("curl -s -o /dev/null -w '%{http_code}' -X POST -d 'alias=production' ", base_,
                   "/api/v1/models/team-a-resnet/rollback"));
  EXPECT_EQ(form.output, "400");
}

// The page follows a promotion without reloading: a watch (Server-Sent Events) sends the state,
// then the alias move as it happens.
TEST_F(ConsoleTest, AWatchStreamsThePromotionAsItHappens) {
  testing::ShellResult streamed;
  std::thread watcher([&] {
    streamed = testing::RunShell(
        absl::StrCat("curl -s -N --max-time 6 -H 'Authorization: Bearer reader-token' '", base_,
                     "/api/v1/watch?model=team-a-resnet'"));
  });
  absl::SleepFor(absl::Seconds(2));
  const Curl promoted = Call("/api/v1/models/team-a-resnet/promote", "team-a-token", "POST",
                             R"({"version": 2, "alias": "production", "reason": "live"})");
  EXPECT_EQ(promoted.status, 200) << promoted.text;
  watcher.join();
  std::vector<nlohmann::json> updates;
  for (absl::string_view line : absl::StrSplit(streamed.output, '\n')) {
    if (absl::ConsumePrefix(&line, "data: ")) updates.push_back(nlohmann::json::parse(line));
  }
  ASSERT_GE(updates.size(), 2u) << streamed.output;
  EXPECT_TRUE(updates[0].contains("state")) << streamed.output;
  EXPECT_EQ(updates.back()["event"]["kind"], "ALIAS_SET") << streamed.output;
  EXPECT_EQ(updates.back()["event"]["alias"], "production");
  EXPECT_EQ(updates.back()["event"]["identity"], "team-a");
  // Refusals come back as answers, not inside a stream.
  EXPECT_EQ(Call("/api/v1/watch?model=team-a-resnet", "").status, 401);
  EXPECT_EQ(Call("/api/v1/watch?model=team-b-bert", "team-a-token").status, 403);
}

// The console over HTTPS with mutual TLS in front of a store that requires mutual TLS too: a
// browser (curl here) that presents its certificate and no token is the identity the store lists
// for that certificate, because the console forwards the certificate's names with its own
// certificate, which the store lists as a forwarding front end with no rights of its own.
TEST(ConsoleTlsTest, ABrowsersClientCertificateIsItsIdentityAtTheStore) {
  const std::string dir = testing::TestCaseDir();
  std::filesystem::create_directories(dir + "/certs");
  ASSERT_OK_AND_ASSIGN(const testing::TestCertificates certs,
                       testing::MakeTestCertificates(dir + "/certs"));
  const std::string reader_sha = std::string(absl::StripTrailingAsciiWhitespace(
      testing::RunShell("printf %s reader-token | sha256sum | cut -d' ' -f1").output));
  // The console presents the "ops" certificate; team-a's is a browser user's.
  testing::WriteTextFile(dir + "/identities.json", absl::StrCat(R"({"identities": [
      {"name": "console", "certificate": "ops", "forwards_certificates": true},
      {"name": "team-a", "certificate": "team-a.example", "role": "writer",
       "models": ["team-a-*"]},
      {"name": "admin", "certificate": "admin", "role": "admin"},
      {"name": "serving", "role": "reader", "token_sha256": ")",
                                                                reader_sha, R"("}]})"));
  testing::ChildProcess store(testing::RunfilesPath("services/checkpoint_store/checkpoint_store"),
                              dir);
  ASSERT_TRUE(store.Start(
      {"--store_dir=" + dir + "/db", "--listen=127.0.0.1:0", "--port_file=" + dir + "/store.port",
       "--identities_file=" + dir + "/identities.json", "--tls_cert_file=" + certs.server.cert,
       "--tls_key_file=" + certs.server.key, "--tls_client_ca_file=" + certs.ca}));
  const int store_port = store.WaitForPort(dir + "/store.port", absl::Seconds(60));
  ASSERT_GT(store_port, 0) << store.stderr_text();
  // A version of team-a's model by team-a's certificate, one of team-b's by an admin's.
  ASSERT_OK_AND_ASSIGN(
      const testing::CertificateFiles admin,
      testing::IssueCertificate(dir + "/certs", certs.ca, "admin", "/CN=admin", "", 30));
  RemoteStoreOptions options;
  options.address = absl::StrCat("127.0.0.1:", store_port);
  for (const auto& [model, cert] : std::vector<std::pair<std::string, testing::CertificateFiles>>{
           {"team-a-resnet", certs.client}, {"team-b-bert", admin}}) {
    options.tls = {certs.ca, cert.cert, cert.key, ""};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> client,
                         RemoteCheckpointStore::Connect(options));
    CheckpointContents contents;
    contents.model.InsertOrAssign("fc.weight", at::randn({8, 4}));
    ASSERT_OK(CommitCheckpoint(*client, model, contents).status());
  }

  testing::ChildProcess console(testing::RunfilesPath("services/console/console"), dir);
  ASSERT_TRUE(
      console.Start({"--store=" + options.address, "--store_tls_ca_file=" + certs.ca,
                     "--store_tls_cert_file=" + certs.ops.cert,
                     "--store_tls_key_file=" + certs.ops.key, "--listen=127.0.0.1:0",
                     "--port_file=" + dir + "/console.port", "--tls_cert_file=" + certs.server.cert,
                     "--tls_key_file=" + certs.server.key, "--tls_client_ca_file=" + certs.ca}));
  const int port = console.WaitForPort(dir + "/console.port", absl::Seconds(60));
  ASSERT_GT(port, 0) << console.stderr_text();
  const std::string base = absl::StrCat("https://127.0.0.1:", port);
  // curl as a browser holding `cert` (none: nullptr), with extra arguments; the status and body.
  const auto curl = [&](const testing::CertificateFiles* cert, const std::string& path,
                        const std::string& extra = "") -> std::pair<int, nlohmann::json> {
    std::string command =
        absl::StrCat("curl -sS -o ", dir, "/body.json -w '%{http_code}' --cacert ", certs.ca, " ");
    if (cert != nullptr) absl::StrAppend(&command, "--cert ", cert->cert, " --key ", cert->key);
    absl::StrAppend(&command, " ", extra, " '", base, path, "' 2>&1");
    const testing::ShellResult result = testing::RunShell(command);
    int status = 0;
    if (result.exit_code != 0 || !absl::SimpleAtoi(result.output, &status)) {
      return {-1, nlohmann::json(result.output)};
    }
    return {status, nlohmann::json::parse(testing::ReadFileOrEmpty(dir + "/body.json"), nullptr,
                                          /*allow_exceptions=*/false)};
  };
  EXPECT_THAT(console.stdout_text(), HasSubstr("https://127.0.0.1:"));

  const auto [me_status, me] = curl(&certs.client, "/api/v1/me?model=team-a-resnet");
  ASSERT_EQ(me_status, 200) << me.dump();
  EXPECT_EQ(me["identity"], "team-a via console");
  EXPECT_EQ(me["role"], "writer");
  EXPECT_EQ(me["allowed_methods"][0], "SetAlias");
  // Scoped as the certificate's identity: team-b's model is not listed.
  const auto [models_status, models] = curl(&certs.client, "/api/v1/models");
  ASSERT_EQ(models_status, 200) << models.dump();
  ASSERT_EQ(models["models"].size(), 1u) << models.dump();
  EXPECT_EQ(models["models"][0]["name"], "team-a-resnet");
  // A change by certificate alone, recorded as the user's (via the console).
  testing::WriteTextFile(dir + "/promote.json", R"({"version": 1, "alias": "production"})");
  const std::string json_post = absl::StrCat(
      "-X POST -H 'Content-Type: application/json' --data-binary @", dir, "/promote.json");
  const auto [promoted_status, promoted] =
      curl(&certs.client, "/api/v1/models/team-a-resnet/promote", json_post);
  ASSERT_EQ(promoted_status, 200) << promoted.dump();
  const auto [history_status, history] =
      curl(&certs.client, "/api/v1/models/team-a-resnet/history?alias=production");
  ASSERT_EQ(history_status, 200) << history.dump();
  EXPECT_EQ(history["events"].back()["identity"], "team-a via console") << history.dump();
  // The same change from a page of another site (its Origin) is refused.
  const auto [cross_status, cross] = curl(&certs.client, "/api/v1/models/team-a-resnet/promote",
                                          json_post + " -H 'Origin: https://evil.example'");
  EXPECT_EQ(cross_status, 403) << cross.dump();
  // A token still wins over the certificate.
  const auto [token_status, token_me] =
      curl(&certs.client, "/api/v1/me", "-H 'Authorization: Bearer reader-token'");
  ASSERT_EQ(token_status, 200) << token_me.dump();
  EXPECT_EQ(token_me["identity"], "serving");
  // Without a certificate, or with one another CA signed, there is no connection at all.
  EXPECT_EQ(curl(nullptr, "/api/v1/models").first, -1);
  EXPECT_EQ(curl(&certs.foreign_client, "/api/v1/models").first, -1);
}

// Each open watch holds a server thread: one beyond --max_watches is 429, the rest of the API
// still answers meanwhile, and a slot comes back when its watch ends.
TEST_F(ConsoleTest, AWatchBeyondMaxWatchesIsRefusedAndTheApiStillAnswers) {
  testing::ChildProcess limited(testing::RunfilesPath("services/console/console"),
                                dir_ + "/console");
  ASSERT_TRUE(limited.Start({"--store=" + store_address_, "--listen=127.0.0.1:0",
                             "--port_file=" + dir_ + "/limited.port", "--max_watches=1"}));
  const int port = limited.WaitForPort(dir_ + "/limited.port", absl::Seconds(60));
  ASSERT_GT(port, 0) << limited.stderr_text();
  base_ = absl::StrCat("http://127.0.0.1:", port);
  const std::string watch_command = absl::StrCat(
      "curl -s -o /dev/null -w '%{http_code}' -N --max-time 3 -H 'Authorization: "
      "Bearer reader-token' '",
      base_, "/api/v1/watch?model=team-a-resnet'");
  // The first watch holds the slot from its answer's headers on (written to a file as they come).
  testing::ShellResult first;
  std::thread watcher([&] {
    first = testing::RunShell(absl::StrCat(
        "curl -s -o /dev/null -D ", dir_, "/first.headers -w '%{http_code}' -N --max-time 8 ",
        "-H 'Authorization: Bearer reader-token' '", base_, "/api/v1/watch?model=team-a-resnet'"));
  });
  for (absl::Time deadline = absl::Now() + absl::Seconds(7);
       testing::ReadFileOrEmpty(dir_ + "/first.headers").find(" 200") == std::string::npos &&
       absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(50))) {
  }
  const Curl second = Call("/api/v1/watch?model=team-a-resnet", "reader-token");
  EXPECT_EQ(second.status, 429) << second.text;
  EXPECT_EQ(second.body["error"]["code"], "RESOURCE_EXHAUSTED") << second.text;
  EXPECT_EQ(Call("/api/v1/models", "reader-token").status, 200);
  watcher.join();
  EXPECT_EQ(first.output, "200");
  // The first watch ended with its curl: its slot is free again once the console notices, when a
  // keep-alive (every 5 s) fails to write: the first write after the close may still succeed.
  std::string again;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20);
       again != "200" && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(500))) {
    again = testing::RunShell(watch_command).output;
  }
  EXPECT_EQ(again, "200");
}

TEST(ConsoleHelpTest, HelpListsTheSharedFlags) {
  const testing::ShellResult help =
      testing::RunShell(testing::RunfilesPath("services/console/console") + " --help 2>&1");
  for (const char* flag :
       {"--store ", "--store_tls_ca_file", "--listen", "--port_file", "--shutdown_grace",
        "--tls_cert_file", "--tls_client_ca_file", "--tls_reload_interval"}) {
    EXPECT_THAT(help.output, HasSubstr(flag)) << help.output;
  }
}

TEST_F(ConsoleTest, RefusesToHoldRightsOrServeOtherMachinesInPlainHttp) {
  testing::ChildProcess with_token(testing::RunfilesPath("services/console/console"),
                                   dir_ + "/console");
  testing::WriteTextFile(dir_ + "/token", "reader-token");
  ASSERT_TRUE(with_token.Start(
      {"--store=" + store_address_, "--store_auth_token_file=" + dir_ + "/token"}));
  std::optional<int> exited = with_token.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(WEXITSTATUS(*exited), 2);
  EXPECT_THAT(with_token.stderr_text(), HasSubstr("holds no rights"));

  testing::ChildProcess public_listen(testing::RunfilesPath("services/console/console"),
                                      dir_ + "/console");
  ASSERT_TRUE(public_listen.Start({"--store=" + store_address_, "--listen=0.0.0.0:0"}));
  exited = public_listen.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(WEXITSTATUS(*exited), 2);
  EXPECT_THAT(public_listen.stderr_text(), HasSubstr("loopback"));
}

}  // namespace
}  // namespace ckpt
