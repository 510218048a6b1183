// ReadCheckpointFile, InspectCheckpoint and ConvertCheckpoint on files real PyTorch wrote, with
// PyTorch checking what convert writes.

#include "libs/format/convert.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/inspect.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Dir() { return std::string(std::getenv("TEST_TMPDIR")); }

std::string RunFixtures(const std::string& args) {
  return ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/checkpoint_fixtures.py",
                                                args);
}

class ConvertTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { RunFixtures("make " + Dir()); }
};

// A broadcast view claims far more memory than the file holds; it is refused before anything
// materializes it, naming the tensor, its claimed size and the budget. Within the budget it reads.
TEST_F(ConvertTest, RefusesATensorWhoseClaimedShapeExceedsTheMemoryBudget) {
  const std::string in = Dir() + "/expanded.pt";
  const auto refused =
      StatusIs(absl::StatusCode::kResourceExhausted,
               ::testing::AllOf(
                   HasSubstr("expanded.pt"), HasSubstr("'w'"), HasSubstr("[1000000000000]"),
                   HasSubstr("would take 4000000000000 bytes"), HasSubstr("max_expanded_bytes")));
  EXPECT_THAT(ReadCheckpointFile(in), refused);  // the default: this host's physical memory.
  EXPECT_THAT(ConvertCheckpoint(in, Dir() + "/expanded.safetensors", {}), refused);
  EXPECT_EQ(std::fopen((Dir() + "/expanded.safetensors").c_str(), "rb"), nullptr);

  ReadCheckpointOptions small;
  small.max_expanded_bytes = 1 << 20;
  EXPECT_THAT(ReadCheckpointFile(Dir() + "/expanded_small.pt", small),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("would take 4000000")));
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/expanded_small.pt"));
  const at::Tensor* w = file.bundle.model.Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->numel(), 1000000);
  EXPECT_EQ(w->contiguous().sum().item<float>(), 1e6f);
}

// This process's resident set (VmRSS) and its peak since the last reset (VmHWM), in bytes.
std::pair<int64_t, int64_t> ResidentAndPeak() {
  int64_t rss = 0, peak = 0;
  if (FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kib = 0;
    while (std::fgets(line, sizeof(line), status) != nullptr) {
      if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) rss = kib * 1024;
      if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) peak = kib * 1024;
    }
    std::fclose(status);
  }
  return {rss, peak};
}

// What a hostile rerun got through the per-tensor budget (#38): files of a few KB whose views
// expand to gigabytes, together or one at a time. The whole file's expansion is refused before
// anything is allocated or written: no output file, and the peak resident set grows by less
// than 100 MB.
TEST_F(ConvertTest, RefusesTinyFilesThatExpandToGigabytesBeforeAllocatingOrWriting) {
  struct Hostile {
    std::string name;
    int64_t budget;  // 0: the default, 1/8 of the available memory
    std::string expansion;
  };
  // The as_strided file expands by 3.7 GiB, which the default refuses on a machine with less
  // than ~30 GiB available (this one: 24 GiB in all); it is checked at 1 GiB everywhere.
  for (const Hostile& hostile : {Hostile{"hostile_eight_broadcasts", 0, "31999999968 bytes more"},
                                 Hostile{"hostile_as_strided", int64_t{1} << 30, "3999999960"},
                                 Hostile{"hostile_one_broadcast", 0, "23999999996 bytes more"}}) {
    SCOPED_TRACE(hostile.name);
    const std::string in = Dir() + "/" + hostile.name + ".pt";
    const std::string out = Dir() + "/" + hostile.name + ".safetensors";
    {
      std::FILE* reset = std::fopen("/proc/self/clear_refs", "w");
      ASSERT_NE(reset, nullptr);
      std::fputs("5", reset);  // VmHWM := VmRSS
      std::fclose(reset);
    }
    const int64_t before = ResidentAndPeak().first;
    ConvertOptions options;
    options.max_expanded_bytes = hostile.budget;
    EXPECT_THAT(
        ConvertCheckpoint(in, out, options),
        StatusIs(absl::StatusCode::kResourceExhausted,
                 ::testing::AllOf(HasSubstr(hostile.expansion), HasSubstr("expansion budget"),
                                  HasSubstr("refused before allocating or writing"))));
    EXPECT_EQ(std::fopen(out.c_str(), "rb"), nullptr);
    EXPECT_LT(ResidentAndPeak().second - before, int64_t{100} << 20);
    // inspect still reads it (it never materializes) and says what it would expand to.
    ReadCheckpointOptions unlimited;
    unlimited.max_expanded_bytes = -1;
    ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(in, unlimited));
    const nlohmann::ordered_json report = InspectCheckpoint(file);
    EXPECT_THAT(report["expansion"]["bytes"].dump(), HasSubstr(hostile.expansion.substr(0, 9)));
    EXPECT_THAT(RenderInspectText(report),
                ::testing::AllOf(HasSubstr("expands: "), HasSubstr("wider than their storage")));
  }
}

TEST_F(ConvertTest, ReadsADdpCheckpointSavedOnCuda1OnThisCpuMachine) {
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/ddp_cuda1.pt"));
  EXPECT_EQ(file.format, CheckpointFormat::kTorchZip);
  ASSERT_EQ(file.bundle.model.size(), 9u);
  EXPECT_EQ(file.bundle.model.entry(0).key, "module.0.weight");
  for (const StateDict::Entry& entry : file.bundle.model) {
    EXPECT_EQ(entry.original_device, "cuda:1") << entry.key;
    EXPECT_TRUE(entry.tensor.device().is_cpu());
  }
}

TEST_F(ConvertTest, DdpOnCuda1BecomesACleanStateDictPythonLoadsStrictly) {
  const std::string out = Dir() + "/clean.pt";
  ASSERT_OK_AND_ASSIGN(ConvertReport report,
                       ConvertCheckpoint(Dir() + "/ddp_cuda1.pt", out, ConvertOptions()));
  EXPECT_EQ(report.format, "torch");
  EXPECT_EQ(report.stripped_prefix, "module.");
  EXPECT_EQ(report.tensors, 9u);
  EXPECT_EQ(RunFixtures("verify_torch " + out + " " + Dir()), "OK\n");
  // Torch to torch keeps the model's key order.
  ASSERT_OK_AND_ASSIGN(CheckpointFile converted, ReadCheckpointFile(out));
  EXPECT_EQ(converted.bundle.model.entry(0).key, "0.weight");
  EXPECT_EQ(converted.bundle.model.entry(6).key, "1.num_batches_tracked");
}

TEST_F(ConvertTest, BundleModelToSafetensorsLeavesTheRestOutAndSaysSo) {
  const std::string out = Dir() + "/model.safetensors";
  ASSERT_OK_AND_ASSIGN(ConvertReport report,
                       ConvertCheckpoint(Dir() + "/bundle.pt", out, ConvertOptions()));
  EXPECT_EQ(report.format, "safetensors");
  EXPECT_THAT(report.left_out,
              ElementsAre(::testing::StartsWith("optimizer: safetensors holds tensors only"),
                          ::testing::StartsWith("scheduler: "), ::testing::StartsWith("epoch: "),
                          ::testing::StartsWith("best_acc: ")));
  EXPECT_EQ(RunFixtures("verify_safetensors " + out + " " + Dir()), "OK\n");
  // And back: safetensors in, torch out, still loads strictly.
  const std::string back = Dir() + "/back.pt";
  ASSERT_OK(ConvertCheckpoint(out, back, ConvertOptions()).status());
  EXPECT_EQ(RunFixtures("verify_torch " + back + " " + Dir()), "OK\n");
}

TEST_F(ConvertTest, LegacyFilesConvertToo) {
  const std::string out = Dir() + "/from_legacy.pt";
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/legacy.pt"));
  EXPECT_EQ(file.format, CheckpointFormat::kTorchLegacy);
  ASSERT_OK(ConvertCheckpoint(Dir() + "/legacy.pt", out, ConvertOptions()).status());
  EXPECT_EQ(RunFixtures("verify_torch " + out + " " + Dir()), "OK\n");
}

TEST_F(ConvertTest, PrefixOptions) {
  ConvertOptions keep;
  keep.strip_prefix = "none";
  keep.add_prefix = "wrapped";
  const std::string out = Dir() + "/prefixed.pt";
  ASSERT_OK(ConvertCheckpoint(Dir() + "/ddp_cuda1.pt", out, keep).status());
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(out));
  EXPECT_EQ(file.bundle.model.entry(0).key, "wrapped.module.0.weight");

  ConvertOptions exact;
  exact.strip_prefix = "module.";
  exact.model_key = "model";
  ASSERT_OK(ConvertCheckpoint(Dir() + "/bundle.pt", out, exact).status());
  EXPECT_EQ(RunFixtures("verify_torch " + out + " " + Dir()), "OK\n");

  ConvertOptions wrong;
  wrong.strip_prefix = "encoder.";
  EXPECT_THAT(ConvertCheckpoint(Dir() + "/ddp_cuda1.pt", out, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "key 'module.0.weight' does not start with the prefix 'encoder.'"));
  ConvertOptions bad_format;
  bad_format.format = "onnx";
  EXPECT_THAT(ConvertCheckpoint(Dir() + "/ddp_cuda1.pt", out, bad_format),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown format 'onnx'"));
  ConvertOptions bad_key;
  bad_key.model_key = "weights";
  EXPECT_THAT(ConvertCheckpoint(Dir() + "/bundle.pt", out, bad_key),
              StatusIs(absl::StatusCode::kNotFound, "keys there: 'epoch', 'model'"));
}

TEST_F(ConvertTest, InspectDescribesTheBundle) {
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/bundle.pt"));
  const nlohmann::ordered_json report = InspectCheckpoint(file);
  EXPECT_EQ(report["format"], "torch_zip");
  EXPECT_EQ(report["epoch"], 3);
  EXPECT_EQ(report["model"]["key_path"], "model");
  EXPECT_EQ(report["model"]["tensors"], 9);
  EXPECT_EQ(report["model"]["wrapper_prefix"], "module.");
  EXPECT_EQ(report["model"]["dtypes"]["int64"], 1);
  EXPECT_EQ(report["model"]["entries"][0]["shape"], nlohmann::ordered_json::array({8, 4}));
  EXPECT_EQ(report["optimizer"]["param_groups"].size(), 1u);
  EXPECT_EQ(report["optimizer"]["param_groups"][0]["params"], 6);
  EXPECT_EQ(report["optimizer"]["param_groups"][0]["lr"], 0.001);
  EXPECT_EQ(report["optimizer"]["state_fields"],
            nlohmann::ordered_json::array({"exp_avg", "exp_avg_sq", "step"}));
  EXPECT_EQ(report["scheduler"]["step_size"], 2);
  EXPECT_EQ(report["other_entries"]["best_acc"], 0.5);

  const std::string text = RenderInspectText(report);
  EXPECT_THAT(text, HasSubstr("model state dict at 'model': 9 tensors"));
  EXPECT_THAT(text, HasSubstr("wrapper prefix: 'module.' (ddp)"));
  EXPECT_THAT(text, HasSubstr("module.1.num_batches_tracked"));
  EXPECT_THAT(text, HasSubstr("optimizer: 1 param group(s), 6 parameter states"));
  EXPECT_THAT(text, HasSubstr("step_size=2"));
}

// Roots that hold no state dict: inspect describes them and convert writes them as they are;
// reading for import says what it needs and how --key reaches inside.
TEST_F(ConvertTest, RootsThatAreNoStateDictAreDescribedAndConvertedAsTheyAre) {
  ReadCheckpointOptions any_root;
  any_root.allow_no_model = true;
  ASSERT_OK_AND_ASSIGN(CheckpointFile list, ReadCheckpointFile(Dir() + "/root_list.pt", any_root));
  EXPECT_FALSE(list.has_model);
  const nlohmann::ordered_json report = InspectCheckpoint(list);
  EXPECT_TRUE(report["model"].is_null());
  EXPECT_EQ(report["root"]["kind"], "a list of 2 items");
  ASSERT_EQ(report["root"]["tensors"].size(), 2u);
  EXPECT_EQ(report["root"]["tensors"][1]["path"], "1");
  EXPECT_EQ(report["root"]["tensors"][1]["dtype"], "int64");
  EXPECT_THAT(RenderInspectText(report), HasSubstr("no model state dict: the root is a list"));

  ASSERT_OK_AND_ASSIGN(CheckpointFile tensor,
                       ReadCheckpointFile(Dir() + "/root_tensor.pt", any_root));
  EXPECT_EQ(InspectCheckpoint(tensor)["root"]["kind"], "a tensor");
  ASSERT_OK_AND_ASSIGN(CheckpointFile plain,
                       ReadCheckpointFile(Dir() + "/root_plain.pt", any_root));
  EXPECT_THAT(RenderInspectText(InspectCheckpoint(plain)), HasSubstr("values: "));

  // convert: the list back as a list (torch checks), a bare tensor to safetensors as "tensor".
  const std::string out = Dir() + "/root_list_out.pt";
  ASSERT_OK_AND_ASSIGN(ConvertReport converted,
                       ConvertCheckpoint(Dir() + "/root_list.pt", out, {}));
  EXPECT_EQ(converted.plain_root, "a list of 2 items");
  EXPECT_EQ(converted.tensors, 2u);
  EXPECT_EQ(RunFixtures(absl::StrCat("verify_root ", out, " ", Dir())), "OK\n");
  ASSERT_OK_AND_ASSIGN(converted, ConvertCheckpoint(Dir() + "/root_tensor.pt",
                                                    Dir() + "/root_tensor.safetensors", {}));
  ASSERT_OK_AND_ASSIGN(CheckpointFile back, ReadCheckpointFile(Dir() + "/root_tensor.safetensors"));
  ASSERT_NE(back.bundle.model.Find("tensor"), nullptr);
  EXPECT_EQ(back.bundle.model.Find("tensor")->sizes().vec(), (std::vector<int64_t>{3, 4}));
  EXPECT_THAT(ConvertCheckpoint(Dir() + "/root_plain.pt", Dir() + "/plain.safetensors", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds no tensor"));

  // For import (no allow_no_model): what it needs, and --key into the list.
  EXPECT_THAT(ReadCheckpointFile(Dir() + "/root_list.pt"),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr("no model state dict"),
                                        HasSubstr("--key PATH names the state dict inside it"))));
  ReadCheckpointOptions first;
  first.model_key = "0";
  EXPECT_THAT(ReadCheckpointFile(Dir() + "/root_list.pt", first),
              StatusIs(absl::StatusCode::kInvalidArgument, "'0' is not a model state dict"));
}

// Meta tensors, which ckpt does not store, are named as what they are.
TEST_F(ConvertTest, MetaTensorsAreNamedInRefusals) {
  EXPECT_THAT(ReadCheckpointFile(Dir() + "/meta.pt"),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr("a meta tensor: shape only"),
                                        HasSubstr("give meta tensors real storage"))));
  ReadCheckpointOptions any_root;
  any_root.allow_no_model = true;
  ASSERT_OK_AND_ASSIGN(CheckpointFile meta, ReadCheckpointFile(Dir() + "/meta.pt", any_root));
  EXPECT_THAT(RenderInspectText(InspectCheckpoint(meta)), HasSubstr("w: a meta tensor"));
}

// Sparse tensors (COO, an uncoalesced hybrid COO, CSR with int32 indices) read in their layout,
// inspect says which, and convert writes them back as torch.save does: torch loads them with
// weights_only=True, indices and values equal. safetensors refuses them by name.
TEST_F(ConvertTest, SparseTensorsReadAndConvertBackInTheirLayout) {
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/sparse.pt"));
  ASSERT_EQ(file.bundle.model.size(), 4u);
  EXPECT_TRUE(file.bundle.model.Find("w")->is_sparse());
  EXPECT_FALSE(file.bundle.model.Find("hybrid")->is_coalesced());
  EXPECT_EQ(file.bundle.model.Find("csr")->layout(), at::kSparseCsr);
  EXPECT_EQ(file.bundle.model.Find("csr")->crow_indices().scalar_type(), at::kInt);
  const std::string text = RenderInspectText(InspectCheckpoint(file));
  EXPECT_THAT(text, HasSubstr("[3, 3] sparse_coo"));
  EXPECT_THAT(text, HasSubstr("[3, 4] sparse_csr"));

  ASSERT_OK(ConvertCheckpoint(Dir() + "/sparse.pt", Dir() + "/sparse_out.pt", {}).status());
  EXPECT_EQ(RunFixtures("verify_sparse " + Dir() + "/sparse_out.pt " + Dir()), "OK\n");
  EXPECT_THAT(ConvertCheckpoint(Dir() + "/sparse.pt", Dir() + "/sparse.safetensors", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("'w' is a sparse_coo tensor"),
                                        HasSubstr("safetensors holds dense tensors only"))));
}

TEST_F(ConvertTest, AnEmptyStorageViewedAsTwoDtypesReads) {
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/empty_two_dtypes.pt"));
  ASSERT_EQ(file.bundle.model.size(), 3u);
  EXPECT_EQ(file.bundle.model.Find("a")->scalar_type(), at::kFloat);
  EXPECT_EQ(file.bundle.model.Find("b")->scalar_type(), at::kInt);
  EXPECT_EQ(file.bundle.model.Find("b")->numel(), 0);
  ASSERT_OK(ConvertCheckpoint(Dir() + "/empty_two_dtypes.pt", Dir() + "/empty_out.pt", {})
                .status());
}

TEST_F(ConvertTest, RefusesFilesThatAreNotCheckpoints) {
  const std::string path = Dir() + "/notes.txt";
  FILE* f = fopen(path.c_str(), "w");
  fputs("hello, not a checkpoint", f);
  fclose(f);
  EXPECT_THAT(ReadCheckpointFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, "notes.txt: not a checkpoint"));
  EXPECT_THAT(ReadCheckpointFile(Dir() + "/missing.pt"), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt
