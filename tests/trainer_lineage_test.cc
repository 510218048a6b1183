// The trainer's lineage and held-out metrics, end to end: the real launcher starting two real
// ranks (Gloo over loopback) three times into one embedded store, then the versions read back
// from RocksDB. Lineage walks go through GetManifest, as a person's `ckpt show` would.

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"
#include "libs/train/testing/bundle_comparison.h"
#include "tests/testing/trainer_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::OpenStore;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kMlp[] = "mlp-synthetic";
// A cnn has BatchNorm: buffers that an evaluation in train mode, or on another rank's
// statistics, would change.
constexpr char kCnn[] = "cnn-synthetic";

std::vector<std::string> SmallRun(const std::string& store_dir, int64_t steps,
                                  const std::string& model) {
  // With a quarter held out, 192 examples over 2 ranks of 16: 6 steps an epoch, so legs of 4
  // steps end mid-epoch. A constant learning rate makes three legs one run (trainer.h).
  return {"--store_dir=" + store_dir,
          "--nproc_per_node=2",
          "--batch_size=16",
          "--synthetic_examples=256",
          absl::StrCat("--steps=", steps),
          "--checkpoint_every=2",
          "--scheduler=none",
          "--log_every=1000",
          "--model=" + model,
          "--hidden=8"};
}

// Runs the trainer to its end; the log (stdout and stderr) on failure.
void RunTrainer(const std::vector<std::string>& flags, const std::string& name) {
  const std::string dir = testing::TestCaseDir() + "/" + name;
  std::filesystem::create_directories(dir);
  testing::ChildProcess trainer(testing::RunfilesPath("services/trainer/trainer"), dir);
  ASSERT_TRUE(trainer.Start(flags));
  const std::optional<int> status = trainer.WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << name << " did not finish:\n" << trainer.stderr_text();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << name << ":\n"
      << trainer.stderr_text() << trainer.stdout_text();
}

v1::Manifest Manifest(CheckpointStore& store, const std::string& ref) {
  absl::StatusOr<v1::Manifest> manifest = store.GetManifest(*ParseVersionRef(ref));
  EXPECT_OK(manifest.status()) << ref;
  return manifest.ok() ? *manifest : v1::Manifest();
}

// A temporary git checkout with one commit; its HEAD, or nullopt without git.
std::optional<std::string> MakeCheckout(const std::string& dir) {
  if (testing::RunShell("git --version").exit_code != 0) return std::nullopt;
  std::filesystem::create_directories(dir);
  testing::WriteTextFile(dir + "/train.py", "print('train')\n");
  const std::string git =
      absl::StrCat("cd '", dir, "' && export HOME='", dir,
                   "' GIT_CONFIG_NOSYSTEM=1 GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.com "
                   "GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.com && ");
  testing::ShellResult made = testing::RunShell(
      git + "git init -q . && git add train.py && git commit -q -m one && git rev-parse HEAD");
  EXPECT_EQ(made.exit_code, 0) << made.output;
  std::string head = made.output;
  while (!head.empty() && (head.back() == '\n' || head.back() == ' ')) head.pop_back();
  EXPECT_EQ(head.size(), 40u) << made.output;
  return head;
}

TEST(TrainerLineageTest, ThreeRunsChainTheirLineageThroughBothResumePointsAndRecordMetrics) {
  const std::string dir = testing::TestCaseDir();
  const std::string store_dir = dir + "/store";
  const std::string checkout = dir + "/checkout";
  const std::optional<std::string> head = MakeCheckout(checkout);
  std::vector<std::string> flags = SmallRun(store_dir, 4, "cnn");
  flags.push_back("--eval_fraction=0.25");

  // Run 1 as under `bazel run` from a clean checkout; run 2 after a file appeared in it; run 3
  // with the revision given.
  setenv("BUILD_WORKSPACE_DIRECTORY", checkout.c_str(), 1);
  RunTrainer(flags, "run1");
  testing::WriteTextFile(checkout + "/notes.txt", "untracked\n");
  RunTrainer(flags, "run2");
  unsetenv("BUILD_WORKSPACE_DIRECTORY");
  std::vector<std::string> given = flags;
  given.push_back("--code_revision=release-7");
  RunTrainer(given, "run3");

  // An uninterrupted run of all 12 steps that evaluates only at its epoch ends (steps 6 and 12),
  // where the legs evaluated every 2 steps: evaluation must leave no trace on training (the
  // cnn's BatchNorm statistics included).
  std::vector<std::string> straight = SmallRun(dir + "/straight", 12, "cnn");
  straight.push_back("--eval_fraction=0.25");
  straight.push_back("--checkpoint_every=0");
  RunTrainer(straight, "straight");

  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(store_dir);
  ASSERT_NE(store, nullptr);
  // Checkpoints every 2 steps of each 4-step leg: versions 1-2, 3-4, 5-6.
  const v1::Manifest newest = Manifest(*store, kCnn);
  ASSERT_EQ(newest.version(), 6);
  EXPECT_EQ(newest.metadata().global_step(), 12);

  // Walk parents from the newest version: one hop per run, through both resume points.
  std::vector<std::string> walk;
  std::vector<std::string> run_ids;
  for (v1::Manifest at = newest;;) {
    walk.push_back(absl::StrCat(at.model(), "@", at.version()));
    run_ids.push_back(at.metadata().lineage().run_id());
    if (at.metadata().lineage().parent().empty()) break;
    EXPECT_EQ(at.metadata().lineage().parent_relation(), "resumed_from");
    ASSERT_LT(walk.size(), 10u) << "the lineage loops";
    at = Manifest(*store, at.metadata().lineage().parent());
  }
  EXPECT_THAT(walk,
              ::testing::ElementsAre("cnn-synthetic@6", "cnn-synthetic@4", "cnn-synthetic@2"));
  EXPECT_EQ(std::set<std::string>(run_ids.begin(), run_ids.end()).size(), 3u)
      << "each run has its own id";

  // Every version of a run: the run's id, the same parent; metrics of the held-out part.
  const std::map<int, std::string> parents = {{1, ""},
                                              {2, ""},
                                              {3, "cnn-synthetic@2"},
                                              {4, "cnn-synthetic@2"},
                                              {5, "cnn-synthetic@4"},
                                              {6, "cnn-synthetic@4"}};
  for (const auto& [version, parent] : parents) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    const v1::Manifest manifest = Manifest(*store, absl::StrCat(kCnn, "@", version));
    const v1::Lineage& lineage = manifest.metadata().lineage();
    EXPECT_EQ(lineage.parent(), parent);
    EXPECT_EQ(lineage.parent_relation(), parent.empty() ? "" : "resumed_from");
    EXPECT_EQ(lineage.run_id(), run_ids[(6 - version) / 2]);
    EXPECT_THAT(lineage.run_id(), StartsWith("cnn-synthetic-"));
    EXPECT_THAT(lineage.dataset(), HasSubstr("synthetic: 256 examples"));
    EXPECT_THAT(lineage.dataset(), HasSubstr("64 held out for evaluation"));
    EXPECT_EQ(lineage.producer_info().at("world_size"), "2");
    EXPECT_EQ(lineage.producer_info().at("backend"), "gloo");
    EXPECT_FALSE(lineage.producer_info().at("hostname").empty());
    EXPECT_THAT(lineage.producer_info().at("trainer_build"), HasSubstr("LibTorch"));
    const auto& metrics = manifest.metadata().metrics();
    ASSERT_TRUE(metrics.contains("val_loss") && metrics.contains("val_acc"));
    EXPECT_TRUE(std::isfinite(metrics.at("val_loss")));
    EXPECT_GT(metrics.at("val_loss"), 0);
    EXPECT_GE(metrics.at("val_acc"), 0);
    EXPECT_LE(metrics.at("val_acc"), 1);
    EXPECT_TRUE(metrics.contains("loss"));
    // The code revision: the checkout's HEAD, then dirty, then as given.
    if (version > 4) {
      EXPECT_EQ(lineage.code_revision(), "release-7");
    } else if (!head) {
      EXPECT_EQ(lineage.code_revision(), "") << "no git: no revision";
    } else {
      EXPECT_EQ(lineage.code_revision(), version <= 2 ? *head : *head + "+dirty");
    }
  }
  // The model learns on the held-out part too: the last run evaluates better than the first.
  EXPECT_LT(newest.metadata().metrics().at("val_loss"),
            Manifest(*store, "cnn-synthetic@1").metadata().metrics().at("val_loss"));

  // The history says why each version was committed.
  HistoryQuery query;
  query.model = kCnn;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, store->ListHistory(query));
  std::vector<std::string> reasons;
  for (const v1::RegistryEvent& event : events) {
    if (event.kind() == v1::RegistryEvent::VERSION_COMMITTED) reasons.push_back(event.reason());
  }
  ASSERT_EQ(reasons.size(), 6u);
  EXPECT_EQ(reasons[5], absl::StrCat("checkpoint at epoch 2 step 12 of run ", run_ids[0]));

  // Three legs with evaluation end bit-identical to one uninterrupted run with it.
  std::unique_ptr<RocksDbCheckpointStore> straight_store = OpenStore(dir + "/straight");
  ASSERT_NE(straight_store, nullptr);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint legs, LoadCheckpoint(*store, *ParseVersionRef(kCnn)));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint one,
                       LoadCheckpoint(*straight_store, *ParseVersionRef(kCnn)));
  EXPECT_OK(train::testing::CompareStateDicts(legs.contents.model, one.contents.model));
  EXPECT_EQ(legs.manifest.metadata().metrics().at("val_loss"),
            one.manifest.metadata().metrics().at("val_loss"));
}

TEST(TrainerLineageTest, WithoutAHeldOutPartNoValMetricsAndOutsideACheckoutNoRevision) {
  const std::string dir = testing::TestCaseDir();
  const std::string plain = dir + "/not-a-checkout";
  std::filesystem::create_directories(plain);
  // git must not find a checkout above the directory either.
  setenv("GIT_CEILING_DIRECTORIES", dir.c_str(), 1);
  setenv("BUILD_WORKSPACE_DIRECTORY", plain.c_str(), 1);
  RunTrainer(SmallRun(dir + "/store", 2, "mlp"), "run");
  unsetenv("BUILD_WORKSPACE_DIRECTORY");
  unsetenv("GIT_CEILING_DIRECTORIES");

  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir + "/store");
  ASSERT_NE(store, nullptr);
  const v1::Manifest latest = Manifest(*store, kMlp);
  EXPECT_EQ(latest.metadata().global_step(), 2);
  EXPECT_FALSE(latest.metadata().metrics().contains("val_loss"));
  EXPECT_FALSE(latest.metadata().metrics().contains("val_acc"));
  EXPECT_TRUE(latest.metadata().metrics().contains("loss"));
  const v1::Lineage& lineage = latest.metadata().lineage();
  EXPECT_EQ(lineage.code_revision(), "");
  EXPECT_EQ(lineage.parent(), "");  // a fresh run.
  EXPECT_THAT(lineage.run_id(), StartsWith("mlp-synthetic-"));
  EXPECT_THAT(lineage.dataset(), HasSubstr("synthetic: 256 examples"));
  EXPECT_THAT(lineage.dataset(), ::testing::Not(HasSubstr("held out")));

  // A fraction that leaves nothing to train on is a bad flag (exit 2), named.
  const std::string bad = dir + "/bad";
  std::filesystem::create_directories(bad);
  testing::ChildProcess trainer(testing::RunfilesPath("services/trainer/trainer"), bad);
  ASSERT_TRUE(trainer.Start({"--eval_fraction=1", "--store_dir=" + dir + "/unused"}));
  const std::optional<int> status = trainer.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2);
  EXPECT_THAT(trainer.stderr_text(), HasSubstr("--eval_fraction must be in [0, 1)"));
}

}  // namespace
}  // namespace ckpt
