// The model registry end to end, as a team runs it: a checkpoint_store service with named
// identities and a loader service in front of it (real binaries on 127.0.0.1), `ckpt` commands for
// the people, and a `ckpt sync` sidecar keeping a serving directory in step with
// resnet@production. Real PyTorch writes the checkpoints and loads what the sidecar serves.
//
// The script: import a version as production; the sidecar serves it; import a better-trained
// version and annotate its evaluation; a promotion under a rule is refused, then accepted once
// the evaluation is good enough; the sidecar serves the new version within a bounded time; the
// store restarts; a rollback (by another identity) reaches the sidecar across the restart; the
// history tells every step with who did it and why.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/store/chunk_hasher.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFileOrEmpty;
using testing::RunfilesPath;
using testing::ShellResult;

constexpr char kScript[] = "tests/testdata/serving_scenario.py";
// How long the sidecar may take to serve a move of the alias.
constexpr absl::Duration kServeWithin = absl::Seconds(15);

std::string Dir() { return std::getenv("TEST_TMPDIR"); }

ShellResult Ckpt(const std::string& args) { return testing::RunShell("tools/ckpt/ckpt " + args); }

// A token file for `name` and its identities-file entry.
std::string Identity(const std::string& name, const std::string& role) {
  const std::string token = "token-of-" + name;
  testing::WriteTextFile(Dir() + "/" + name + ".token", token + "\n");
  return absl::StrCat(R"({"name": ")", name, R"(", "token_sha256": ")", HexEncode(Sha256(token)),
                      R"(", "role": ")", role, R"("})");
}

std::string As(const std::string& name, int store_port) {
  return absl::StrCat("--store=127.0.0.1:", store_port, " --store_auth_token_file=", Dir(), "/",
                      name, ".token");
}

// The store service on `listen` (127.0.0.1:0 for any port), serving Dir()/store.
std::unique_ptr<ChildProcess> StartStore(const std::string& name, const std::string& listen,
                                         int* port) {
  const std::string dir = Dir() + "/" + name;
  std::filesystem::create_directories(dir);
  auto store = std::make_unique<ChildProcess>(
      RunfilesPath("services/checkpoint_store/checkpoint_store"), dir);
  const std::string port_file = dir + "/port";
  EXPECT_TRUE(store->Start({"--store_dir=" + Dir() + "/store", "--listen=" + listen,
                            "--port_file=" + port_file,
                            "--identities_file=" + Dir() + "/identities.json"}));
  *port = store->WaitForPort(port_file, absl::Seconds(60));
  return store;
}

// Waits until `path` holds `contents`; how long that took, or nullopt after `timeout`.
std::optional<absl::Duration> WaitForFile(const std::string& path, const std::string& contents,
                                          absl::Duration timeout) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < timeout) {
    if (ReadFileOrEmpty(path) == contents) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(25));
  }
  return std::nullopt;
}

TEST(ServingScenarioTest, PromoteServeRestartRollBackAndTellTheHistory) {
  ASSERT_EQ(testing::RunPythonOrAddFailure(kScript, "make " + Dir()), "");
  testing::WriteTextFile(
      Dir() + "/identities.json",
      absl::StrCat(R"({"identities": [)", Identity("alice", "writer"), ", ",
                   Identity("ops", "admin"), ", ", Identity("serving-fleet", "reader"), ", ",
                   Identity("loader", "reader"), "]}"));
  int store_port = 0;
  std::unique_ptr<ChildProcess> store = StartStore("store-1", "127.0.0.1:0", &store_port);
  ASSERT_GT(store_port, 0) << store->stderr_text();
  const std::string alice = As("alice", store_port);
  const std::string ops = As("ops", store_port);

  std::filesystem::create_directories(Dir() + "/loader");
  ChildProcess loader(RunfilesPath("services/loader/loader"), Dir() + "/loader");
  ASSERT_TRUE(loader.Start({absl::StrCat("--store=127.0.0.1:", store_port),
                            "--store_auth_token_file=" + Dir() + "/loader.token",
                            "--port_file=" + Dir() + "/loader/port"}));
  const int loader_port = loader.WaitForPort(Dir() + "/loader/port", absl::Seconds(60));
  ASSERT_GT(loader_port, 0) << loader.stderr_text();

  // Version 1 goes to production.
  ShellResult created = Ckpt(
      "model create resnet --owner vision --description 'the classifier' "
      "--reason 'new service' " +
      alice);
  ASSERT_EQ(created.exit_code, 0) << created.output;
  ShellResult first = Ckpt(absl::StrCat("import ", Dir(),
                                        "/v1.pt --model resnet --alias "
                                        "production --metric loss=0.61 --run-id run-1 ",
                                        alice));
  ASSERT_EQ(first.exit_code, 0) << first.output;

  // The sidecar: a reader, exporting through the loader service.
  const std::string serving = Dir() + "/serving";
  const std::string current = serving + "/resnet/CURRENT";
  std::filesystem::create_directories(Dir() + "/sync");
  ChildProcess sync(RunfilesPath("tools/ckpt/ckpt"), Dir() + "/sync");
  ASSERT_TRUE(sync.Start({"sync", "resnet@production", serving, "--format", "pt", "--keep", "2",
                          absl::StrCat("--store=127.0.0.1:", store_port),
                          absl::StrCat("--loader=127.0.0.1:", loader_port),
                          "--store_auth_token_file=" + Dir() + "/serving-fleet.token",
                          "--loader_auth_token_file=" + Dir() + "/serving-fleet.token"}));
  ASSERT_TRUE(WaitForFile(current, "1\n", kServeWithin).has_value()) << sync.stderr_text();
  EXPECT_EQ(testing::RunPythonOrAddFailure(
                kScript, absl::StrCat("serve ", serving, "/resnet/1/model.pt ", Dir(), "/v1.pt")),
            "OK\n");

  // Version 2, evaluated: not good enough for the rule, then good enough.
  ShellResult second = Ckpt(absl::StrCat(
      "import ", Dir(),
      "/v2.pt --model resnet --metric loss=0.34 --run-id run-2 --parent "
      "resnet@1 --parent-relation fine_tuned_from --code-revision 4f2a9c1 --dataset imagenet-1k ",
      alice));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(
      Ckpt("annotate resnet@2 --metric val_acc=0.87 --reason 'holdout eval' " + alice).exit_code,
      0);
  const std::string rule = "--require 'val_acc>=0.9' --require 'loss<=0.5' --require-verified ";
  ShellResult refused = Ckpt("promote resnet@2 production " + rule + alice);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("FAILED_PRECONDITION: cannot promote resnet@2 to "
                                        "production: val_acc is 0.87, below 0.9"));
  // The sidecar may not act on a refused promotion.
  EXPECT_EQ(ReadFileOrEmpty(current), "1\n");
  // A reader may not promote at all.
  ShellResult reader = Ckpt("promote resnet@2 production " + As("serving-fleet", store_port));
  EXPECT_THAT(reader.output, HasSubstr("PERMISSION_DENIED"));

  ASSERT_EQ(Ckpt("annotate resnet@2 --metric val_acc=0.93 --reason 'holdout eval, fixed "
                 "labels' " +
                 alice)
                .exit_code,
            0);
  ShellResult promoted =
      Ckpt("promote resnet@2 production " + rule + "--reason 'weekly release' " + alice);
  ASSERT_EQ(promoted.exit_code, 0) << promoted.output;
  EXPECT_THAT(promoted.output, HasSubstr("resnet@production -> 2 (was 1)"));
  std::optional<absl::Duration> served = WaitForFile(current, "2\n", kServeWithin);
  ASSERT_TRUE(served.has_value()) << sync.stderr_text();
  std::cout << "the sidecar served resnet@2 within " << absl::FormatDuration(*served)
            << " of ckpt promote returning\n";
  EXPECT_EQ(testing::RunPythonOrAddFailure(
                kScript, absl::StrCat("serve ", serving, "/resnet/2/model.pt ", Dir(), "/v2.pt")),
            "OK\n");
  const nlohmann::json metadata =
      nlohmann::json::parse(ReadFileOrEmpty(serving + "/resnet/2/metadata.json"));
  EXPECT_EQ(metadata["version"], 2);
  EXPECT_EQ(metadata["alias"], "production");
  EXPECT_EQ(metadata["metadata"]["lineage"]["parent"], "resnet@1");
  EXPECT_EQ(metadata["metadata"]["lineage"]["code_revision"], "4f2a9c1");
  EXPECT_EQ(metadata["annotations"]["metrics"]["val_acc"], 0.93);
  EXPECT_EQ(metadata["annotations"]["updated_by"], "alice");
  EXPECT_EQ(metadata["tensor_count"], 4);

  // The store restarts on the same address; the sidecar and the loader reconnect.
  store->Signal(SIGTERM);
  ASSERT_TRUE(store->WaitForExit(absl::Seconds(60)).has_value());
  store = StartStore("store-2", absl::StrCat("127.0.0.1:", store_port), &store_port);
  ASSERT_GT(store_port, 0) << store->stderr_text();

  ShellResult rolled = Ckpt("rollback resnet production --reason 'latency regression' " + ops);
  ASSERT_EQ(rolled.exit_code, 0) << rolled.output;
  EXPECT_THAT(rolled.output, HasSubstr("resnet@production -> 1 (was 2)"));
  ASSERT_TRUE(WaitForFile(current, "1\n", kServeWithin).has_value()) << sync.stderr_text();
  EXPECT_EQ(testing::RunPythonOrAddFailure(
                kScript, absl::StrCat("serve ", serving, "/resnet/1/model.pt ", Dir(), "/v1.pt")),
            "OK\n");
  std::vector<std::string> served_versions;
  for (const auto& entry : std::filesystem::directory_iterator(serving + "/resnet")) {
    served_versions.push_back(entry.path().filename().string());
  }
  std::sort(served_versions.begin(), served_versions.end());
  EXPECT_THAT(served_versions, ::testing::ElementsAre(".lock", "1", "2", "CURRENT"));

  // Every step, with who and why; the refused promotion changed nothing, so it is not there.
  ShellResult history = Ckpt("history resnet " + ops);
  ASSERT_EQ(history.exit_code, 0) << history.output;
  const std::vector<std::string> events = absl::StrSplit(history.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(events.size(), 8u) << history.output;
  EXPECT_THAT(events[0], HasSubstr("  alice  MODEL_CREATED  created model resnet, owner vision  "
                                   "reason: new service"));
  EXPECT_THAT(events[1], HasSubstr("  alice  VERSION_COMMITTED  committed resnet@1 as production"));
  EXPECT_THAT(events[2], HasSubstr("  alice  ALIAS_SET  resnet@production (new) -> 1"));
  EXPECT_THAT(events[3], HasSubstr("  alice  VERSION_COMMITTED  committed resnet@2"));
  EXPECT_THAT(events[4], HasSubstr("  alice  VERSION_ANNOTATED  annotated resnet@2: now metrics "
                                   "val_acc=0.87  reason: holdout eval"));
  EXPECT_THAT(events[5], HasSubstr("  alice  VERSION_ANNOTATED  annotated resnet@2: now metrics "
                                   "val_acc=0.93  reason: holdout eval, fixed labels"));
  EXPECT_THAT(events[6], HasSubstr("  alice  ALIAS_SET  resnet@production 1 -> 2  reason: "
                                   "promoted resnet@2: val_acc 0.93 >= 0.9, loss 0.34 <= 0.5, "
                                   "verified; weekly release"));
  EXPECT_THAT(events[7], HasSubstr("  ops  ALIAS_SET  resnet@production 2 -> 1  reason: rollback "
                                   "of production from 2 to 1; latency regression"));
  EXPECT_THAT(history.output, Not(HasSubstr("serving-fleet")));

  const std::string log = sync.stderr_text();
  std::cout << "the sidecar's log:\n" << log;
  EXPECT_THAT(log, HasSubstr("synced resnet@production -> version 1 in "));
  EXPECT_THAT(log, HasSubstr("synced resnet@production -> version 2 in "));
  EXPECT_THAT(log, HasSubstr("synced resnet@production -> version 1 (already on disk)"));
  // Killing the sidecar is safe at any time: nothing half-written is left in view.
  sync.Signal(SIGTERM);
  EXPECT_TRUE(sync.WaitForExit(absl::Seconds(30)).has_value());
  loader.Signal(SIGTERM);
  store->Signal(SIGTERM);
}

}  // namespace
}  // namespace ckpt
