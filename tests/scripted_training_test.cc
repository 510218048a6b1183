// A team's own PyTorch model through //services/trainer: a TorchScript module scripted in
// Python (tests/testdata/scripted_training.py) trained with DDP by the real launcher and ranks,
// exported with `ckpt export --bundle`, and read back by real PyTorch into the Python class with
// its optimizer and scheduler, against the same steps of a plain Python loop. Plus a SIGKILLed
// rank resuming bit-exactly, and modules that do not fit failing clearly without touching the
// store.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/testing/python_runner.h"
#include "libs/train/testing/bundle_comparison.h"
#include "tests/testing/trainer_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::FindRank;
using ::ckpt::testing::IsOk;
using ::ckpt::testing::OpenStore;
using ::ckpt::testing::ReadFile;
using ::ckpt::testing::RunTrainer;
using ::ckpt::testing::StartTrainer;
using ::ckpt::testing::TempPath;
using ::ckpt::testing::TrainerProcess;
using ::ckpt::testing::WaitForExit;
using ::ckpt::testing::WaitForStep;
using ::testing::HasSubstr;

constexpr char kScript[] = "tests/testdata/scripted_training.py";
// The default names: the file's stem and the data's kind.
constexpr char kModel[] = "net-pt";
constexpr char kShardsModel[] = "net-shards";

// The team's side, written once for the whole binary.
const std::string& Team() { return ckpt::testing::TeamDir(kScript); }

// The flags scripted_training.py's reference loop matches. `data`: "pt" (data.pt) or "shards"
// (the same examples in four shard files).
std::vector<std::string> Flags(const std::string& store_dir, const std::string& module, int ranks,
                               int64_t batch, int64_t steps, const std::string& data = "pt") {
  return {"--store_dir=" + store_dir,
          "--model=torchscript:" + Team() + "/" + module,
          data == "pt" ? "--data=pt:" + Team() + "/data.pt" : "--data=shards:" + Team() + "/shards",
          absl::StrCat("--nproc_per_node=", ranks),
          absl::StrCat("--batch_size=", batch),
          absl::StrCat("--steps=", steps),
          "--lr=0.05",
          "--weight_decay=0.01",
          "--momentum=0.9",
          "--clip_grad_norm=1",
          "--seed=1234",
          "--step_size=7",
          "--gamma=0.5",
          "--warmup_steps=5",
          "--log_every=1",
          "--checkpoint_every=0"};
}

// `ckpt export MODEL OUT --bundle` against the store in `store_dir`; its output.
std::string ExportBundle(const std::string& store_dir, const std::string& out,
                         const std::string& model = kModel) {
  const std::string command = absl::StrCat("tools/ckpt/ckpt --store_dir=", store_dir, " export ",
                                           model, " ", out, " --bundle 2>&1");
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  EXPECT_EQ(status, 0) << command << "\n" << output;
  return output;
}

// The largest relative differences scripted_training.py printed: at the export, and after three
// more steps resumed in Python.
std::pair<double, double> MaxDifferences(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex(R"(MAXDIFF (\S+) (\S+))"))) {
    ADD_FAILURE() << output;
    return {1, 1};
  }
  return {std::stod(match[1]), std::stod(match[2])};
}

struct ParityCase {
  std::string optimizer;
  std::string scheduler;
};

class ScriptedParityTest : public ::testing::TestWithParam<ParityCase> {};

// One rank, 20 steps, against the same 20 steps of a plain Python loop from the same initial
// weights over the same batches; then Python resumes from the exported bundle.
TEST_P(ScriptedParityTest, OneRankMatchesAPlainPythonLoopAndTheBundleResumesInPython) {
  const ParityCase& c = GetParam();
  const std::string dir = TempPath("parity_" + c.optimizer);
  std::vector<std::string> flags = Flags(dir, "net.ts", 1, 8, 20);
  flags.push_back("--optimizer=" + c.optimizer);
  flags.push_back("--scheduler=" + c.scheduler);
  ASSERT_EQ(RunTrainer(flags, dir + ".log"), 0) << ReadFile(dir + ".log");
  const std::string log = ReadFile(dir + ".log");
  EXPECT_THAT(log, HasSubstr("TorchScript module: __torch__.Net"));
  EXPECT_THAT(log, HasSubstr("the module's loss()"));

  const std::string bundle = dir + "_bundle.pt";
  EXPECT_THAT(ExportBundle(dir, bundle), HasSubstr("whole bundle"));
  const std::string output = ckpt::testing::RunPythonOrAddFailure(
      kScript, absl::StrCat("check ", Team(), " ", bundle, " ", c.optimizer, " ", c.scheduler,
                            " 20 1 8"));
  std::cerr << output;
  const auto [at_export, after_resume] = MaxDifferences(output);
  // Bit-equal: Debian's Python torch and the trainer run the same LibTorch kernels on one
  // thread, and torch::optim's SGD / AdamW and clip_grad_norm_ do torch.optim's arithmetic in
  // its order.
  EXPECT_EQ(at_export, 0);
  EXPECT_EQ(after_resume, 0);
}

INSTANTIATE_TEST_SUITE_P(Combos, ScriptedParityTest,
                         ::testing::Values(ParityCase{"sgd", "step"}, ParityCase{"adamw", "cosine"}),
                         [](const auto& info) { return info.param.optimizer; });

// Two ranks reading shard files, against Python's full-batch loop over the shard-by-shard order
// the trainer documents: the same examples, batches and updates.
TEST(ScriptedTrainingTest, TwoRanksOnShardsMatchPythonsFullBatchLoop) {
  const std::string dir = TempPath("two_ranks");
  std::vector<std::string> flags = Flags(dir, "net.ts", 2, 4, 20, "shards");
  flags.push_back("--optimizer=sgd");
  flags.push_back("--scheduler=step");
  ASSERT_EQ(RunTrainer(flags, dir + ".log"), 0) << ReadFile(dir + ".log");
  EXPECT_THAT(ReadFile(dir + ".log"), HasSubstr("/shards: 4 file(s), 96 examples of [1,8,8]"));
  const std::string bundle = dir + "_bundle.pt";
  ExportBundle(dir, bundle, kShardsModel);
  const std::string output = ckpt::testing::RunPythonOrAddFailure(
      kScript, absl::StrCat("check ", Team(), " ", bundle, " sgd step 20 2 4 shards"));
  std::cerr << output;
  const auto [at_export, after_resume] = MaxDifferences(output);
  // DDP sums the two ranks' gradients and divides by 2, where the Python loop backpropagates
  // (l0 + l1) / 2 in one pass: the same terms, but nothing promises the same rounding, so the
  // bound is a few float32 ulps per step carried through 20 steps of momentum (1e-6 relative).
  // On this machine's Debian torch 1.13 both came out bit-equal (the script prints it).
  EXPECT_LE(at_export, 1e-6);
  EXPECT_LE(after_resume, 1e-6);
}

// Shard data: the resumed ranks continue the epoch's shard-by-shard order where the checkpoint
// left it.
TEST(ScriptedTrainingTest, AKilledRankResumesAndTheRunEndsBitIdentical) {
  const std::string clean = TempPath("scripted_clean"), killed = TempPath("scripted_killed");
  auto long_run = [](const std::string& dir) {
    std::vector<std::string> flags = Flags(dir, "net.ts", 2, 4, 600, "shards");
    flags.back() = "--checkpoint_every=50";
    flags.push_back("--log_every=10");
    return flags;
  };
  const absl::Time clean_start = absl::Now();
  ASSERT_EQ(RunTrainer(long_run(clean), clean + ".log"), 0) << ReadFile(clean + ".log");
  const absl::Duration budget = std::max(absl::Seconds(120), 3 * (absl::Now() - clean_start));

  std::vector<std::string> flags = long_run(killed);
  flags.push_back("--max_restarts=1");
  TrainerProcess process = StartTrainer(flags, killed + ".log");
  ASSERT_TRUE(WaitForStep(process, 120, absl::Seconds(60))) << ReadFile(process.log);
  const pid_t rank1 = FindRank(process.pid, 1);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  ASSERT_EQ(WaitForExit(process, budget), 0) << ReadFile(process.log);
  const std::string log = ReadFile(process.log);
  ASSERT_THAT(log, HasSubstr("restarting all ranks"));
  std::smatch resumed;
  ASSERT_TRUE(std::regex_search(log, resumed,
                                std::regex(R"(resuming net-shards@(\d+) from step (\d+) to 600)")))
      << log;
  EXPECT_GE(std::stoll(resumed[2]), 100);

  std::unique_ptr<RocksDbCheckpointStore> clean_store = OpenStore(clean);
  std::unique_ptr<RocksDbCheckpointStore> killed_store = OpenStore(killed);
  ASSERT_TRUE(clean_store && killed_store);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> clean_versions,
                       clean_store->ListVersions(kShardsModel));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> killed_versions,
                       killed_store->ListVersions(kShardsModel));
  ASSERT_EQ(killed_versions.size(), clean_versions.size());
  ASSERT_GT(clean_versions.size(), 10u);
  for (size_t i = 0; i < clean_versions.size(); ++i) {
    const v1::VersionRef ref = MakeVersionRef(kShardsModel, clean_versions[i].version());
    EXPECT_EQ(killed_versions[i].metadata().global_step(),
              clean_versions[i].metadata().global_step());
    // Model, optimizer, scheduler, the trainer's state and RNG, bit for bit.
    EXPECT_THAT(train::testing::CompareStoredBundles(*clean_store, ref, *killed_store, ref),
                IsOk());
  }
}

// The store after a bad run: still only the good run's one version.
void ExpectStoreUnchanged(const std::string& dir) {
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store->ListModels());
  EXPECT_EQ(models.size(), 1u);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store->ListVersions(kModel));
  EXPECT_EQ(versions.size(), 1u);
}

TEST(ScriptedTrainingTest, ModulesThatDoNotFitFailClearlyAndLeaveTheStoreUnchanged) {
  const std::string dir = TempPath("bad");
  ASSERT_EQ(RunTrainer(Flags(dir, "net.ts", 1, 8, 2), dir + "_good.log"), 0)
      << ReadFile(dir + "_good.log");
  struct Bad {
    std::string module;
    std::vector<std::string> expected;
  };
  const std::vector<Bad> cases = {
      {"weights.pt", {"is not a TorchScript module", "torch.jit.script(model).save(PATH)"}},
      {"flat_input.ts",
       {"does not run on the data", "inputs [8, 1, 8, 8] Float", "(64x8 and 10x5)"}},
      {"noparams.ts", {"has no parameters that require grad"}},
      {"vector_loss.ts", {"a tensor of shape [8] and dtype Float", "not a floating-point scalar"}},
      {"missing.ts", {"no TorchScript module at"}},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.module);
    const std::string log = absl::StrCat(dir, "_", bad.module, ".log");
    std::vector<std::string> flags = Flags(dir, bad.module, 1, 8, 4);
    flags.push_back("--model_name=" + std::string(kModel));
    EXPECT_EQ(RunTrainer(flags, log), 1) << ReadFile(log);
    for (const std::string& expected : bad.expected) {
      EXPECT_THAT(ReadFile(log), HasSubstr(expected));
    }
    ExpectStoreUnchanged(dir);
  }
}

TEST(ScriptedTrainingTest, ANanLossStopsTheRunAndTheLastGoodCheckpointStaysLatest) {
  const std::string dir = TempPath("nan");
  std::vector<std::string> flags = Flags(dir, "nan_after.ts", 2, 4, 20);
  flags.back() = "--checkpoint_every=4";
  EXPECT_EQ(RunTrainer(flags, dir + ".log"), 1) << ReadFile(dir + ".log");
  const std::string log = ReadFile(dir + ".log");
  EXPECT_THAT(log, HasSubstr("the loss at step 9 is nan"));
  EXPECT_THAT(log, HasSubstr("without checkpointing that state"));
  std::unique_ptr<RocksDbCheckpointStore> store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store->ListVersions("nan_after-pt"));
  ASSERT_EQ(versions.size(), 2u);
  EXPECT_EQ(versions.back().metadata().global_step(), 8);
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store->GetManifest(*ParseVersionRef("nan_after-pt")));
  EXPECT_EQ(latest.metadata().global_step(), 8);
}

}  // namespace
}  // namespace ckpt
