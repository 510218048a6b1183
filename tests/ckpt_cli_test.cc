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
  // A model's versions are verified in one call, which reads each chunk once however many
  // versions share it: here, the chunks the whole store's verify reads.
  Result verified = Ckpt("verify mlp " + store);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr("verified mlp (2 versions): "));
  Result whole = Ckpt("verify " + store);
  EXPECT_EQ(whole.exit_code, 0) << whole.output;
  const auto chunks_of = [](const std::string& output) {
    const size_t from = output.find(": ") + 2;
    return output.substr(from, output.find(" chunks") - from);
  };
  EXPECT_EQ(chunks_of(verified.output), chunks_of(whole.output)) << verified.output << whole.output;

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

TEST_F(CkptCliTest, RegistryWorkflowOnAnEmbeddedStore) {
  const std::string store = "--store_dir=" + Dir() + "/registry";
  const struct passwd* user = getpwuid(geteuid());
  ASSERT_NE(user, nullptr);
  const std::string identity = absl::StrCat("local:", user->pw_name);

  // The model, before its first version.
  Result created = Ckpt(
      "model create mlp --description 'tiny mlp' --owner vision --tag team=cv "
      "--reason 'new project' " +
      store);
  ASSERT_EQ(created.exit_code, 0) << created.output;
  EXPECT_THAT(Ckpt("model create mlp " + store).output, HasSubstr("ALREADY_EXISTS"));
  Result updated = Ckpt("model update mlp --owner platform --remove-tag team " + store);
  ASSERT_EQ(updated.exit_code, 0) << updated.output;
  Result shown = Ckpt("model show mlp " + store);
  EXPECT_THAT(shown.output, HasSubstr("description: tiny mlp\nowner: platform\n"));
  EXPECT_THAT(shown.output, HasSubstr("versions: 0 (latest 0)"));
  EXPECT_EQ(Ckpt("model frob mlp " + store).exit_code, 1);

  // Versions with metrics and lineage; bad lineage and metrics are refused.
  Result first = Ckpt(absl::StrCat("import ", Dir(), "/ddp_cuda1.pt --model mlp --alias production",
                                   " --metric loss=0.5 --run-id run-1 --dataset toy",
                                   " --code-revision abc123 --label stage=dev ", store));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  Result second = Ckpt(absl::StrCat("import ", Dir(), "/bundle.pt --model mlp --metric loss=0.2",
                                    " --parent mlp@1 --parent-relation resumed_from ", store));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  Result lost_parent =
      Ckpt(absl::StrCat("import ", Dir(), "/bundle.pt --model mlp --parent mlp@9 ", store));
  EXPECT_EQ(lost_parent.exit_code, 1);
  EXPECT_THAT(lost_parent.output, HasSubstr("NOT_FOUND: --parent: mlp@9"));
  Result alias_parent = Ckpt(
      absl::StrCat("import ", Dir(), "/bundle.pt --model mlp --parent mlp@production ", store));
  EXPECT_THAT(alias_parent.output, HasSubstr("must name a version number"));
  Result bad_metric =
      Ckpt(absl::StrCat("import ", Dir(), "/bundle.pt --model mlp --metric loss=low ", store));
  EXPECT_THAT(bad_metric.output, HasSubstr("--metric loss=low: the value must be a finite number"));
  const nlohmann::json manifest = nlohmann::json::parse(Ckpt("show mlp@2 --json " + store).output);
  EXPECT_EQ(manifest["metadata"]["lineage"]["parent"], "mlp@1");
  EXPECT_EQ(manifest["metadata"]["lineage"]["parent_relation"], "resumed_from");
  EXPECT_EQ(manifest["metadata"]["metrics"]["loss"], 0.2);
  EXPECT_THAT(Ckpt("show mlp@1 " + store).output,
              HasSubstr("run: run-1\ncode: abc123\ndataset: toy\n"));

  // Promotion under a rule: refused with the reason, then accepted once evaluation is better.
  ASSERT_EQ(Ckpt("annotate mlp@2 --metric val_acc=0.87 --tag eval=nightly --reason eval " + store)
                .exit_code,
            0);
  EXPECT_THAT(Ckpt("annotate mlp@2 " + store).output, HasSubstr("annotate needs --metric"));
  EXPECT_THAT(Ckpt("annotate mlp@7 --metric a=1 " + store).output, HasSubstr("NOT_FOUND"));
  Result refused =
      Ckpt("promote mlp@2 production --require 'val_acc>=0.9' --require 'loss<=0.3' " + store);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.output, HasSubstr("FAILED_PRECONDITION: cannot promote mlp@2 to production: "
                                        "val_acc is 0.87, below 0.9"));
  EXPECT_THAT(Ckpt("promote mlp@2 production --require 'val_acc>0.9' " + store).output,
              HasSubstr("is not one of NAME>=X"));
  EXPECT_THAT(Ckpt("promote mlp@2 production --require 'f1>=0.5' " + store).output,
              HasSubstr("it has no metric 'f1'"));
  ASSERT_EQ(Ckpt("annotate mlp@2 --metric val_acc=0.93 " + store).exit_code, 0);
  Result promoted = Ckpt(
      "promote mlp@2 production --require 'val_acc>=0.9' --require 'loss<=0.3' "
      "--require-verified --reason 'weekly release' " +
      store);
  ASSERT_EQ(promoted.exit_code, 0) << promoted.output;
  EXPECT_THAT(promoted.output, HasSubstr("mlp@production -> 2 (was 1)"));

  // Filters select versions by what is known about them.
  Result good = Ckpt("ls mlp --where 'val_acc>=0.9' " + store);
  ASSERT_EQ(good.exit_code, 0) << good.output;
  const std::vector<std::string> good_lines = absl::StrSplit(good.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(good_lines.size(), 2u) << good.output;
  EXPECT_THAT(good_lines[1], MatchesRegex("2 +.*production"));
  Result dev = Ckpt("ls mlp --label stage=dev --since 1h " + store);
  ASSERT_EQ(dev.exit_code, 0) << dev.output;
  const std::vector<std::string> dev_lines = absl::StrSplit(dev.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(dev_lines.size(), 2u) << dev.output;
  EXPECT_THAT(dev_lines[1], MatchesRegex("1 +.*"));
  Result old = Ckpt("ls mlp --tag eval=nightly --until 2000-01-01T00:00:00Z " + store);
  ASSERT_EQ(old.exit_code, 0) << old.output;
  EXPECT_THAT(old.output, MatchesRegex("VERSION [^\n]*\n"));  // the header alone
  EXPECT_THAT(Ckpt("ls --where 'a>=1' " + store).output, HasSubstr("need a MODEL"));
  EXPECT_THAT(Ckpt("ls mlp --where 'a>>1' " + store).output, HasSubstr("INVALID_ARGUMENT"));

  // Tags with reasons, rollback, and the history of it all.
  ASSERT_EQ(Ckpt("tag mlp@1 canary --reason 'try the old one' " + store).exit_code, 0);
  ASSERT_EQ(Ckpt("untag mlp canary --reason done " + store).exit_code, 0);
  Result rolled = Ckpt("rollback mlp production --reason 'bad canary' " + store);
  ASSERT_EQ(rolled.exit_code, 0) << rolled.output;
  EXPECT_THAT(rolled.output, HasSubstr("mlp@production -> 1 (was 2)"));
  EXPECT_THAT(Ckpt("rollback mlp canary " + store).output, HasSubstr("NOT_FOUND"));

  Result history = Ckpt("history mlp " + store);
  ASSERT_EQ(history.exit_code, 0) << history.output;
  const std::vector<std::string> events = absl::StrSplit(history.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(events.size(), 11u) << history.output;
  for (const std::string& event : events) {
    EXPECT_THAT(event, MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{15}Z  " + identity +
                                    "  [A-Z_]+  .*"));
  }
  EXPECT_THAT(events[0], HasSubstr("MODEL_CREATED  created model mlp, owner vision  reason: new "
                                   "project"));
  EXPECT_THAT(events[1], HasSubstr("MODEL_UPDATED  updated model mlp: now description 'tiny "
                                   "mlp', owner platform"));
  EXPECT_THAT(events[2], HasSubstr("VERSION_COMMITTED  committed mlp@1 as production"));
  EXPECT_THAT(events[3], HasSubstr("ALIAS_SET  mlp@production (new) -> 1"));
  EXPECT_THAT(events[4], HasSubstr("VERSION_COMMITTED  committed mlp@2"));
  EXPECT_THAT(events[5], HasSubstr("VERSION_ANNOTATED  annotated mlp@2: now metrics "
                                   "val_acc=0.87, tags eval=nightly  reason: eval"));
  EXPECT_THAT(events[6], HasSubstr("VERSION_ANNOTATED  annotated mlp@2: now metrics val_acc=0.93"));
  EXPECT_THAT(events[7], HasSubstr("ALIAS_SET  mlp@production 1 -> 2  reason: promoted mlp@2: "
                                   "val_acc 0.93 >= 0.9, loss 0.2 <= 0.3, verified; weekly "
                                   "release"));
  EXPECT_THAT(events[8], HasSubstr("ALIAS_SET  mlp@canary (new) -> 1  reason: try the old one"));
  EXPECT_THAT(events[9], HasSubstr("ALIAS_DELETED  mlp@canary deleted (was 1)  reason: done"));
  EXPECT_THAT(events[10], HasSubstr("ALIAS_SET  mlp@production 2 -> 1  reason: rollback of "
                                    "production from 2 to 1; bad canary"));

  Result aliases = Ckpt("history mlp@production --json " + store);
  ASSERT_EQ(aliases.exit_code, 0) << aliases.output;
  const std::vector<std::string> moves = absl::StrSplit(aliases.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(moves.size(), 3u) << aliases.output;
  const nlohmann::json rollback = nlohmann::json::parse(moves[2]);
  EXPECT_EQ(rollback["kind"], "ALIAS_SET");
  EXPECT_EQ(rollback["identity"], identity);
  EXPECT_EQ(rollback["previous_version"], 2);
  EXPECT_EQ(rollback["version"], 1);
  EXPECT_EQ(rollback["reason"], "rollback of production from 2 to 1; bad canary");
  EXPECT_THAT(Ckpt("history --since=yesterday " + store).output, HasSubstr("neither a duration"));
  // A reference reads as everywhere else (version_ref.h): "latest" is the model's whole history,
  // a version number is refused.
  EXPECT_EQ(Ckpt("history mlp@latest " + store).output, history.output);
  EXPECT_THAT(Ckpt("history mlp@2 " + store).output,
              HasSubstr("INVALID_ARGUMENT: history shows a model's or an alias's changes"));

  // Sync once: the served file is the version real PyTorch loads.
  const std::string serving = Dir() + "/serving";
  Result synced =
      Ckpt(absl::StrCat("sync mlp@production ", serving, " --once --format pt ", store));
  ASSERT_EQ(synced.exit_code, 0) << synced.output;
  EXPECT_THAT(synced.output, HasSubstr("synced mlp@production -> version 1 in "));
  EXPECT_EQ(testing::ReadFileOrEmpty(serving + "/mlp/CURRENT"), "1\n");
  EXPECT_EQ(testing::RunPythonOrAddFailure(
                "libs/format/testdata/checkpoint_fixtures.py",
                absl::StrCat("verify_torch ", serving, "/mlp/1/model.pt ", Dir())),
            "OK\n");
  const nlohmann::json metadata =
      nlohmann::json::parse(testing::ReadFileOrEmpty(serving + "/mlp/1/metadata.json"));
  EXPECT_EQ(metadata["metadata"]["lineage"]["run_id"], "run-1");
  EXPECT_THAT(Ckpt(absl::StrCat("sync mlp@1 ", serving, " --once ", store)).output,
              HasSubstr("sync follows an alias"));
  EXPECT_THAT(Ckpt(absl::StrCat("sync mlp@staging ", serving, " --once ", store)).output,
              HasSubstr("NOT_FOUND: mlp@staging does not exist"));
  EXPECT_THAT(
      Ckpt(absl::StrCat("sync mlp@production ", serving, " --once --keep -1 ", store)).output,
      HasSubstr("--keep must be between"));

  // Rename and delete.
  ASSERT_EQ(Ckpt("model rename mlp mlp2 --reason reorg " + store).exit_code, 0);
  EXPECT_THAT(Ckpt("model show mlp2 " + store).output, HasSubstr("aliases: production=1"));
  Result kept = Ckpt("model delete mlp2 " + store);
  EXPECT_EQ(kept.exit_code, 1);
  EXPECT_THAT(kept.output, HasSubstr("FAILED_PRECONDITION"));
  Result deleted = Ckpt("model delete mlp2 --force " + store);
  ASSERT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_THAT(deleted.output, HasSubstr("deleted model mlp2 with 2 version(s)"));
  EXPECT_THAT(Ckpt("--help").output, HasSubstr("promote MODEL@VERSION ALIAS"));
  EXPECT_THAT(Ckpt("promote --help").output, HasSubstr("(repeatable)"));
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
  // A stored version's name: inspect reads files; it says which command describes a version.
  Result version = Ckpt("inspect resnet@best");
  EXPECT_EQ(version.exit_code, 1);
  EXPECT_THAT(version.output, HasSubstr("run `ckpt show resnet@best` (with --store"));
}

TEST_F(CkptCliTest, RemoteStoreWithToken) {
  const std::string token_file = Dir() + "/token";
  std::ofstream(token_file) << "tok-123\n";
  const std::string port_file = Dir() + "/port";
  const pid_t server = fork();
  if (server == 0) {
    const std::string db = "--store_dir=" + Dir() + "/served";
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
  const std::string auth = absl::StrCat(remote, " --store_auth_token_file=", token_file);
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
  // Who the store takes this caller to be (ckpt.v1.Identity): the shared token, an admin.
  Result who = Ckpt("whoami --model net " + auth);
  EXPECT_EQ(who.exit_code, 0) << who.output;
  EXPECT_THAT(who.output, HasSubstr("identity: token\nrole: admin\nmodels: all\n"));
  EXPECT_THAT(who.output, HasSubstr("on net, may call: GetManifest, Upload, SetAlias"));
  EXPECT_THAT(Ckpt("whoami " + remote).output, HasSubstr("UNAUTHENTICATED"));
  Result embedded = Ckpt("whoami --store_dir=" + Dir() + "/served");
  EXPECT_NE(embedded.exit_code, 0) << embedded.output;
  EXPECT_THAT(embedded.output, HasSubstr("an embedded --store_dir has no identities"));
  // The spelling before --store_auth_token_file still works, for one release, and says so; both
  // spellings together, or a token for a connection the command does not make, are refused.
  Result deprecated = Ckpt(absl::StrCat("ls ", remote, " --auth_token_file=", token_file));
  EXPECT_EQ(deprecated.exit_code, 0) << deprecated.output;
  EXPECT_THAT(deprecated.output, HasSubstr("net"));
  EXPECT_THAT(deprecated.output,
              HasSubstr("--auth_token_file is deprecated and will be removed in the next "
                        "release; use --store_auth_token_file"));
  Result both = Ckpt(absl::StrCat("ls ", auth, " --auth_token_file=", token_file));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_THAT(both.output, HasSubstr("--store_auth_token_file and --auth_token_file (its "
                                     "deprecated spelling) given together"));
  Result loader_token = Ckpt(absl::StrCat("ls ", auth, " --loader_auth_token_file=", token_file));
  EXPECT_NE(loader_token.exit_code, 0);
  EXPECT_THAT(loader_token.output, HasSubstr("--loader_auth_token_file needs --loader=HOST:PORT"));
  Result no_store = Ckpt(absl::StrCat("ls --store_tls_ca_file=", token_file));
  EXPECT_NE(no_store.exit_code, 0);
  EXPECT_THAT(no_store.output, HasSubstr("--store_tls_ca_file needs --store=HOST:PORT"));
  kill(server, SIGTERM);
  int status = 0;
  waitpid(server, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace ckpt
