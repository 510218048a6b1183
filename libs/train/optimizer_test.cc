#include "libs/train/optimizer.h"

#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/torch_reader.h"
#include "libs/format/torch_writer.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"
#include "torch/nn/modules/linear.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/sgd.h"

namespace ckpt::train {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::vector<at::Tensor> MakeParams(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return {at::randn({3, 4}, gen).requires_grad_(), at::randn({4}, gen).requires_grad_()};
}

// Independent leaf copies of `params`, bit-identical.
std::vector<at::Tensor> CloneParams(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Deterministic training steps `first` .. `first + n - 1` on a small nonlinear loss.
void Train(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params, int first,
           int n) {
  for (int s = first; s < first + n; ++s) {
    optimizer.zero_grad();
    at::Tensor x = at::arange(4, at::kFloat) * static_cast<double>(s + 1) / 10.0 - 0.3;
    at::Tensor loss = params[0].matmul(x).sin().sum() + (params[1] * x).pow(2).sum();
    loss.backward();
    optimizer.step();
  }
}

OptimizerSpec Spec(const std::string& kind) {
  OptimizerSpec spec = *ParseOptimizerKind(kind);
  spec.lr = 0.05;
  if (kind == "adamw") spec.weight_decay = 0.01;
  return spec;
}

// Replaces every tensor of `value` with an independent copy (a snapshot of live state).
void CloneTensors(Value& value) {
  if (value.is_tensor()) value.mutable_tensor() = value.tensor().clone();
  if (value.is_sequence()) {
    for (Value& item : value.mutable_items()) CloneTensors(item);
  }
  if (value.is_dict()) {
    for (Value::Entry& entry : value.mutable_entries()) CloneTensors(entry.second);
  }
}

TEST(ParseOptimizerKindTest, AcceptsKnownKindsCaseInsensitively) {
  ASSERT_OK_AND_ASSIGN(OptimizerSpec spec, ParseOptimizerKind("AdamW"));
  EXPECT_EQ(spec.kind, "adamw");
  EXPECT_THAT(ParseOptimizerKind("sgd"), IsOk());
  EXPECT_THAT(ParseOptimizerKind("adam"), IsOk());
}

TEST(ParseOptimizerKindTest, RejectsUnknownKindListingTheKinds) {
  EXPECT_THAT(ParseOptimizerKind("rmsprop"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sgd, adam, adamw")));
}

TEST(MakeOptimizerTest, RejectsNegativeLearningRate) {
  OptimizerSpec spec = Spec("adam");
  spec.lr = -1;
  EXPECT_THAT(MakeOptimizer(spec, MakeParams(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("learning rate")));
}

class OptimizerKindTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerKindTest, StateDictLoadsIntoPythonOptimizerWithPythonsLayout) {
  std::vector<at::Tensor> params = MakeParams(7);
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(Spec(GetParam()), params));
  Train(*optimizer, params, 0, 3);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  const std::string path = TempPath("optimizer_" + GetParam() + ".pt");
  ASSERT_OK(WriteTorchFile(path, state).status());
  EXPECT_EQ(::ckpt::testing::RunPythonOrAddFailure("libs/train/testdata/optim_check.py",
                                                   "optimizer " + GetParam() + " " + path),
            "OK\n");
}

TEST_P(OptimizerKindTest, RestoredOptimizerContinuesBitIdentically) {
  std::vector<at::Tensor> params = MakeParams(11);
  ASSERT_OK_AND_ASSIGN(auto original, MakeOptimizer(Spec(GetParam()), params));
  Train(*original, params, 0, 3);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*original));

  std::vector<at::Tensor> resumed_params = CloneParams(params);
  OptimizerSpec other = Spec(GetParam());
  other.lr = 0.5;  // the state dict's hyper-parameters must win.
  other.weight_decay = 0.2;
  ASSERT_OK_AND_ASSIGN(auto resumed, MakeOptimizer(other, resumed_params));
  ASSERT_OK(LoadOptimizerStateDict(*resumed, state));
  EXPECT_EQ(CurrentLearningRate(*resumed), CurrentLearningRate(*original));
  ASSERT_OK_AND_ASSIGN(Value restored_state, OptimizerStateDict(*resumed));
  EXPECT_EQ(restored_state, state);

  Train(*original, params, 3, 3);
  Train(*resumed, resumed_params, 3, 3);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(params[i], resumed_params[i])) << "parameter " << i;
  }
}

TEST_P(OptimizerKindTest, RestoreCopiesStateOntoParameterDeviceAndDtype) {
  std::vector<at::Tensor> params = MakeParams(3);
  ASSERT_OK_AND_ASSIGN(auto original, MakeOptimizer(Spec(GetParam()), params));
  Train(*original, params, 0, 2);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*original));
  // What the store gives back: CPU tensors, here also float64 to see the dtype follow the
  // parameter.
  CloneTensors(state);
  for (Value::Entry& entry : state.FindMutable("state")->mutable_entries()) {
    for (Value::Entry& field : entry.second.mutable_entries()) {
      if (field.first.string_key() != "step") {
        field.second.mutable_tensor() = field.second.tensor().to(at::kCPU, at::kDouble);
      }
    }
  }

  std::vector<at::Tensor> resumed_params = CloneParams(params);
  ASSERT_OK_AND_ASSIGN(auto resumed, MakeOptimizer(Spec(GetParam()), resumed_params));
  ASSERT_OK(LoadOptimizerStateDict(*resumed, state));
  ASSERT_OK_AND_ASSIGN(Value loaded, OptimizerStateDict(*resumed));
  int checked = 0;
  for (const Value::Entry& entry : loaded.Find("state")->entries()) {
    const at::Tensor& param = resumed_params[entry.first.int_key()];
    for (const Value::Entry& field : entry.second.entries()) {
      if (field.first.string_key() == "step") continue;
      const at::Tensor& t = field.second.tensor();
      EXPECT_EQ(t.device(), param.device()) << field.first.string_key();
      EXPECT_EQ(t.scalar_type(), param.scalar_type()) << field.first.string_key();
      // A copy: the optimizer must never update the caller's tensors in place.
      const at::Tensor& given = state.Find("state")->Find(entry.first)->Find(field.first)->tensor();
      EXPECT_NE(t.data_ptr(), given.data_ptr());
      ++checked;
    }
  }
  EXPECT_EQ(checked, GetParam() == "sgd" ? 2 : 4);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OptimizerKindTest, ::testing::Values("sgd", "adam", "adamw"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// The resume bug this rules out: state from the store (CPU) for parameters on another device.
// The meta device stands in for a GPU on machines without one; on CUDA builds the same path
// runs with cuda:N.
TEST(LoadOptimizerStateDictTest, StateFromCpuLandsOnNonCpuParameterDevice) {
  std::vector<at::Tensor> params = MakeParams(4);
  ASSERT_OK_AND_ASSIGN(auto original, MakeOptimizer(Spec("adam"), params));
  Train(*original, params, 0, 2);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*original));

  const at::Device device = at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kMeta);
  std::vector<at::Tensor> device_params;
  for (const at::Tensor& p : params) device_params.push_back(p.detach().to(device));
  ASSERT_OK_AND_ASSIGN(auto resumed, MakeOptimizer(Spec("adam"), device_params));
  ASSERT_OK(LoadOptimizerStateDict(*resumed, state));
  ASSERT_OK_AND_ASSIGN(Value loaded, OptimizerStateDict(*resumed));
  ASSERT_EQ(loaded.Find("state")->entries().size(), 2u);
  for (const Value::Entry& entry : loaded.Find("state")->entries()) {
    EXPECT_EQ(entry.second.Find("exp_avg")->tensor().device(), device);
    EXPECT_EQ(entry.second.Find("exp_avg_sq")->tensor().device(), device);
  }
}

TEST(LoadOptimizerStateDictTest, AcceptsIntAndFloatSteps) {
  std::vector<at::Tensor> params = MakeParams(5);
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(Spec("adam"), params));
  Train(*optimizer, params, 0, 2);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  state.FindMutable("state")->FindMutable(int64_t{0})->Set("step", Value::Int(7));  // PyTorch 1.12.
  state.FindMutable("state")->FindMutable(int64_t{1})->Set("step", Value::Float(9.0));
  ASSERT_OK_AND_ASSIGN(auto resumed, MakeOptimizer(Spec("adam"), CloneParams(params)));
  ASSERT_OK(LoadOptimizerStateDict(*resumed, state));
  ASSERT_OK_AND_ASSIGN(Value loaded, OptimizerStateDict(*resumed));
  EXPECT_EQ(loaded.Find("state")->Find(int64_t{0})->Find("step")->tensor().item<float>(), 7.0f);
  EXPECT_EQ(loaded.Find("state")->Find(int64_t{1})->Find("step")->tensor().item<float>(), 9.0f);

  state.FindMutable("state")->FindMutable(int64_t{1})->Set("step", Value::Float(2.5));
  EXPECT_THAT(LoadOptimizerStateDict(*resumed, state),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whole number")));
}

TEST(LoadOptimizerStateDictTest, RejectsStateTensorOfWrongShapeNamingParameterAndShapes) {
  std::vector<at::Tensor> params = MakeParams(5);
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(Spec("adam"), params));
  Train(*optimizer, params, 0, 1);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  CloneTensors(state);
  state.FindMutable("state")
      ->FindMutable(int64_t{1})
      ->Set("exp_avg_sq", Value::Tensor(at::zeros({5})));
  ASSERT_OK_AND_ASSIGN(Value before, OptimizerStateDict(*optimizer));
  CloneTensors(before);

  EXPECT_THAT(LoadOptimizerStateDict(*optimizer, state),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 1: 'exp_avg_sq' has shape [5] in the state dict, "
                                 "the parameter has shape [4]")));
  // All or nothing: the failed load left the optimizer as it was.
  ASSERT_OK_AND_ASSIGN(Value after, OptimizerStateDict(*optimizer));
  EXPECT_EQ(after, before);
}

TEST(LoadOptimizerStateDictTest, RejectsStateDictOfAnotherKind) {
  std::vector<at::Tensor> params = MakeParams(5);
  ASSERT_OK_AND_ASSIGN(auto sgd, MakeOptimizer(Spec("sgd"), params));
  Train(*sgd, params, 0, 1);
  ASSERT_OK_AND_ASSIGN(Value sgd_state, OptimizerStateDict(*sgd));
  std::vector<at::Tensor> adam_params = CloneParams(params);
  ASSERT_OK_AND_ASSIGN(auto adam, MakeOptimizer(Spec("adam"), adam_params));
  EXPECT_THAT(LoadOptimizerStateDict(*adam, sgd_state),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is from SGD ('momentum', 'momentum_buffer') but the optimizer "
                                 "is Adam")));

  Train(*adam, adam_params, 0, 1);
  ASSERT_OK_AND_ASSIGN(Value adam_state, OptimizerStateDict(*adam));
  EXPECT_THAT(LoadOptimizerStateDict(*sgd, adam_state),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is from Adam/AdamW")));
}

TEST(LoadOptimizerStateDictTest, RejectsWrongParameterCount) {
  std::vector<at::Tensor> params = MakeParams(5);
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(Spec("adamw"), params));
  Train(*optimizer, params, 0, 1);
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  ASSERT_OK_AND_ASSIGN(auto smaller, MakeOptimizer(Spec("adamw"), {params[0].detach().clone()}));
  EXPECT_THAT(
      LoadOptimizerStateDict(*smaller, state),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr("param group 0 has 2 parameters in the state dict, the optimizer's has 1")));
}

TEST(LoadOptimizerStateDictTest, RejectsMaximizeWhichLibTorchDoesNotImplement) {
  std::vector<at::Tensor> params = MakeParams(5);
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(Spec("adam"), params));
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  state.FindMutable("param_groups")->mutable_items()[0].Set("maximize", Value::Bool(true));
  EXPECT_THAT(LoadOptimizerStateDict(*optimizer, state),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'maximize': True")));
}

TEST(OptimizerStateDictTest, FreshOptimizerHasGroupsButNoState) {
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(Spec("adam"), MakeParams(2)));
  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  EXPECT_TRUE(state.Find("state")->entries().empty());
  const Value& group = state.Find("param_groups")->items().at(0);
  EXPECT_EQ(group.Find("lr")->float_value(), 0.05);
  EXPECT_EQ(*group.Find("params"), Value::List({Value::Int(0), Value::Int(1)}));
}

TEST(OptimizerParamNamesTest, NumbersParametersInNamedParametersOrder) {
  struct Net : torch::nn::Module {
    Net() {
      fc1 = register_module("fc1", torch::nn::Linear(4, 8));
      fc2 = register_module("fc2", torch::nn::Linear(8, 2));
    }
    torch::nn::Linear fc1{nullptr};
    torch::nn::Linear fc2{nullptr};
  };
  Net net;
  std::map<int64_t, std::string> names = OptimizerParamNames(net);
  EXPECT_THAT(names, ElementsAre(Pair(0, "fc1.weight"), Pair(1, "fc1.bias"), Pair(2, "fc2.weight"),
                                 Pair(3, "fc2.bias")));
}

// Numeric parity with torch.optim. testdata/optim_parity.py builds a real PyTorch optimizer,
// warms it up, and saves its state, the gradients of the next steps, and what Python ends with
// after them. Here that state is restored (LoadOptimizerStateDict) into an optimizer made with
// other hyper-parameters, LibTorch takes the same steps with the same gradients, and
// OptimizerStateDict must give back Python's state dict: every tensor bit for bit, every group
// field equal, and the parameters bit for bit. Exact, not a tolerance: LibTorch 1.13's
// SGD/Adam/AdamW steps and torch.optim 1.13's (single-tensor, foreach off by default) run the same
// ATen CPU ops in the same order on float32 tensors, with the bias corrections computed in double
// by the same libm pow, so any difference is a bug (a lost flag, a wrong step count), not rounding.
struct ParityCase {
  std::string name;  // a CASES key of optim_parity.py
  std::string kind;  // what MakeOptimizer builds before the restore.
};

void PrintTo(const ParityCase& parity, std::ostream* out) { *out << parity.name; }

class OptimizerParityTest : public ::testing::TestWithParam<ParityCase> {};

const Value& Field(const Value& dict, const std::string& key) {
  const Value* value = dict.Find(key);
  EXPECT_NE(value, nullptr) << "no '" << key << "' in " << dict.DebugString();
  static const Value* const kNone = new Value();
  return value != nullptr ? *value : *kNone;
}

// The first difference between `ours` and `python` under `path`, or "" when they agree: tensors
// must match in dtype, shape and every bit; numbers compare by value (Python may keep an int where
// LibTorch has a double); everything else with ==.
std::string FirstDifference(const std::string& path, const Value& ours, const Value& python) {
  if (ours.is_tensor() && python.is_tensor()) {
    const at::Tensor& a = ours.tensor();
    const at::Tensor& b = python.tensor();
    if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) {
      return absl::StrCat(path, ": ours ", ours.DebugString(), ", Python's ", python.DebugString());
    }
    if (!at::equal(a, b)) {
      return absl::StrCat(path, ": values differ, max |ours - Python's| = ",
                          (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>());
    }
    return "";
  }
  const bool ours_number = ours.is_int() || ours.is_float();
  const bool python_number = python.is_int() || python.is_float();
  if (ours_number && python_number) {
    const double a = ours.is_int() ? static_cast<double>(ours.int_value()) : ours.float_value();
    const double b =
        python.is_int() ? static_cast<double>(python.int_value()) : python.float_value();
    if (a == b) return "";
    return absl::StrCat(path, ": ours ", ours.DebugString(), ", Python's ", python.DebugString());
  }
  if (ours.is_sequence() && python.is_sequence()) {
    if (ours.items().size() != python.items().size()) {
      return absl::StrCat(path, ": ours has ", ours.items().size(), " items, Python's ",
                          python.items().size());
    }
    for (size_t i = 0; i < ours.items().size(); ++i) {
      std::string difference =
          FirstDifference(absl::StrCat(path, "/", i), ours.items()[i], python.items()[i]);
      if (!difference.empty()) return difference;
    }
    return "";
  }
  if (ours.is_dict() && python.is_dict()) {
    if (ours.entries().size() != python.entries().size()) {
      return absl::StrCat(path, ": ours ", ours.DebugString(), ", Python's ", python.DebugString());
    }
    for (size_t i = 0; i < ours.entries().size(); ++i) {
      const auto& [key, value] = ours.entries()[i];
      const auto& [python_key, python_value] = python.entries()[i];
      if (!(key == python_key)) {
        return absl::StrCat(path, ": keys differ at position ", i, ": ours ", ours.DebugString(),
                            ", Python's ", python.DebugString());
      }
      std::string difference =
          FirstDifference(absl::StrCat(path, "/", key.DebugString()), value, python_value);
      if (!difference.empty()) return difference;
    }
    return "";
  }
  if (ours == python) return "";
  return absl::StrCat(path, ": ours ", ours.DebugString(), ", Python's ", python.DebugString());
}

TEST_P(OptimizerParityTest, StepsFromPythonsStateMatchTorchOptimBitForBit) {
  const ParityCase& parity = GetParam();
  const std::string path = TempPath("parity_" + parity.name + ".pt");
  ASSERT_EQ(::ckpt::testing::RunPythonOrAddFailure("libs/train/testdata/optim_parity.py",
                                                   parity.name + " " + path),
            "OK\n");
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(path));
  const Value& root = file.root;

  std::vector<at::Tensor> params;
  for (const Value& param : Field(root, "params").items()) {
    params.push_back(param.tensor().clone().requires_grad_());
  }
  ASSERT_EQ(params.size(), 3u);
  // Hyper-parameters unlike the case's, and no nesterov / amsgrad: the restore must bring them.
  ASSERT_OK_AND_ASSIGN(OptimizerSpec spec, ParseOptimizerKind(parity.kind));
  spec.lr = 0.7;
  spec.momentum = 0.3;
  spec.weight_decay = 0.0;
  spec.beta1 = 0.5;
  spec.beta2 = 0.6;
  spec.eps = 0.1;
  ASSERT_OK_AND_ASSIGN(auto optimizer, MakeOptimizer(spec, params));
  ASSERT_OK(LoadOptimizerStateDict(*optimizer, Field(root, "initial")));

  const std::vector<Value>& steps = Field(root, "grads").items();
  ASSERT_EQ(steps.size(), 4u);
  for (const Value& grads : steps) {
    ASSERT_EQ(grads.items().size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = grads.items()[i].tensor().clone();
    }
    optimizer->step();
  }

  ASSERT_OK_AND_ASSIGN(Value state, OptimizerStateDict(*optimizer));
  const Value& expected = Field(root, "final");
  EXPECT_EQ(FirstDifference("optimizer", state, expected), "");
  // Every state tensor was compared: as many as Python keeps.
  EXPECT_EQ(state.TensorCount(), expected.TensorCount());
  EXPECT_GT(state.TensorCount(), 0);
  const std::vector<Value>& final_params = Field(root, "final_params").items();
  ASSERT_EQ(final_params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(FirstDifference(absl::StrCat("parameter ", i), Value::Tensor(params[i].detach()),
                              final_params[i]),
              "");
  }
}

INSTANTIATE_TEST_SUITE_P(
    TorchOptim, OptimizerParityTest,
    ::testing::Values(ParityCase{"sgd_momentum", "sgd"}, ParityCase{"sgd_nesterov", "sgd"},
                      ParityCase{"adam", "adam"}, ParityCase{"adam_amsgrad", "adam"},
                      ParityCase{"adamw", "adamw"}, ParityCase{"adamw_amsgrad", "adamw"}),
    [](const ::testing::TestParamInfo<ParityCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ckpt::train
