#include "libs/train/scripted_model.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/core/grad_mode.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/zeros.h"
#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"
#include "torch/serialize.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

// The modules scripted_models.py writes, made once for the whole test binary.
const std::string& Fixtures() {
  static const std::string* dir = [] {
    auto* path = new std::string(std::string(std::getenv("TEST_TMPDIR")) + "/scripted");
    ckpt::testing::RunPythonOrAddFailure("libs/train/testdata/scripted_models.py", *path);
    return path;
  }();
  return *dir;
}

std::string Path(const std::string& name) { return Fixtures() + "/" + name; }

std::unique_ptr<TrainableModel> Load(const std::string& name, const std::string& loss = "") {
  ScriptedModelOptions options;
  options.path = Path(name);
  options.loss = loss;
  absl::StatusOr<std::unique_ptr<TrainableModel>> model = LoadScriptedModel(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

c10::Dict<c10::IValue, c10::IValue> Batch() {
  std::ifstream in(Path("batch.pt"), std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

at::Tensor Get(const c10::Dict<c10::IValue, c10::IValue>& batch, const std::string& key) {
  return batch.at(key).toTensor();
}

TEST(ScriptedModelTest, WeightsHaveThePythonModulesKeysOrderShapesAndDtypes) {
  std::unique_ptr<TrainableModel> model = Load("net.ts");
  ASSERT_NE(model, nullptr);
  std::ostringstream listed;
  for (const StateDict::Entry& entry : model->Weights()) {
    listed << entry.key << " " << c10::str(entry.tensor.sizes()) << " "
           << c10::toString(entry.tensor.scalar_type()) << "\n";
  }
  std::ifstream expected_file(Path("net.keys"));
  std::string expected((std::istreambuf_iterator<char>(expected_file)),
                       std::istreambuf_iterator<char>());
  // Python prints torch.float32 / torch.int64 and [4, 1, 3, 3]; LibTorch Float / Long.
  std::string actual = listed.str();
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {" Float\n", " float32\n"}, {" Long\n", " int64\n"}}) {
    for (size_t at = actual.find(from); at != std::string::npos; at = actual.find(from, at)) {
      actual.replace(at, from.size(), to);
    }
  }
  EXPECT_EQ(actual, expected);
}

TEST(ScriptedModelTest, WithoutTheKeysFileEveryBufferIsKept) {
  std::unique_ptr<TrainableModel> model = Load("net_nokeys.ts");
  ASSERT_NE(model, nullptr);
  const StateDict weights = model->Weights();
  EXPECT_TRUE(weights.contains("scratch"));  // non-persistent, but TorchScript cannot tell.
  EXPECT_EQ(weights.size(), 12u);
}

TEST(ScriptedModelTest, TheModulesOwnLossIsUsedAndMatchesPython) {
  std::unique_ptr<TrainableModel> model = Load("net.ts", /*loss=*/"mse");  // loss() wins
  ASSERT_NE(model, nullptr);
  const auto batch = Batch();
  at::NoGradGuard no_grad;
  model->SetTraining(false);
  const LossResult result = model->Loss(Get(batch, "x"), Get(batch, "y"));
  EXPECT_FALSE(result.outputs.defined());
  EXPECT_TRUE(at::allclose(result.loss, Get(batch, "loss"), 1e-6, 1e-7))
      << result.loss << " vs " << Get(batch, "loss");
  EXPECT_EQ(model->Identity().label, "torchscript_class");
  EXPECT_EQ(model->Identity().value, "__torch__.Net");
}

TEST(ScriptedModelTest, ATracedModuleWithoutLossGetsCrossEntropyOnItsOutputs) {
  std::unique_ptr<TrainableModel> model = Load("mlp.ts");
  ASSERT_NE(model, nullptr);
  const auto batch = Batch();
  at::NoGradGuard no_grad;
  const LossResult result = model->Loss(Get(batch, "x"), Get(batch, "y"));
  ASSERT_TRUE(result.outputs.defined());
  EXPECT_EQ(result.outputs.sizes(), (std::vector<int64_t>{6, 10}));
  EXPECT_TRUE(at::allclose(result.loss, Get(batch, "mlp_ce"), 1e-6, 1e-7));
  EXPECT_EQ(model->OptimizerParamNames().at(0), "fc1.weight");
  EXPECT_EQ(model->OptimizerParamNames().at(3), "fc2.bias");
}

TEST(ScriptedModelTest, GradientsFlowThroughTheInterpreterIntoTheModulesParameters) {
  std::unique_ptr<TrainableModel> model = Load("net.ts");
  ASSERT_NE(model, nullptr);
  const auto batch = Batch();
  model->SetTraining(true);
  model->Loss(Get(batch, "x"), Get(batch, "y")).loss.backward();
  const std::vector<at::Tensor> parameters = model->parameters();
  ASSERT_EQ(parameters.size(), 7u);  // alpha, conv.{weight,bias}, bn.{weight,bias}, head.*
  for (const at::Tensor& parameter : parameters) {
    ASSERT_TRUE(parameter.grad().defined());
    EXPECT_GT(parameter.grad().abs().sum().item<double>(), 0);
  }
  // The replica DDP syncs: those parameters and the three persistent-or-not buffers of the tree.
  const ddp::ReplicaTensors replica = model->Replica();
  EXPECT_EQ(replica.parameters.size(), parameters.size());
  EXPECT_EQ(replica.buffers().size(), 5u);  // scale, scratch, bn.running_{mean,var}, count
}

TEST(ScriptedModelTest, BadModulesAreRefusedWithWhatToDo) {
  ScriptedModelOptions options;
  options.path = Path("weights.pt");
  EXPECT_THAT(LoadScriptedModel(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not a TorchScript module")));
  EXPECT_THAT(LoadScriptedModel(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("torch.jit.script(model)")));
  options.path = Path("missing.ts");
  EXPECT_THAT(LoadScriptedModel(options).status(), StatusIs(absl::StatusCode::kNotFound));
  options.path = Path("noparams.ts");
  EXPECT_THAT(LoadScriptedModel(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has no parameters that require grad")));
  options.path = Path("frozen.ts");
  EXPECT_THAT(LoadScriptedModel(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has no parameters that require grad")));
  options.path = Path("badloss.ts");
  EXPECT_THAT(LoadScriptedModel(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("loss() takes 1 argument")));
  options.path = Path("mlp.ts");
  options.loss = "hinge";
  EXPECT_THAT(LoadScriptedModel(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown loss 'hinge'")));
}

TEST(ScriptedModelTest, ShapeErrorsComeOutAsTheirCauseWithoutTheTraceback) {
  std::unique_ptr<TrainableModel> model = Load("mlp.ts");
  ASSERT_NE(model, nullptr);
  try {
    model->Loss(at::zeros({2, 3, 5}), at::zeros({2}, at::kLong));
    FAIL() << "a [2,3,5] input should not fit Linear(144, 16)";
  } catch (const std::exception& e) {  // the interpreter throws std::runtime_error
    const std::string cause = TorchScriptErrorCause(e.what());
    EXPECT_THAT(cause, HasSubstr("2x15 and 144x16")) << e.what();
    EXPECT_THAT(cause, ::testing::Not(HasSubstr("Traceback")));
  }
}

}  // namespace
}  // namespace ckpt::train
