// A Python training loop saves with ckpt_client (Client.save: DataParallel keys, AdamW, StepLR)
// to a real store service; C++ resumes from that version with what the trainer resumes with
// (LoadCheckpoint over gRPC, LoadOptimizerStateDict, LrScheduler::LoadStateDict)
// and takes the remaining steps over the same batches: its weights equal, bit for bit, those of the
// Python loop that never stopped. Both sides run LibTorch's kernels on one thread.

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"
#include "libs/train/lr_scheduler.h"
#include "libs/train/optimizer.h"
#include "torch/torch.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ChildProcess;
using ::ckpt::testing::RunfilesPath;
using ::testing::HasSubstr;

constexpr int kSaveAt = 3;  // Python saves after this many steps,
constexpr int kTotal = 7;   // and goes on to this many.

at::Tensor Find(const StateDict& state, const std::string& key) {
  const at::Tensor* tensor = state.Find(key);
  if (tensor == nullptr) {
    ADD_FAILURE() << "no '" << key << "' in the stored state dict";
    return at::Tensor();
  }
  return *tensor;
}

TEST(PythonSaveResumeTest, CppResumesAPythonSavedBundleBitExactly) {
  at::set_num_threads(1);
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::filesystem::create_directories(dir + "/store-run");
  ChildProcess store(RunfilesPath("services/checkpoint_store/checkpoint_store"),
                     dir + "/store-run");
  ASSERT_TRUE(store.Start({"--store_dir=" + dir + "/store", "--listen=127.0.0.1:0",
                           "--port_file=" + dir + "/store-run/port"}));
  const int port = store.WaitForPort(dir + "/store-run/port", absl::Seconds(60));
  ASSERT_GT(port, 0) << store.stderr_text();
  const std::string address = absl::StrCat("127.0.0.1:", port);

  setenv("PYTHONPATH", RunfilesPath("clients/python").c_str(), 1);
  EXPECT_THAT(testing::RunPythonOrAddFailure("tests/testdata/python_save_loop.py",
                                             absl::StrCat(address, " ", kSaveAt, " ", kTotal)),
              HasSubstr("OK"));

  RemoteStoreOptions options;
  options.address = address;
  options.deadline = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteCheckpointStore> remote,
                       RemoteCheckpointStore::Connect(options));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint saved,
                       LoadCheckpoint(*remote, MakeVersionRef("py.loop", 1)));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint batches,
                       LoadCheckpoint(*remote, MakeVersionRef("py.batches", 1)));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint reference,
                       LoadCheckpoint(*remote, MakeVersionRef("py.reference", 1)));
  EXPECT_EQ(saved.manifest.metadata().global_step(), kSaveAt);
  EXPECT_EQ(saved.manifest.tensors(0).original_key(), "module.0.weight");

  // The module Python trained, built in C++: torch::nn::Sequential names its layers "0", "1",
  // "2" as Python's does. Its initial weights do not matter: the restore replaces them.
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      const at::Tensor stored = Find(saved.contents.model, item.key());
      ASSERT_TRUE(stored.defined());
      item.value().copy_(stored);
    }
  }
  EXPECT_EQ(saved.contents.optimizer_param_names.at(0), "0.weight");

  train::OptimizerSpec optimizer_spec;
  optimizer_spec.kind = "adamw";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<torch::optim::Optimizer> optimizer,
                       train::MakeOptimizer(optimizer_spec, model->parameters()));
  ASSERT_TRUE(saved.contents.optimizer.has_value());
  ASSERT_OK(train::LoadOptimizerStateDict(*optimizer, *saved.contents.optimizer));
  train::SchedulerSpec scheduler_spec;
  scheduler_spec.kind = "step";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<train::LrScheduler> scheduler,
                       train::MakeScheduler(scheduler_spec, *optimizer));
  ASSERT_TRUE(saved.contents.scheduler.has_value());
  ASSERT_OK(scheduler->LoadStateDict(*saved.contents.scheduler));
  EXPECT_EQ(scheduler->last_epoch(), kSaveAt);

  for (int step = kSaveAt; step < kTotal; ++step) {
    const at::Tensor x = Find(batches.contents.model, absl::StrCat("x", step));
    const at::Tensor y = Find(batches.contents.model, absl::StrCat("y", step));
    ASSERT_TRUE(x.defined() && y.defined());
    optimizer->zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    optimizer->step();
    scheduler->Step();
  }
  for (const auto& item : model->named_parameters()) {
    const at::Tensor expected = Find(reference.contents.model, item.key());
    ASSERT_TRUE(expected.defined());
    EXPECT_TRUE(torch::equal(item.value(), expected))
        << item.key() << " differs from the uninterrupted Python run by up to "
        << (item.value() - expected).abs().max().item().toDouble();
  }
}

}  // namespace
}  // namespace ckpt
