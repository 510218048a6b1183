#include "libs/train/dataset.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/cdist.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/tensor.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::RunPythonOrAddFailure;
using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// Runs a Python snippet (real torch 1.13) through a script file.
void RunPythonSnippet(const std::string& name, const std::string& code) {
  const std::string script = TmpPath(name + ".py");
  std::ofstream(script) << code;
  RunPythonOrAddFailure(script, "");
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

DataSpec Synthetic(const std::string& model_kind, uint64_t seed = 1234) {
  DataSpec spec;
  spec.model_kind = model_kind;
  spec.synthetic_examples = 256;
  spec.seed = seed;
  return spec;
}

TEST(DatasetTest, SyntheticImagesAreDeterministicPerSeed) {
  ASSERT_OK_AND_ASSIGN(auto a, OpenDataset(Synthetic("mlp")));
  ASSERT_OK_AND_ASSIGN(auto b, OpenDataset(Synthetic("cnn")));
  ASSERT_OK_AND_ASSIGN(auto c, OpenDataset(Synthetic("mlp", /*seed=*/99)));
  EXPECT_EQ(a->size(), 256);
  EXPECT_THAT(a->example_shape(), ElementsAre(1, 12, 12));
  EXPECT_EQ(a->input_kind(), InputKind::kFeatures);
  EXPECT_EQ(a->num_classes(), 10);
  EXPECT_EQ(a->Describe(), "synthetic: 256 examples of [1,12,12], 10 classes");

  Batch ba = a->Get({3, 0, 200});
  Batch bb = b->Get({3, 0, 200});
  Batch bc = c->Get({3, 0, 200});
  EXPECT_EQ(ba.inputs.sizes().vec(), (std::vector<int64_t>{3, 1, 12, 12}));
  EXPECT_EQ(ba.inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(ba.targets.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ba.inputs, bb.inputs));
  EXPECT_TRUE(at::equal(ba.targets, bb.targets));
  EXPECT_FALSE(at::equal(ba.inputs, bc.inputs));
  // Get() of a subset gives the same rows as a bigger batch.
  EXPECT_TRUE(at::equal(a->Get({0}).inputs[0], ba.inputs[1]));
}

TEST(DatasetTest, SyntheticImagesAreLearnable) {
  // Nearest class mean (fitted on the first half) classifies the second half far above chance:
  // the task has signal, so a model's loss can fall.
  ASSERT_OK_AND_ASSIGN(auto data, OpenDataset(Synthetic("mlp")));
  std::vector<int64_t> all(256);
  for (int64_t i = 0; i < 256; ++i) all[i] = i;
  Batch batch = data->Get(all);
  at::Tensor x = batch.inputs.flatten(1);
  at::Tensor train_x = x.slice(0, 0, 128), test_x = x.slice(0, 128);
  at::Tensor train_y = batch.targets.slice(0, 0, 128), test_y = batch.targets.slice(0, 128);
  at::Tensor means = at::zeros({10, x.size(1)});
  for (int64_t k = 0; k < 10; ++k) {
    at::Tensor rows = train_x.index({train_y == k});
    if (rows.size(0) > 0) means[k] = rows.mean(0);
  }
  at::Tensor predicted = at::cdist(test_x, means).argmin(1);
  const double accuracy = (predicted == test_y).to(at::kFloat).mean().item<double>();
  EXPECT_GT(accuracy, 0.8);
}

TEST(DatasetTest, SyntheticTokensFollowTheirClass) {
  ASSERT_OK_AND_ASSIGN(auto a, OpenDataset(Synthetic("transformer")));
  ASSERT_OK_AND_ASSIGN(auto b, OpenDataset(Synthetic("transformer")));
  ASSERT_OK_AND_ASSIGN(auto c, OpenDataset(Synthetic("transformer", /*seed=*/5)));
  EXPECT_THAT(a->example_shape(), ElementsAre(16));
  EXPECT_EQ(a->input_kind(), InputKind::kTokens);
  EXPECT_EQ(a->vocab_size(), 32);
  EXPECT_EQ(a->Describe(), "synthetic: 256 examples of [16], 10 classes, vocab 32");
  Batch ba = a->Get({0, 1, 2, 3});
  EXPECT_EQ(ba.inputs.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(ba.inputs, b->Get({0, 1, 2, 3}).inputs));
  EXPECT_FALSE(at::equal(ba.inputs, c->Get({0, 1, 2, 3}).inputs));
  EXPECT_GE(ba.inputs.min().item<int64_t>(), 0);
  EXPECT_LT(ba.inputs.max().item<int64_t>(), 32);
}

TEST(DataSplitTest, HoldsOutASeededDisjointPartThatPythonReproduces) {
  ASSERT_OK_AND_ASSIGN(DataSplit none, SplitHeldOut(5, 0, 7));
  EXPECT_THAT(none.train, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_TRUE(none.held_out.empty());

  ASSERT_OK_AND_ASSIGN(DataSplit split, SplitHeldOut(100, 0.1, 7));
  ASSERT_EQ(split.held_out.size(), 10u);
  ASSERT_EQ(split.train.size(), 90u);
  std::vector<int64_t> all = split.train;
  all.insert(all.end(), split.held_out.begin(), split.held_out.end());
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(all[i], i);  // disjoint, and covers everything.
  ASSERT_OK_AND_ASSIGN(DataSplit again, SplitHeldOut(100, 0.1, 7));
  EXPECT_EQ(again.held_out, split.held_out);
  ASSERT_OK_AND_ASSIGN(DataSplit other_seed, SplitHeldOut(100, 0.1, 8));
  EXPECT_NE(other_seed.held_out, split.held_out);
  // A tiny fraction still holds out one example.
  ASSERT_OK_AND_ASSIGN(DataSplit tiny, SplitHeldOut(100, 0.001, 7));
  EXPECT_EQ(tiny.held_out.size(), 1u);

  // The split is torch.randperm's with a generator of its own, as the header says.
  RunPythonSnippet("split",
                   absl::StrCat("import torch\n"
                                "g = torch.Generator().manual_seed(7)\n"
                                "held = sorted(torch.randperm(100, generator=g)[:10].tolist())\n"
                                "assert held == [",
                                absl::StrJoin(split.held_out, ", "), "], held\n"));

  EXPECT_THAT(SplitHeldOut(100, 1.0, 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "eval_fraction must be in [0, 1)"));
  EXPECT_THAT(SplitHeldOut(100, -0.5, 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "eval_fraction must be in [0, 1)"));
  EXPECT_THAT(SplitHeldOut(1, 0.5, 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "leaves none to train on"));
}

TEST(DatasetDeathTest, GetOutOfRangeIsACallerBug) {
  ASSERT_OK_AND_ASSIGN(auto data, OpenDataset(Synthetic("mlp")));
  EXPECT_DEATH(data->Get({0, 256}), "index 256 out of range \\[0, 256\\) in synthetic");
}

TEST(DatasetTest, RejectsUnknownSourcesAndKinds) {
  DataSpec spec;
  spec.source = "imagenet:/data";
  EXPECT_THAT(OpenDataset(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown data source 'imagenet:/data'"));
  spec.source = "synthetic";
  spec.model_kind = "rnn";
  EXPECT_THAT(OpenDataset(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown model kind 'rnn'"));
  spec.model_kind = "mlp";
  spec.synthetic_examples = 0;
  EXPECT_THAT(OpenDataset(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "synthetic_examples must be positive"));
}

// MNIST-format files written by Python (struct + raw bytes, the layout of the real files), in
// the dotted spelling for images and the dashed one for labels.
class MnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TmpPath(
        absl::StrCat("mnist_", ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
    RunPythonSnippet("write_mnist", absl::StrCat(R"(
import struct
d = ')",
                                                 dir_, R"('
n, r, c = 5, 28, 28
with open(d + '/train-images.idx3-ubyte', 'wb') as f:
    f.write(struct.pack('>IIII', 0x803, n, r, c))
    f.write(bytes((i * 7 + j) % 256 for i in range(n) for j in range(r * c)))
with open(d + '/train-labels-idx1-ubyte', 'wb') as f:
    f.write(struct.pack('>II', 0x801, n))
    f.write(bytes([3, 1, 4, 1, 5]))
)"));
  }
  std::string images() const { return dir_ + "/train-images.idx3-ubyte"; }
  std::string labels() const { return dir_ + "/train-labels-idx1-ubyte"; }
  DataSpec Spec() const {
    DataSpec spec;
    spec.source = "mnist:" + dir_;
    return spec;
  }
  std::string dir_;
};

TEST_F(MnistTest, ParsesIdxFilesWrittenByPython) {
  ASSERT_OK_AND_ASSIGN(auto data, OpenDataset(Spec()));
  EXPECT_EQ(data->size(), 5);
  EXPECT_THAT(data->example_shape(), ElementsAre(1, 28, 28));
  EXPECT_EQ(data->num_classes(), 10);
  Batch batch = data->Get({2, 4});
  EXPECT_EQ(batch.targets[0].item<int64_t>(), 4);
  EXPECT_EQ(batch.targets[1].item<int64_t>(), 5);
  EXPECT_EQ(batch.inputs.scalar_type(), at::kFloat);
  // Pixel j of image i is (i*7 + j) % 256, scaled to [0,1].
  EXPECT_FLOAT_EQ(batch.inputs[0][0][0][0].item<float>(), 14.0f / 255.0f);
  EXPECT_FLOAT_EQ(batch.inputs[1][0][1][3].item<float>(), ((4 * 7 + 31) % 256) / 255.0f);
  EXPECT_FLOAT_EQ(batch.inputs.max().item<float>(), 1.0f);
}

TEST_F(MnistTest, CorruptMagicIsRejected) {
  std::string bytes = ReadFile(images());
  bytes[3] = 0x01;  // 0x00000801: a label file's magic where images belong.
  WriteFile(images(), bytes);
  EXPECT_THAT(OpenDataset(Spec()), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "bad IDX magic 0x00000801, expected 0x00000803"));
}

TEST_F(MnistTest, TruncatedFileIsRejected) {
  std::string bytes = ReadFile(images());
  WriteFile(images(), bytes.substr(0, bytes.size() - 100));
  EXPECT_THAT(OpenDataset(Spec()), StatusIs(absl::StatusCode::kDataLoss, "truncated"));
}

TEST_F(MnistTest, LabelCountMismatchIsRejected) {
  std::string bytes = ReadFile(labels());
  bytes[7] = 4;                                            // header says 4 labels ...
  WriteFile(labels(), bytes.substr(0, bytes.size() - 1));  // ... and the file holds 4.
  EXPECT_THAT(OpenDataset(Spec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "has 5 images but"));
}

TEST_F(MnistTest, LabelOutOfRangeIsRejected) {
  std::string bytes = ReadFile(labels());
  bytes[9] = 10;
  WriteFile(labels(), bytes);
  EXPECT_THAT(OpenDataset(Spec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "label 10 at index 1 is out of range"));
}

TEST_F(MnistTest, MissingFilesAreNamed) {
  std::filesystem::rename(labels(), labels() + ".gz");
  EXPECT_THAT(OpenDataset(Spec()), StatusIs(absl::StatusCode::kNotFound, "gunzip"));
  std::filesystem::remove(labels() + ".gz");
  EXPECT_THAT(OpenDataset(Spec()),
              StatusIs(absl::StatusCode::kNotFound, "none of train-labels-idx1-ubyte"));
  DataSpec spec;
  spec.source = "mnist:" + dir_ + "/nope";
  EXPECT_THAT(OpenDataset(spec), StatusIs(absl::StatusCode::kNotFound, "does not exist"));
}

TEST(PtDatasetTest, LoadsFeaturesSavedByTorch) {
  const std::string path = TmpPath("features.pt");
  RunPythonSnippet("write_features", absl::StrCat(R"(
import torch
x = torch.arange(6 * 4, dtype=torch.float64).reshape(6, 4)
y = torch.tensor([0, 2, 1, 2, 0, 1])
torch.save({'x': x, 'y': y}, ')",
                                                  path, "')\n"));
  DataSpec spec;
  spec.source = "pt:" + path;
  ASSERT_OK_AND_ASSIGN(auto data, OpenDataset(spec));
  EXPECT_EQ(data->size(), 6);
  EXPECT_THAT(data->example_shape(), ElementsAre(4));
  EXPECT_EQ(data->input_kind(), InputKind::kFeatures);
  EXPECT_EQ(data->num_classes(), 3);
  EXPECT_EQ(data->Describe(), absl::StrCat("pt:", path, ": 6 examples of [4], 3 classes"));
  Batch batch = data->Get({5, 1});
  EXPECT_EQ(batch.inputs.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(batch.inputs,
                        at::tensor({20.f, 21.f, 22.f, 23.f, 4.f, 5.f, 6.f, 7.f}).reshape({2, 4})));
  EXPECT_TRUE(at::equal(batch.targets, at::tensor({1, 2}, at::kLong)));
}

TEST(PtDatasetTest, LoadsTokensSavedByTorch) {
  const std::string path = TmpPath("tokens.pt");
  RunPythonSnippet("write_tokens", absl::StrCat(R"(
import torch
torch.save({'x': torch.tensor([[1, 2, 3], [4, 5, 6]]), 'y': torch.tensor([1, 0])}, ')",
                                                path, "')\n"));
  DataSpec spec;
  spec.source = "pt:" + path;
  ASSERT_OK_AND_ASSIGN(auto data, OpenDataset(spec));
  EXPECT_EQ(data->input_kind(), InputKind::kTokens);
  EXPECT_EQ(data->vocab_size(), 7);
  EXPECT_EQ(data->num_classes(), 2);
  EXPECT_THAT(data->example_shape(), ElementsAre(3));
}

TEST(PtDatasetTest, RejectsBadFiles) {
  const std::string no_y = TmpPath("no_y.pt");
  const std::string short_y = TmpPath("short_y.pt");
  const std::string negative = TmpPath("negative.pt");
  RunPythonSnippet("write_bad", absl::StrCat(R"(
import torch
torch.save({'x': torch.zeros(3, 2)}, ')",
                                             no_y, R"(')
torch.save({'x': torch.zeros(3, 2), 'y': torch.tensor([0, 1])}, ')",
                                             short_y, R"(')
torch.save({'x': torch.zeros(2, 2), 'y': torch.tensor([0, -1])}, ')",
                                             negative, R"(')
)"));
  DataSpec spec;
  spec.source = "pt:" + no_y;
  EXPECT_THAT(OpenDataset(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                              "no targets (a tensor named 'y' or 'targets'"));
  spec.source = "pt:" + short_y;
  EXPECT_THAT(OpenDataset(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "'x' has 3 rows but 'y' has 2"));
  spec.source = "pt:" + negative;
  EXPECT_THAT(OpenDataset(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "class ids must be >= 0"));
  spec.source = "pt:" + TmpPath("missing.pt");
  EXPECT_THAT(OpenDataset(spec), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace ckpt::train
