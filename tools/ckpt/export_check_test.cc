// `ckpt export` and `ckpt check` as users run them: on a version imported from a DDP checkpoint
// real PyTorch saved on cuda:1, embedded (--store_dir), against a checkpoint_store server
// (--store) and through a loader server (--loader); exports read back by real PyTorch.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/testing/child_process.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr char kFixtures[] = "libs/format/testdata/checkpoint_fixtures.py";

using Result = testing::ShellResult;
using testing::RunShell;

std::string Dir() { return std::getenv("TEST_TMPDIR"); }

Result Ckpt(const std::string& args) { return RunShell("tools/ckpt/ckpt " + args); }

// A server binary started with `args`, its port read from the --port_file it is given; SIGTERM
// and reaped when the test ends.
class Server {
 public:
  Server(const std::string& binary, std::vector<std::string> args, const std::string& port_file) {
    args.push_back("--port_file=" + port_file);
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv = {const_cast<char*>(binary.c_str())};
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    for (absl::Time deadline = absl::Now() + absl::Seconds(60);
         absl::Now() < deadline && port_ == 0;) {
      std::ifstream in(port_file);
      if (!(in >> port_)) absl::SleepFor(absl::Milliseconds(10));  // written once serving.
    }
  }
  ~Server() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

class ExportCheckTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::ckpt::testing::RunPythonOrAddFailure(kFixtures, "make " + Dir());
  }
};

TEST_F(ExportCheckTest, EmbeddedExportsLoadInPythonAndCheckReportsFit) {
  const std::string store = "--store_dir=" + Dir() + "/embedded";
  Result imported = Ckpt(absl::StrCat("import ", Dir(), "/ddp_cuda1.pt --model mlp ", store));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;

  const std::string pt = Dir() + "/mlp.pt";
  Result exported = Ckpt(absl::StrCat("export mlp@1 ", pt, " ", store));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("exported mlp@1 to " + pt + " (torch)"));
  EXPECT_EQ(::ckpt::testing::RunPythonOrAddFailure(kFixtures,
                                                   absl::StrCat("verify_torch ", pt, " ", Dir())),
            "OK\n");

  const std::string st = Dir() + "/mlp.st";
  Result safetensors = Ckpt(absl::StrCat("export mlp ", st, " --format safetensors ", store));
  ASSERT_EQ(safetensors.exit_code, 0) << safetensors.output;
  EXPECT_EQ(::ckpt::testing::RunPythonOrAddFailure(
                kFixtures, absl::StrCat("verify_safetensors ", st, " ", Dir())),
            "OK\n");

  // The stored version fits the unwrapped reference, not a "module."-prefixed consumer.
  Result fits = Ckpt(absl::StrCat("check mlp@1 --against ", Dir(), "/reference.pt ", store));
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_THAT(fits.output, HasSubstr("mlp@1 fits"));
  Result unfit = Ckpt(absl::StrCat("check mlp@1 --against ", Dir(), "/ddp_cuda1.pt ", store));
  EXPECT_EQ(unfit.exit_code, 1) << unfit.output;
  EXPECT_THAT(unfit.output, HasSubstr("Every key matches under prefix \"module.\""));
  EXPECT_EQ(Ckpt(absl::StrCat("check mlp@1 --key-prefix module. --against ", Dir(),
                              "/ddp_cuda1.pt ", store))
                .exit_code,
            0);

  // A bf16, DDP-keyed subset: checked against itself it fits under the same options.
  const std::string subset = Dir() + "/subset.pt";
  Result cast = Ckpt(absl::StrCat("export mlp@1 ", subset,
                                  " --dtype bf16 --key-prefix module. --include 0.,3. ", store));
  ASSERT_EQ(cast.exit_code, 0) << cast.output;
  Result inspected = Ckpt("inspect " + subset);
  EXPECT_THAT(inspected.output, HasSubstr("module.0.weight"));
  EXPECT_THAT(inspected.output, HasSubstr("bfloat16"));
  EXPECT_THAT(inspected.output, ::testing::Not(HasSubstr("running_mean")));
  EXPECT_EQ(Ckpt(absl::StrCat("check mlp@1 --key-prefix module. --include 0.,3. --against ", subset,
                              " ", store))
                .exit_code,
            0);

  Result bad = Ckpt(absl::StrCat("export mlp@1 ", Dir(), "/x.bin ", store));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("--format torch|safetensors"));
  Result absent = Ckpt(absl::StrCat("export nope@1 ", pt, " ", store));
  EXPECT_EQ(absent.exit_code, 1);
  EXPECT_THAT(absent.output, HasSubstr("NOT_FOUND"));
}

TEST_F(ExportCheckTest, ShardedSafetensorsExportAndImportWhole) {
  const std::string store = "--store_dir=" + Dir() + "/sharding";
  Result imported = Ckpt(absl::StrCat("import ", Dir(), "/ddp_cuda1.pt --model mlp ", store));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;

  // 100-byte shards: 0.weight (128 bytes) alone, the rest several to a shard.
  const std::string dir = Dir() + "/mlp-hf";
  Result exported = Ckpt(absl::StrCat("export mlp@1 ", dir, " --max-shard-size 100 ", store));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("(safetensors, 5 shards)"));
  EXPECT_THAT(exported.output, HasSubstr(dir + "/model-00005-of-00005.safetensors"));
  EXPECT_THAT(exported.output, HasSubstr(dir + "/model.safetensors.index.json"));

  // The directory imports as one state dict, equal to what real PyTorch saved.
  Result again = Ckpt(absl::StrCat("import ", dir, " --model again ", store));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("(safetensors)"));
  const std::string st = Dir() + "/again.safetensors";
  ASSERT_EQ(Ckpt(absl::StrCat("export again@1 ", st, " ", store)).exit_code, 0);
  EXPECT_EQ(::ckpt::testing::RunPythonOrAddFailure(
                kFixtures, absl::StrCat("verify_safetensors ", st, " ", Dir())),
            "OK\n");
  Result inspected = Ckpt(absl::StrCat("inspect ", dir, "/model.safetensors.index.json"));
  EXPECT_EQ(inspected.exit_code, 0) << inspected.output;
  EXPECT_THAT(inspected.output, HasSubstr("0.weight"));

  // A missing shard is named, and nothing is imported.
  ASSERT_EQ(std::remove((dir + "/model-00003-of-00005.safetensors").c_str()), 0);
  Result broken = Ckpt(absl::StrCat("import ", dir, " --model broken ", store));
  EXPECT_EQ(broken.exit_code, 1);
  EXPECT_THAT(broken.output, HasSubstr("model-00003-of-00005.safetensors, which is missing"));

  Result torch = Ckpt(absl::StrCat("export mlp@1 ", Dir(), "/x.pt --max-shard-size 1KB ", store));
  EXPECT_EQ(torch.exit_code, 1);
  EXPECT_THAT(torch.output, HasSubstr("safetensors exports only"));
  Result bad_size = Ckpt(absl::StrCat("export mlp@1 ", dir, " --max-shard-size 5XB ", store));
  EXPECT_EQ(bad_size.exit_code, 1);
  EXPECT_THAT(bad_size.output, HasSubstr("not a positive size"));
}

TEST_F(ExportCheckTest, RemoteStoreAndLoaderServer) {
  const std::string token_file = Dir() + "/token";
  std::ofstream(token_file) << "tok-7\n";
  Server store("services/checkpoint_store/checkpoint_store",
               {"--store_dir=" + Dir() + "/served", "--auth_token_file=" + token_file},
               Dir() + "/store_port");
  ASSERT_GT(store.port(), 0);
  const std::string remote =
      absl::StrCat("--store=", store.address(), " --store_auth_token_file=", token_file);
  Result imported = Ckpt(absl::StrCat("import ", Dir(), "/ddp_cuda1.pt --model mlp ", remote));
  ASSERT_EQ(imported.exit_code, 0) << imported.output;

  const std::string pt = Dir() + "/remote.pt";
  Result exported = Ckpt(absl::StrCat("export mlp@1 ", pt, " ", remote));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(::ckpt::testing::RunPythonOrAddFailure(kFixtures,
                                                   absl::StrCat("verify_torch ", pt, " ", Dir())),
            "OK\n");
  EXPECT_EQ(Ckpt(absl::StrCat("check mlp --against ", Dir(), "/reference.pt ", remote)).exit_code,
            0);

  // The loader in front of the store, with the same token on both hops.
  Server loader("services/loader/loader",
                {"--store=" + store.address(), "--store_auth_token_file=" + token_file,
                 "--auth_token_file=" + token_file},
                Dir() + "/loader_port");
  ASSERT_GT(loader.port(), 0);
  const std::string via_loader =
      absl::StrCat("--loader=", loader.address(), " --loader_auth_token_file=", token_file);
  const std::string st = Dir() + "/via_loader.safetensors";
  Result streamed = Ckpt(absl::StrCat("export mlp@1 ", st, " ", via_loader));
  ASSERT_EQ(streamed.exit_code, 0) << streamed.output;
  EXPECT_EQ(::ckpt::testing::RunPythonOrAddFailure(
                kFixtures, absl::StrCat("verify_safetensors ", st, " ", Dir())),
            "OK\n");
  Result sharded = Ckpt(
      absl::StrCat("export mlp@1 ", Dir(), "/via_loader_hf --max-shard-size 100 ", via_loader));
  EXPECT_EQ(sharded.exit_code, 1);
  EXPECT_THAT(sharded.output, HasSubstr("cannot stream"));
  Result checked =
      Ckpt(absl::StrCat("check mlp@1 --against ", Dir(), "/ddp_cuda1.pt ", via_loader));
  EXPECT_EQ(checked.exit_code, 1) << checked.output;
  EXPECT_THAT(checked.output, HasSubstr("does not fit"));

  // The example program other teams copy: a DDP-style module, "module." keys suggested, loaded.
  Result example =
      RunShell(absl::StrCat("tools/examples/load_from_loader --loader=", loader.address(),
                            " --auth_token=tok-7 --ref=mlp@1 --ddp"));
  EXPECT_EQ(example.exit_code, 0) << example.output;
  EXPECT_THAT(example.output, HasSubstr("loaded mlp@1: 9 tensors onto cpu"));
}

}  // namespace
}  // namespace ckpt
