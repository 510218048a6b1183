// The `ckpt` binary as users run it: on files real PyTorch wrote, against an embedded store and
// against a real checkpoint_store server with a token. Checks output, exit codes and errors.

#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

using Result = testing::ShellResult;

std::string Dir() { return std::getenv("TEST_TMPDIR"); }

Result Ckpt(const std::string& args) { return testing::RunShell("tools/ckpt/ckpt " + args); }

class CkptCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::RunPythonOrAddFailure("libs/format/testdata/checkpoint_fixtures.py", "make " + Dir());
  }
};

TEST_F(CkptCliTest, EmbeddedStoreWorkflow) {
  const std::string store = "--store_dir=" + Dir() + "/embedded";
  Result imported =
      Ckpt(absl::StrCat("import ", Dir(), "/ddp_cuda1.pt --model mlp --alias best ", store));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_THAT(imported.output, HasSubstr("as mlp@1"));
  EXPECT_THAT(imported.output, HasSubstr("stripped wrapper prefix 'module.'"));
  ASSERT_EQ(Ckpt(absl::StrCat("import ", Dir(), "/bundle.pt --model mlp ", store)).exit_code, 0);

  Result listed = Ckpt("ls mlp " + store);
  EXPECT_EQ(listed.exit_code, 0);
  EXPECT_THAT(listed.output, HasSubstr("best"));

  Result shown = Ckpt("show mlp@best --json " + store);
  ASSERT_EQ(shown.exit_code, 0) << shown.output;
  const nlohmann::json manifest = nlohmann::json::parse(shown.output);
  EXPECT_EQ(manifest["tensors"][0]["key"], "0.weight");
  EXPECT_EQ(manifest["tensors"][0]["original_device"], "cuda:1");

  Result diff = Ckpt("diff mlp@1 mlp@2 " + store);
  EXPECT_THAT(diff.output, HasSubstr("9 unchanged"));
  EXPECT_EQ(Ckpt("verify mlp " + store).exit_code, 0);

  Result refused = Ckpt("rm mlp@1 " + store);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.output, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_EQ(Ckpt("rm mlp@1 --force " + store).exit_code, 0);
  Result stats = Ckpt("stats " + store);
  EXPECT_THAT(stats.output, HasSubstr("versions: 1"));
}

TEST_F(CkptCliTest, AuditSaysWhoChangedAnEmbeddedStoreAndHow) {
  const std::string store = "--store_dir=" + Dir() + "/audited";
  ASSERT_EQ(Ckpt(absl::StrCat("import ", Dir(), "/ddp_cuda1.pt --model mlp --alias best ", store))
                .exit_code,
            0);
  ASSERT_EQ(Ckpt(absl::StrCat("import ", Dir(), "/bundle.pt --model mlp ", store)).exit_code, 0);
  ASSERT_EQ(Ckpt("tag mlp@2 best " + store).exit_code, 0);
  EXPECT_EQ(Ckpt("tag mlp@9 best " + store).exit_code, 1);
  ASSERT_EQ(Ckpt("untag mlp best " + store).exit_code, 0);
  ASSERT_EQ(Ckpt("rm mlp@1 " + store).exit_code, 0);
  ASSERT_EQ(Ckpt("gc --dry-run " + store).exit_code, 0);  // changes nothing: not recorded
  ASSERT_EQ(Ckpt("gc " + store).exit_code, 0);
  const struct passwd* user = getpwuid(geteuid());
  ASSERT_NE(user, nullptr);
  const std::string identity = absl::StrCat("local:", user->pw_name);

  Result text = Ckpt("audit " + store);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  const std::vector<std::string> lines = absl::StrSplit(text.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u) << text.output;
  const std::string by = absl::StrCat("  ", identity, "  local  ");
  EXPECT_THAT(
      lines[0],
      MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6}Z  .*"));
  EXPECT_THAT(lines[0], HasSubstr(by + "commit  mlp@1 alias best  OK  committed mlp@1: "));
  EXPECT_THAT(lines[1], HasSubstr(by + "commit  mlp@2  OK  committed mlp@2: "));
  EXPECT_THAT(lines[2], HasSubstr(by + "set_alias  mlp@2 alias best  OK  alias best: 1 -> 2"));
  EXPECT_THAT(lines[3], HasSubstr(by + "set_alias  mlp@9 alias best  FAILED NOT_FOUND: mlp@9 "
                                       "not found  alias best -> 9"));
  EXPECT_THAT(lines[4], HasSubstr(by + "delete_alias  mlp alias best  OK  alias best deleted"));
  EXPECT_THAT(lines[5], HasSubstr(by + "delete_version  mlp@1  OK  deleted mlp@1"));
  EXPECT_THAT(lines[6], HasSubstr(by + "garbage_collect  -  OK  reclaimed "));

  Result json = Ckpt("audit mlp --json " + store);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const std::vector<std::string> objects = absl::StrSplit(json.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(objects.size(), 6u) << json.output;  // gc touches no model
  std::vector<std::string> actions;
  for (const std::string& object : objects) {
    const nlohmann::json record = nlohmann::json::parse(object);
    EXPECT_EQ(record["identity"], identity);
    EXPECT_EQ(record["peer"], "local");
    EXPECT_EQ(record["model"], "mlp");
    actions.push_back(record["action"].get<std::string>() + " " +
                      record["outcome"].get<std::string>());
  }
  EXPECT_THAT(actions, ElementsAre("commit OK", "commit OK", "set_alias OK", "set_alias FAILED",
                                   "delete_alias OK", "delete_version OK"));
  const nlohmann::json failed = nlohmann::json::parse(objects[3]);
  EXPECT_EQ(failed["error_code"], "NOT_FOUND");
  EXPECT_EQ(failed["version"], 9);
  EXPECT_EQ(failed["sequence"], 4);

  EXPECT_EQ(Ckpt("audit --since=1h " + store).output, text.output);
  Result future = Ckpt("audit --since=2999-01-01T00:00:00Z " + store);
  EXPECT_EQ(future.exit_code, 0);
  EXPECT_EQ(future.output, "");
  Result bad_since = Ckpt("audit --since=yesterday " + store);
  EXPECT_EQ(bad_since.exit_code, 1);
  EXPECT_THAT(bad_since.output, HasSubstr("neither a duration"));

  // Whoever committed is the producer.
  EXPECT_THAT(Ckpt("show mlp@2 " + store).output, HasSubstr("by " + identity));
  EXPECT_THAT(Ckpt("--help").output, HasSubstr("audit [MODEL]"));
}

TEST_F(CkptCliTest, ConvertAndInspect) {
  const std::string out = Dir() + "/clean.pt";
  Result converted = Ckpt(absl::StrCat("convert ", Dir(), "/ddp_cuda1.pt ", out));
  ASSERT_EQ(converted.exit_code, 0) << converted.output;
  EXPECT_EQ(testing::RunPythonOrAddFailure("libs/format/testdata/checkpoint_fixtures.py",
                                           absl::StrCat("verify_torch ", out, " ", Dir())),
            "OK\n");
  Result inspected = Ckpt(absl::StrCat("inspect ", Dir(), "/bundle.pt --json"));
  ASSERT_EQ(inspected.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(inspected.output)["model"]["wrapper_prefix"], "module.");
}

TEST_F(CkptCliTest, UsageErrorsExitTwoAndFailuresExitOne) {
  EXPECT_EQ(Ckpt("--help").exit_code, 0);
  EXPECT_THAT(Ckpt("--help").output, HasSubstr("import FILE"));
  EXPECT_EQ(Ckpt("import --help").exit_code, 0);
  Result unknown = Ckpt("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_EQ(Ckpt("inspect").exit_code, 2);
  Result missing = Ckpt("inspect " + Dir() + "/no-such.pt");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("NOT_FOUND"));
}

TEST_F(CkptCliTest, RemoteStoreWithToken) {
  const std::string token_file = Dir() + "/token";
  std::ofstream(token_file) << "tok-123\n";
  const std::string port_file = Dir() + "/port";
  const pid_t server = fork();
  if (server == 0) {
    const std::string db = "--db_path=" + Dir() + "/served";
    const std::string port = "--port_file=" + port_file;
    const std::string token = "--auth_token_file=" + token_file;
    execl("services/checkpoint_store/checkpoint_store", "checkpoint_store", db.c_str(),
          port.c_str(), token.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  for (absl::Time deadline = absl::Now() + absl::Seconds(60);
       absl::Now() < deadline && port == 0;) {
    std::ifstream in(port_file);
    if (!(in >> port)) absl::SleepFor(absl::Milliseconds(10));  // The server writes it when ready.
  }
  ASSERT_GT(port, 0);
  const std::string remote = absl::StrCat("--store=127.0.0.1:", port);
  Result denied = Ckpt("ls " + remote);
  EXPECT_EQ(denied.exit_code, 1);
  EXPECT_THAT(denied.output, HasSubstr("UNAUTHENTICATED"));
  const std::string auth = absl::StrCat(remote, " --auth_token_file=", token_file);
  Result imported = Ckpt(absl::StrCat("import ", Dir(), "/whole_model.pt --model net ", auth));
  EXPECT_EQ(imported.exit_code, 0) << imported.output;
  Result listed = Ckpt("ls " + auth);
  EXPECT_THAT(listed.output, HasSubstr("net"));
  // The server audits the import as its caller (the holder of the shared token), from this
  // client's address.
  Result audited = Ckpt("audit " + auth);
  EXPECT_EQ(audited.exit_code, 0) << audited.output;
  EXPECT_THAT(audited.output, HasSubstr("  token  ipv4:127.0.0.1:"));
  EXPECT_THAT(audited.output, HasSubstr("  commit  net@1  OK  committed net@1: "));
  EXPECT_EQ(Ckpt("verify " + auth).exit_code, 0);
  kill(server, SIGTERM);
  int status = 0;
  waitpid(server, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace ckpt
