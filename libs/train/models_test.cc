#include "libs/train/models.h"

#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/torch_writer.h"
#include "libs/status/status_matchers.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "libs/testing/python_runner.h"
#include "libs/train/dataset.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::RunPython;
using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kTwins[] = "libs/train/python/twins.py";

std::unique_ptr<Dataset> Synthetic(const std::string& model_kind, int64_t examples = 64) {
  DataSpec spec;
  spec.model_kind = model_kind;
  spec.synthetic_examples = examples;
  auto data = OpenDataset(spec);
  EXPECT_TRUE(data.ok()) << data.status();
  return std::move(data).value();
}

std::vector<int64_t> FirstIndices(int64_t n) {
  std::vector<int64_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0);
  return indices;
}

std::shared_ptr<Model> SeededModel(const ModelSpec& spec, const Dataset& data) {
  at::manual_seed(7);
  auto model = MakeModel(spec, data);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : nullptr;
}

// Writes the model's state dict, a batch and the C++ logits for it as one torch.save file and
// has real PyTorch build the twin, load it strictly, compare key order and logits.
absl::StatusOr<std::string> CheckAgainstTwin(Model& model, const Dataset& data,
                                             const std::string& name, double output_offset = 0.0) {
  model.eval();
  at::Tensor inputs = data.Get(FirstIndices(8)).inputs;
  at::Tensor outputs;
  {
    at::NoGradGuard no_grad;
    outputs = model.forward(inputs) + output_offset;
  }
  Value bundle = Value::Dict();
  bundle.Set("twin", Value::String(model.PythonTwin()));
  bundle.Set("state", StateDictToValue(ModelStateDict(model)));
  bundle.Set("input", Value::Tensor(inputs));
  bundle.Set("output", Value::Tensor(outputs));
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, ".pt");
  auto written = WriteTorchFile(path, bundle);
  if (!written.ok()) return written.status();
  return RunPython(kTwins, absl::StrCat("check --bundle ", path));
}

TEST(ModelsTest, MlpMatchesPythonTwin) {
  auto data = Synthetic("mlp");
  ModelSpec spec;
  spec.kind = "mlp";
  spec.hidden = 32;
  spec.layers = 2;
  auto model = SeededModel(spec, *data);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->PythonTwin(), "MLP(in_features=144, hidden=32, layers=2, num_classes=10)");
  EXPECT_THAT(ModelStateDict(*model).keys(),
              ElementsAre("hidden.0.weight", "hidden.0.bias", "hidden.1.weight", "hidden.1.bias",
                          "head.weight", "head.bias"));
  ASSERT_OK_AND_ASSIGN(std::string out, CheckAgainstTwin(*model, *data, "mlp"));
  EXPECT_THAT(out, HasSubstr("OK MLP("));
}

TEST(ModelsTest, CnnWithTrainedBatchNormStatsMatchesPythonTwin) {
  auto data = Synthetic("cnn");
  ModelSpec spec;
  spec.kind = "cnn";
  spec.hidden = 8;
  auto model = SeededModel(spec, *data);
  ASSERT_NE(model, nullptr);
  // Train-mode passes move running_mean / running_var / num_batches_tracked off their initial
  // values, so the check covers the buffers, not just the parameters.
  model->train();
  {
    at::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) model->forward(data->Get({8, 9, 10, 11, 12, 13}).inputs);
  }
  StateDict state = ModelStateDict(*model);
  EXPECT_THAT(
      state.keys(),
      ElementsAre("conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean",
                  "bn1.running_var", "bn1.num_batches_tracked", "conv2.weight", "conv2.bias",
                  "bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var",
                  "bn2.num_batches_tracked", "head.weight", "head.bias"));
  EXPECT_EQ(state.Find("bn1.num_batches_tracked")->item<int64_t>(), 3);
  EXPECT_GT(state.Find("bn1.running_mean")->abs().sum().item<float>(), 0.0f);
  ASSERT_OK_AND_ASSIGN(std::string out, CheckAgainstTwin(*model, *data, "cnn"));
  EXPECT_THAT(out, HasSubstr("OK CNN(in_channels=1, channels=8, num_classes=10)"));
}

TEST(ModelsTest, TransformerMatchesPythonTwin) {
  auto data = Synthetic("transformer");
  ModelSpec spec;
  spec.kind = "transformer";
  spec.hidden = 16;
  spec.layers = 2;
  spec.heads = 4;
  auto model = SeededModel(spec, *data);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->PythonTwin(),
            "Transformer(vocab_size=32, seq_len=16, d_model=16, heads=4, layers=2, "
            "num_classes=10)");
  std::vector<std::string> keys = ModelStateDict(*model).keys();
  ASSERT_GE(keys.size(), 4u);
  EXPECT_EQ(keys[0], "pos");
  EXPECT_EQ(keys[1], "embed.weight");
  EXPECT_EQ(keys[2], "encoder.layers.0.self_attn.in_proj_weight");
  ASSERT_OK_AND_ASSIGN(std::string out, CheckAgainstTwin(*model, *data, "transformer"));
  EXPECT_THAT(out, HasSubstr("OK Transformer("));
}

TEST(ModelsTest, PlainStateDictFileLoadsStrictlyIntoTwin) {
  // The form a checkpoint exported through the loader has: just the state dict.
  auto data = Synthetic("cnn");
  ModelSpec spec;
  spec.kind = "cnn";
  spec.hidden = 4;
  auto model = SeededModel(spec, *data);
  ASSERT_NE(model, nullptr);
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/cnn_state.pt");
  ASSERT_OK(WriteTorchFile(path, StateDictToValue(ModelStateDict(*model))).status());
  ASSERT_OK_AND_ASSIGN(
      std::string out,
      RunPython(kTwins, absl::StrCat("check --twin '", model->PythonTwin(), "' --state ", path)));
  EXPECT_THAT(out, HasSubstr("OK CNN(in_channels=1, channels=4, num_classes=10): 16 keys"));
  // A twin of another size must refuse it (strict load), so the check above means something.
  EXPECT_THAT(RunPython(kTwins, absl::StrCat("check --twin 'CNN(in_channels=1, channels=5, "
                                             "num_classes=10)' --state ",
                                             path)),
              StatusIs(absl::StatusCode::kInternal, "size mismatch"));
}

TEST(ModelsTest, TwinCheckFailsWhenOutputsDiffer) {
  // The Python check is the test's oracle: it must reject logits that are off.
  auto data = Synthetic("mlp");
  auto model = SeededModel(ModelSpec{}, *data);
  ASSERT_NE(model, nullptr);
  EXPECT_THAT(CheckAgainstTwin(*model, *data, "mlp_off", /*output_offset=*/1e-3),
              StatusIs(absl::StatusCode::kInternal, "outputs differ"));
}

TEST(ModelsTest, SameSeedGivesSameWeights) {
  auto data = Synthetic("transformer");
  ModelSpec spec;
  spec.kind = "transformer";
  spec.hidden = 16;
  auto a = SeededModel(spec, *data);
  auto b = SeededModel(spec, *data);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  StateDict sa = ModelStateDict(*a);
  StateDict sb = ModelStateDict(*b);
  ASSERT_EQ(sa.keys(), sb.keys());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(at::equal(sa.entry(i).tensor, sb.entry(i).tensor)) << sa.entry(i).key;
  }
}

TEST(ModelsTest, ForwardGivesLogitsPerClass) {
  for (const std::string& kind : ModelKinds()) {
    auto data = Synthetic(kind);
    ModelSpec spec;
    spec.kind = kind;
    spec.hidden = 16;
    auto model = SeededModel(spec, *data);
    ASSERT_NE(model, nullptr) << kind;
    at::Tensor logits = model->forward(data->Get({0, 1, 2}).inputs);
    EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 10})) << kind;
  }
}

TEST(ModelsTest, RejectsCombinationsThatCannotWork) {
  auto images = Synthetic("cnn");
  auto tokens = Synthetic("transformer");
  ModelSpec spec;
  spec.kind = "transformer";
  EXPECT_THAT(MakeModel(spec, *images),
              StatusIs(absl::StatusCode::kInvalidArgument, "transformer needs int64 token"));
  spec.kind = "cnn";
  EXPECT_THAT(MakeModel(spec, *tokens),
              StatusIs(absl::StatusCode::kInvalidArgument, "cnn needs float images"));
  spec.kind = "mlp";
  EXPECT_THAT(MakeModel(spec, *tokens),
              StatusIs(absl::StatusCode::kInvalidArgument, "mlp needs float features"));
  spec.kind = "resnet";
  EXPECT_THAT(MakeModel(spec, *images),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown model kind 'resnet'"));
  spec.kind = "transformer";
  spec.hidden = 10;
  spec.heads = 4;
  EXPECT_THAT(MakeModel(spec, *tokens),
              StatusIs(absl::StatusCode::kInvalidArgument, "heads (4) must divide hidden (10)"));
}

}  // namespace
}  // namespace ckpt::train
