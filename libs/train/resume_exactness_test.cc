// Resume exactness: a small MLP trained with Adam + StepLR for 40 steps in one go ends with the
// same bits as one trained 20 steps, committed to a real RocksDB store (model, optimizer,
// scheduler, step), restored in a FRESH PROCESS and trained 20 more steps. The fresh process is
// this test binary re-executed with kChildDirEnv set, which runs only
// ResumeExactnessTest.ContinuesInFreshProcess; it commits its final state as version 2, which
// the parent compares with the uninterrupted run.

#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/mse_loss.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/tanh.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/lr_scheduler.h"
#include "libs/train/optimizer.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/linear.h"

extern char** environ;

namespace ckpt::train {
namespace {

constexpr char kChildDirEnv[] = "CKPT_RESUME_EXACTNESS_CHILD_DIR";
constexpr char kModel[] = "mlp";
constexpr int kHalf = 20;

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor Forward(const at::Tensor& x) { return fc2->forward(at::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};

struct TrainingRun {
  std::shared_ptr<Mlp> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<LrScheduler> scheduler;
};

// Model weights come from `init_seed`; the resumed run uses another seed, so only the restore
// can make it match.
TrainingRun MakeRun(uint64_t init_seed) {
  at::manual_seed(init_seed);
  TrainingRun run;
  run.model = std::make_shared<Mlp>();
  OptimizerSpec optimizer_spec = *ParseOptimizerKind("adam");
  optimizer_spec.lr = 0.02;
  run.optimizer = *MakeOptimizer(optimizer_spec, run.model->parameters());
  SchedulerSpec scheduler_spec;
  scheduler_spec.kind = "step";
  scheduler_spec.step_size = 7;
  scheduler_spec.gamma = 0.6;
  run.scheduler = *MakeScheduler(scheduler_spec, *run.optimizer);
  return run;
}

// Steps [first, first + n): the batch of a step depends only on its number.
void Train(TrainingRun& run, int first, int n) {
  for (int step = first; step < first + n; ++step) {
    at::Generator gen = at::detail::createCPUGenerator(1000 + step);
    at::Tensor x = at::randn({8, 6}, gen);
    at::Tensor y = at::randn({8, 3}, gen);
    run.optimizer->zero_grad();
    at::Tensor loss = at::mse_loss(run.model->Forward(x), y);
    loss.backward();
    run.optimizer->step();
    run.scheduler->Step();
  }
}

absl::StatusOr<CommitResult> Commit(CheckpointStore& store, const TrainingRun& run, int step) {
  CheckpointContents contents;
  for (const auto& item : run.model->named_parameters()) {
    RETURN_IF_ERROR(contents.model.Insert(item.key(), item.value().detach()));
  }
  ASSIGN_OR_RETURN(contents.optimizer, OptimizerStateDict(*run.optimizer));
  contents.scheduler = run.scheduler->StateDict();
  contents.extra = Value::Dict({{"step", Value::Int(step)}});
  contents.optimizer_param_names = OptimizerParamNames(*run.model);
  return CommitCheckpoint(store, kModel, contents);
}

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> OpenStore(const std::string& dir) {
  StoreOptions options;
  options.db_path = dir + "/store";
  return RocksDbCheckpointStore::Open(options);
}

absl::StatusOr<LoadedCheckpoint> LoadVersion(CheckpointStore& store, int version) {
  ASSIGN_OR_RETURN(v1::VersionRef ref,
                   ParseVersionRef(std::string(kModel) + "@" + std::to_string(version)));
  return LoadCheckpoint(store, ref);
}

// Runs this test binary again with only the child test selected; returns its exit status.
int RunChild(const std::string& dir) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    // The child must not write the parent's test.xml or premature-exit marker.
    if (entry.rfind("XML_OUTPUT_FILE=", 0) == 0 || entry.rfind("GTEST_OUTPUT=", 0) == 0 ||
        entry.rfind("TEST_PREMATURE_EXIT_FILE=", 0) == 0) {
      continue;
    }
    env.push_back(entry);
  }
  env.push_back(std::string(kChildDirEnv) + "=" + dir);
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--gtest_filter=ResumeExactnessTest.ContinuesInFreshProcess"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
  if (error != 0) {
    ADD_FAILURE() << "posix_spawn: " << std::strerror(error);
    return -1;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ResumeExactnessTest, ResumedInFreshProcessMatchesUninterruptedRunBitForBit) {
  if (std::getenv(kChildDirEnv) != nullptr) GTEST_SKIP() << "the parent's test";
  const std::string dir = std::getenv("TEST_TMPDIR");

  TrainingRun uninterrupted = MakeRun(/*init_seed=*/0);
  Train(uninterrupted, 0, 2 * kHalf);

  {
    TrainingRun first_half = MakeRun(/*init_seed=*/0);
    Train(first_half, 0, kHalf);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(dir));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, Commit(*store, first_half, kHalf));
    ASSERT_EQ(committed.version.version(), 1);
  }  // Closes the store: RocksDB lets one process hold it.

  ASSERT_EQ(RunChild(dir), 0) << "the resumed run failed; its output is above";

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(dir));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint resumed, LoadVersion(*store, 2));
  ASSERT_EQ(resumed.contents.extra.Find("step")->int_value(), 2 * kHalf);
  int compared = 0;
  for (const auto& item : uninterrupted.model->named_parameters()) {
    const at::Tensor* tensor = resumed.contents.model.Find(item.key());
    ASSERT_NE(tensor, nullptr) << item.key();
    EXPECT_TRUE(at::equal(*tensor, item.value().detach())) << item.key() << " differs";
    ++compared;
  }
  EXPECT_EQ(compared, 4);
  // Not just the weights: optimizer moments, steps, and learning rates agree exactly too.
  ASSERT_OK_AND_ASSIGN(Value optimizer_state, OptimizerStateDict(*uninterrupted.optimizer));
  EXPECT_EQ(resumed.contents.optimizer.value(), optimizer_state);
  EXPECT_EQ(resumed.contents.scheduler.value(), uninterrupted.scheduler->StateDict());
}

// The fresh process: restore version 1, train the second half, commit it as version 2.
TEST(ResumeExactnessTest, ContinuesInFreshProcess) {
  const char* dir = std::getenv(kChildDirEnv);
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of the test above";

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(dir));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadVersion(*store, 1));
  TrainingRun run = MakeRun(/*init_seed=*/12345);
  {
    at::NoGradGuard no_grad;
    for (auto& item : run.model->named_parameters()) {
      const at::Tensor* saved = loaded.contents.model.Find(item.key());
      ASSERT_NE(saved, nullptr) << item.key();
      item.value().copy_(*saved);
    }
  }
  EXPECT_EQ(loaded.contents.optimizer_param_names, OptimizerParamNames(*run.model));
  ASSERT_TRUE(loaded.contents.optimizer.has_value());
  ASSERT_TRUE(loaded.contents.scheduler.has_value());
  ASSERT_OK(LoadOptimizerStateDict(*run.optimizer, *loaded.contents.optimizer));
  ASSERT_OK(run.scheduler->LoadStateDict(*loaded.contents.scheduler));
  const int step = static_cast<int>(loaded.contents.extra.Find("step")->int_value());
  ASSERT_EQ(step, kHalf);

  Train(run, step, kHalf);
  ASSERT_OK_AND_ASSIGN(CommitResult committed, Commit(*store, run, step + kHalf));
  EXPECT_EQ(committed.version.version(), 2);
}

}  // namespace
}  // namespace ckpt::train
