// A Python team's training bundle through ckpt and back into real PyTorch: saved under
// nn.DataParallel with every tensor tagged cuda:1, imported with `ckpt import`, written back with
// `ckpt export --bundle`, `ckpt convert` and the loader service's Export RPC (a grpcio client
// with a bearer token), and resumed in Python -- parameters, buffers, optimizer and scheduler
// state bit-equal to a run that never stopped. Plus the round trip (an exported bundle imported
// again is the same version, every chunk deduplicated) and the bad inputs.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kScript[] = "tests/testdata/resume_bundle.py";
constexpr int kSteps = 6;      // before the bundle is saved.
constexpr int kMoreSteps = 5;  // after the resume.

using Result = testing::ShellResult;

std::string Dir() { return std::getenv("TEST_TMPDIR"); }
std::string Store() { return "--store_dir=" + Dir() + "/store"; }

Result Ckpt(const std::string& args) {
  return testing::RunShell(absl::StrCat(testing::RunfilesPath("tools/ckpt/ckpt"), " ", args));
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string Python(const std::string& args) {
  return testing::RunPythonOrAddFailure(kScript, args);
}

// `python resume FILE REFERENCE COMBO N M [--wrapped]` must print OK.
void ExpectResumesExactly(const std::string& file, const std::string& combo, bool wrapped) {
  EXPECT_THAT(Python(absl::StrCat("resume ", file, " ", Dir(), "/", combo, ".reference.pt ", combo,
                                  " ", kSteps, " ", kMoreSteps, wrapped ? " --wrapped" : "")),
              HasSubstr("OK"))
      << file;
}

// The manifest of MODEL@REF as `ckpt show --json` prints it, less what names this copy rather
// than its contents: version, commit time, aliases, the source file, and the device each tensor
// was on when saved (an export is a CPU file by design).
nlohmann::json Contents(const std::string& ref) {
  Result shown = Ckpt(absl::StrCat("show ", ref, " --json ", Store()));
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  nlohmann::json manifest =
      nlohmann::json::parse(shown.output, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(manifest.is_discarded()) << shown.output;
  manifest.erase("version");
  manifest.erase("aliases");
  manifest["metadata"].erase("created_unix_micros");
  manifest["metadata"]["labels"].erase("source_file");
  for (const char* table : {"tensors", "state_tensors"}) {
    for (nlohmann::json& meta : manifest[table]) meta.erase("original_device");
  }
  return manifest;
}

class BundleResumeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mkdir((Dir() + "/store").c_str(), 0755);
    for (const char* combo : {"sgd_step", "adam_cosine", "adamw_onecycle"}) {
      testing::RunPythonOrAddFailure(
          kScript, absl::StrCat("train ", Dir(), " ", combo, " ", kSteps, " ", kMoreSteps));
      Result imported =
          Ckpt(absl::StrCat("import ", Dir(), "/", combo, ".pt --model ", combo, " ", Store()));
      EXPECT_EQ(imported.exit_code, 0) << imported.output;
    }
  }
};

TEST_F(BundleResumeTest, ExportedBundlesResumeBitExactlyInPython) {
  for (const std::string combo : {"sgd_step", "adam_cosine", "adamw_onecycle"}) {
    SCOPED_TRACE(combo);
    // Canonical keys load into the bare model; module. keys into nn.DataParallel(model).
    const std::string bare = absl::StrCat(Dir(), "/", combo, "-bare.pt");
    Result exported = Ckpt(absl::StrCat("export ", combo, " ", bare, " --bundle ", Store()));
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_THAT(exported.output, HasSubstr("whole bundle"));
    ExpectResumesExactly(bare, combo, /*wrapped=*/false);

    const std::string wrapped = absl::StrCat(Dir(), "/", combo, "-ddp.pt");
    exported = Ckpt(
        absl::StrCat("export ", combo, " ", wrapped, " --bundle --key-prefix module. ", Store()));
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    ExpectResumesExactly(wrapped, combo, /*wrapped=*/true);

    // OneCycleLR's bound method is named as left out, never written as code; the rest resumes.
    if (combo == "adamw_onecycle") {
      EXPECT_THAT(exported.output,
                  HasSubstr("scheduler/anneal_func: a builtins.getattr object (never written "
                            "back as code)"));
    } else {
      EXPECT_THAT(exported.output, Not(HasSubstr("left out")));
    }
  }
}

TEST_F(BundleResumeTest, ConvertKeepsTheWholeBundle) {
  for (const std::string combo : {"sgd_step", "adam_cosine", "adamw_onecycle"}) {
    SCOPED_TRACE(combo);
    const std::string out = absl::StrCat(Dir(), "/", combo, "-converted.pt");
    Result converted = Ckpt(absl::StrCat("convert ", Dir(), "/", combo, ".pt ", out));
    ASSERT_EQ(converted.exit_code, 0) << converted.output;
    EXPECT_THAT(converted.output, HasSubstr("whole bundle"));
    ExpectResumesExactly(out, combo, /*wrapped=*/false);
  }
  // --model-only and safetensors give the weights alone and say what they left out.
  Result weights =
      Ckpt(absl::StrCat("convert ", Dir(), "/sgd_step.pt ", Dir(), "/weights.safetensors"));
  ASSERT_EQ(weights.exit_code, 0) << weights.output;
  EXPECT_THAT(weights.output, HasSubstr("optimizer: safetensors holds tensors only"));
  weights =
      Ckpt(absl::StrCat("convert ", Dir(), "/sgd_step.pt ", Dir(), "/weights.pt --model-only"));
  ASSERT_EQ(weights.exit_code, 0) << weights.output;
  EXPECT_THAT(weights.output, HasSubstr("scheduler: model weights only"));
}

TEST_F(BundleResumeTest, EveryExtraFieldKeepsItsPythonType) {
  const std::string exported = Dir() + "/extras-export.pt";
  ASSERT_EQ(Ckpt(absl::StrCat("export sgd_step ", exported, " --bundle ", Store())).exit_code, 0);
  EXPECT_THAT(Python("extras " + exported), HasSubstr("OK"));
  const std::string converted = Dir() + "/extras-convert.pt";
  ASSERT_EQ(Ckpt(absl::StrCat("convert ", Dir(), "/sgd_step.pt ", converted)).exit_code, 0);
  EXPECT_THAT(Python("extras " + converted), HasSubstr("OK"));
}

TEST_F(BundleResumeTest, ReimportingAnExportGivesTheSameVersionForFree) {
  // The producer's keys (module.) come back with --key-prefix module., so the re-import records
  // the same normalization, and every chunk is already in the store.
  const std::string exported = Dir() + "/roundtrip.pt";
  ASSERT_EQ(
      Ckpt(absl::StrCat("export sgd_step ", exported, " --bundle --key-prefix module. ", Store()))
          .exit_code,
      0);
  Result imported = Ckpt(absl::StrCat("import ", exported, " --model roundtrip ", Store()));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_THAT(imported.output, HasSubstr("0 B new after dedup"));
  nlohmann::json original = Contents("sgd_step@1");
  nlohmann::json again = Contents("roundtrip@1");
  original.erase("model");
  again.erase("model");
  EXPECT_EQ(original, again) << "original:\n"
                             << original.dump(1) << "\nre-imported:\n"
                             << again.dump(1);
  EXPECT_TRUE(original.contains("bundle_layout"));
}

TEST_F(BundleResumeTest, TheLoaderServiceExportsBundlesToAPythonClient) {
  const std::string dir = Dir() + "/loader";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  testing::WriteTextFile(dir + "/token", "tok-bundle\n");
  // A copy of the store: the loader holds its RocksDB lock while it runs.
  const std::string copy = dir + "/store";
  ASSERT_EQ(std::system(absl::StrCat("cp -r ", Dir(), "/store ", copy).c_str()), 0);
  testing::ChildProcess loader(testing::RunfilesPath("services/loader/loader"), dir);
  ASSERT_TRUE(
      loader.Start({"--store_dir=" + copy, "--listen=127.0.0.1:0", "--port_file=" + dir + "/port",
                    "--auth_token_file=" + dir + "/token", "--shutdown_grace=2s"}));
  const int port = loader.WaitForPort(dir + "/port", absl::Seconds(30));
  ASSERT_GT(port, 0) << loader.stderr_text();
  for (const std::string combo : {"sgd_step", "adamw_onecycle"}) {
    SCOPED_TRACE(combo);
    const std::string out = absl::StrCat(dir, "/", combo, "-rpc.pt");
    const std::string printed = Python(
        absl::StrCat("export 127.0.0.1:", port, " tok-bundle ", combo, " ", out, " ", dir, "/gen"));
    EXPECT_THAT(printed, HasSubstr("OK"));
    if (combo == "adamw_onecycle") {
      EXPECT_THAT(printed, HasSubstr("left out: scheduler/anneal_func"));
    }
    ExpectResumesExactly(out, combo, /*wrapped=*/false);
  }
  // The C++ client (RemoteLoader) behind `ckpt export --loader` gets the same bundle and report.
  const std::string out = dir + "/adamw_onecycle-cli.pt";
  Result exported =
      Ckpt(absl::StrCat("export adamw_onecycle ", out, " --bundle --loader=127.0.0.1:", port,
                        " --loader_auth_token_file=", dir, "/token"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("whole bundle"));
  EXPECT_THAT(exported.output, HasSubstr("scheduler/anneal_func: a builtins.getattr object"));
  ExpectResumesExactly(out, "adamw_onecycle", /*wrapped=*/false);
  loader.Signal(SIGTERM);
  EXPECT_TRUE(loader.WaitForExit(absl::Seconds(20)).has_value());
}

TEST_F(BundleResumeTest, BadRequestsFailClearlyAndLeaveNoFile) {
  // A subset would shift the optimizer's parameter positions.
  const std::string subset = Dir() + "/subset.pt";
  Result refused =
      Ckpt(absl::StrCat("export sgd_step ", subset, " --bundle --include 0. ", Store()));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("the subset keeps 2 of 9 model tensors"));
  EXPECT_THAT(refused.output, HasSubstr("leave the optimizer out of the export"));
  EXPECT_FALSE(Exists(subset));
  // Without the optimizer the same subset is fine.
  Result weights = Ckpt(
      absl::StrCat("export sgd_step ", subset, " --bundle --no-optimizer --include 0. ", Store()));
  EXPECT_EQ(weights.exit_code, 0) << weights.output;
  EXPECT_THAT(weights.output, HasSubstr("optimizer: not asked for"));

  // A bundle that holds no model: convert writes it as it is; import, which stores a model,
  // refuses it saying what it found.
  ASSERT_THAT(Python("nomodel " + Dir() + "/nomodel.pt"), HasSubstr("OK"));
  const std::string converted = Dir() + "/nomodel-out.pt";
  Result as_is = Ckpt(absl::StrCat("convert ", Dir(), "/nomodel.pt ", converted));
  EXPECT_EQ(as_is.exit_code, 0) << as_is.output;
  EXPECT_THAT(as_is.output, HasSubstr("the root, a dict of 3 entries with no model state dict"));
  EXPECT_TRUE(Exists(converted));
  refused = Ckpt(absl::StrCat("import ", Dir(), "/nomodel.pt --model nomodel ", Store()));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("no model state dict in the checkpoint (a dict with keys "
                                        "'epoch', 'optimizer', 'best_acc')"));

  // A version without optimizer state asked for as a bundle.
  ASSERT_EQ(Ckpt(absl::StrCat("convert ", Dir(), "/sgd_step.pt ", Dir(),
                              "/weights-only.pt "
                              "--model-only"))
                .exit_code,
            0);
  ASSERT_EQ(
      Ckpt(absl::StrCat("import ", Dir(), "/weights-only.pt --model weights ", Store())).exit_code,
      0);
  // Written without the optimizer, as without a scheduler, and the output says why.
  const std::string bundle = Dir() + "/weights-bundle.pt";
  Result without = Ckpt(absl::StrCat("export weights ", bundle, " --bundle ", Store()));
  EXPECT_EQ(without.exit_code, 0) << without.output;
  EXPECT_THAT(without.output, HasSubstr("optimizer: weights@1 holds none (saved without one)"));
  EXPECT_TRUE(Exists(bundle));
  refused = Ckpt(absl::StrCat("export sgd_step ", Dir(), "/x.safetensors --bundle ", Store()));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("--bundle needs the torch format"));
}

}  // namespace
}  // namespace ckpt
