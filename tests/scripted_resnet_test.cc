// A team's real architecture end to end: torchvision's ResNet-18, torch.jit.script'ed in Python,
// read by `ckpt` as a checkpoint without running its code, trained by //services/trainer with
// two Gloo ranks on shard files, and exported back into torchvision's class (Python checks in
// tests/testdata/scripted_resnet.py).

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"
#include "tests/testing/trainer_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::LossLines;
using ::ckpt::testing::ReadFile;
using ::ckpt::testing::RunShell;
using ::ckpt::testing::RunTrainer;
using ::ckpt::testing::ShellResult;
using ::ckpt::testing::TempPath;
using ::testing::HasSubstr;

constexpr char kScript[] = "tests/testdata/scripted_resnet.py";

// The team's side, written once for the whole binary.
const std::string& Team() { return ckpt::testing::TeamDir(kScript); }

TEST(ScriptedResNetTest, CkptReadsTheArchiveAsItsStateDictWithoutRunningIt) {
  const std::string archive = Team() + "/resnet18.ts";
  const ShellResult inspect = RunShell("tools/ckpt/ckpt inspect " + archive + " 2>&1");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_THAT(inspect.output, HasSubstr("torchscript"));
  EXPECT_THAT(inspect.output, HasSubstr("model state dict: 122 tensors"));
  EXPECT_THAT(inspect.output, HasSubstr("layer4.1.bn2.num_batches_tracked"));

  const std::string converted = TempPath("resnet18_weights.pt");
  const ShellResult convert =
      RunShell(absl::StrCat("tools/ckpt/ckpt convert ", archive, " ", converted, " 2>&1"));
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  std::cerr << ckpt::testing::RunPythonOrAddFailure(
      kScript, absl::StrCat("check-convert ", Team(), " ", converted));
}

TEST(ScriptedResNetTest, TwoRanksTrainItOnShardsAndItLoadsBackIntoTorchvision) {
  const std::string store = TempPath("store");
  const std::vector<std::string> flags = {"--store_dir=" + store,
                                          "--model=torchscript:" + Team() + "/resnet18.ts",
                                          "--data=shards:" + Team() + "/shards",
                                          "--nproc_per_node=2",
                                          "--batch_size=8",
                                          "--steps=24",
                                          "--optimizer=adamw",
                                          "--lr=0.001",
                                          "--log_every=4",
                                          "--checkpoint_every=0"};
  ASSERT_EQ(RunTrainer(flags, store + ".log"), 0) << ReadFile(store + ".log");
  const std::string log = ReadFile(store + ".log");
  const std::vector<std::pair<int64_t, double>> losses = LossLines(log);
  ASSERT_GE(losses.size(), 3u) << log;
  // 10 classes: ln(10) = 2.3 at the start; the prototypes are learnable within 24 steps.
  EXPECT_LT(losses.back().second, 0.5 * losses.front().second) << log;

  const std::string exported = TempPath("resnet18_trained.pt");
  const ShellResult result = RunShell(absl::StrCat("tools/ckpt/ckpt --store_dir=", store,
                                                   " export resnet18-shards ", exported, " 2>&1"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::cerr << ckpt::testing::RunPythonOrAddFailure(
      kScript, absl::StrCat("check-export ", Team(), " ", exported));
}

}  // namespace
}  // namespace ckpt
