#include "libs/format/module_state.h"

#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/scalar_tensor.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/testing/torch_fixtures.h"
#include "libs/format/torch_reader.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ExpectedTensor;
using ::ckpt::testing::FindValueAtPath;
using ::ckpt::testing::GenerateTorchFixtures;
using ::ckpt::testing::SharingMatches;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TensorMatches;
using ::ckpt::testing::TorchFixtures;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const TorchFixtures& Fixtures() { return GenerateTorchFixtures({"models"}); }

// `ours` has exactly Python's state_dict() keys in order, and every tensor matches byte for byte,
// with storage shared exactly where Python shares it.
void ExpectStateMatchesPython(const std::string& file, const StateDict& ours) {
  const std::vector<ExpectedTensor> expected = Fixtures().StateOf(file);
  ASSERT_FALSE(expected.empty()) << file;
  std::vector<std::string> expected_keys;
  for (const ExpectedTensor& e : expected) expected_keys.push_back(e.path);
  ASSERT_EQ(ours.keys(), expected_keys) << file;
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(TensorMatches(ours.entry(i).tensor, ours.entry(i).original_device, expected[i]));
    tensors.push_back(ours.entry(i).tensor);
  }
  EXPECT_TRUE(SharingMatches(expected, tensors)) << file;
}

absl::StatusOr<CheckpointBundle> ReadBundle(const std::string& file) {
  ASSIGN_OR_RETURN(TorchFile torch_file, ReadTorchFile(Fixtures().Path(file)));
  return ExtractCheckpointBundle(torch_file.root);
}

TEST(StateDictFromModuleTest, RecoversAWholeModelWhoseClassNoLongerExists) {
  // Python itself cannot load it any more.
  EXPECT_THAT(Fixtures().python_load.at("whole_model.pt"), HasSubstr("ModuleNotFoundError"));
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("whole_model.pt")));
  ASSERT_TRUE(IsModuleObject(file.root));
  EXPECT_EQ(file.root.opaque_class_name(), "ckpt_fixture_models.Net");
  EXPECT_THAT(file.warnings, ::testing::Contains(HasSubstr("'ckpt_fixture_models.Net'")));
  ASSERT_OK_AND_ASSIGN(StateDict state, StateDictFromModule(file.root));
  ExpectStateMatchesPython("whole_model.pt", state);
  // Tied weights stay tied; the non-persistent buffer and None entries are left out.
  EXPECT_TRUE(
      state.Find("embed.weight")->storage().is_alias_of(state.Find("head.weight")->storage()));
  EXPECT_FALSE(state.contains("cache"));
  EXPECT_FALSE(state.contains("maybe"));
  EXPECT_FALSE(state.contains("unused"));
  EXPECT_EQ(state.Find("block.1.num_batches_tracked")->scalar_type(), at::kLong);
}

TEST(StateDictFromModuleTest, RecoversALegacyFormatWholeModel) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("legacy_whole_model.pt")));
  EXPECT_EQ(file.format, "torch_legacy");
  ASSERT_OK_AND_ASSIGN(StateDict state, StateDictFromModule(file.root));
  ExpectStateMatchesPython("legacy_whole_model.pt", state);
}

TEST(StateDictFromModuleTest, RejectsNonModules) {
  EXPECT_THAT(StateDictFromModule(Value::Dict()),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not a module object"));
  Value attributes = Value::Dict({{"_parameters", Value::Dict({{"w", Value::Int(3)}})},
                                  {"_buffers", Value::Dict()},
                                  {"_modules", Value::Dict()}});
  EXPECT_THAT(StateDictFromModule(Value::Opaque("m.M", Value::Tuple(), attributes)),
              StatusIs(absl::StatusCode::kInvalidArgument, "parameter 'w' is not a tensor"));
}

TEST(StateDictFromModuleTest, WalksHandBuiltModulesLikeStateDict) {
  // Older PyTorch has no _non_persistent_buffers_set; a child may be None.
  auto module = [](Value parameters, Value buffers, Value modules, Value non_persistent) {
    Value attributes = Value::Dict({{"training", Value::Bool(true)},
                                    {"_parameters", std::move(parameters)},
                                    {"_buffers", std::move(buffers)},
                                    {"_modules", std::move(modules)}});
    if (!non_persistent.is_none()) attributes.Set("_non_persistent_buffers_set", non_persistent);
    return Value::Opaque("m.M", Value::Tuple(), std::move(attributes));
  };
  Value child = module(
      Value::Dict({{"w", Value::Tensor(at::ones({2}), "cuda:0")}}),
      Value::Dict({{"b", Value::Tensor(at::zeros({1}))}, {"tmp", Value::Tensor(at::zeros({1}))}}),
      Value::Dict(), Value::List({Value::String("tmp")}));
  Value root = module(Value::Dict({{"p", Value::None()}}),
                      Value::Dict({{"r", Value::Tensor(at::ones({1}))}}),
                      Value::Dict({{"a", child}, {"gone", Value::None()}}), Value::None());
  ASSERT_OK_AND_ASSIGN(StateDict state, StateDictFromModule(root));
  EXPECT_THAT(state.keys(), ElementsAre("r", "a.w", "a.b"));
  EXPECT_EQ(state.entry(1).original_device, "cuda:0");
}

TEST(ExtractCheckpointBundleTest, SplitsATrainingBundle) {
  for (const std::string name : {"bundle.pt", "bundle_p4.pt"}) {
    ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path(name)));
    ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ExtractCheckpointBundle(file.root));
    EXPECT_EQ(bundle.model_key_path, "model");
    ExpectStateMatchesPython(name, bundle.model);
    EXPECT_EQ(bundle.epoch, 7);
    EXPECT_EQ(bundle.step, 1234);

    ASSERT_TRUE(bundle.optimizer.has_value());
    const Value& optimizer = *bundle.optimizer;
    const Value* state = optimizer.Find("state");
    ASSERT_NE(state, nullptr);
    ASSERT_EQ(state->entries().size(), 4u);
    for (int64_t index = 0; index < 4; ++index) {
      const Value* param_state = state->Find(index);
      ASSERT_NE(param_state, nullptr) << index;
      EXPECT_TRUE(param_state->Find("exp_avg")->is_tensor());
      EXPECT_TRUE(param_state->Find("exp_avg_sq")->is_tensor());
      EXPECT_NE(param_state->Find("step"), nullptr);
    }
    const Value& group = optimizer.Find("param_groups")->items()[0];
    EXPECT_EQ(*group.Find("lr"), Value::Float(1e-3));
    EXPECT_EQ(*group.Find("params"),
              Value::List({Value::Int(0), Value::Int(1), Value::Int(2), Value::Int(3)}));
    EXPECT_EQ(*group.Find("betas"), Value::Tuple({Value::Float(0.9), Value::Float(0.999)}));

    ASSERT_TRUE(bundle.scheduler.has_value());
    EXPECT_EQ(*bundle.scheduler->Find("step_size"), Value::Int(5));
    EXPECT_EQ(*bundle.scheduler->Find("gamma"), Value::Float(0.5));
    EXPECT_EQ(*bundle.scheduler->Find("last_epoch"), Value::Int(2));
    EXPECT_EQ(*bundle.scheduler->Find("base_lrs"), Value::List({Value::Float(1e-3)}));

    // What is left: numpy scalars as numbers, the config, the RNG state tensor.
    std::vector<std::string> extra_keys;
    for (const auto& [key, value] : bundle.extra.entries()) extra_keys.push_back(key.string_key());
    EXPECT_THAT(extra_keys,
                ElementsAre("epoch", "global_step", "best_acc", "np_count", "config", "rng"));
    EXPECT_EQ(*bundle.extra.Find("best_acc"), Value::Float(0.875));
    EXPECT_EQ(*bundle.extra.Find("np_count"), Value::Int(42));
    EXPECT_EQ(*bundle.extra.Find("config")->Find("layers"),
              Value::List({Value::Int(4), Value::Int(8), Value::Int(3)}));
    EXPECT_EQ(bundle.extra.Find("rng")->tensor().scalar_type(), at::kByte);
  }
}

TEST(ExtractCheckpointBundleTest, EveryTensorOfTheBundleMatchesPython) {
  ASSERT_OK_AND_ASSIGN(TorchFile file, ReadTorchFile(Fixtures().Path("bundle.pt")));
  int compared = 0;
  for (const ExpectedTensor& e : Fixtures().TensorsOf("bundle.pt")) {
    const Value* value = FindValueAtPath(file.root, e.path);
    ASSERT_NE(value, nullptr) << e.path;
    ASSERT_TRUE(value->is_tensor()) << e.path;
    EXPECT_TRUE(TensorMatches(value->tensor(), value->tensor_original_device(), e));
    ++compared;
  }
  EXPECT_EQ(compared, file.root.TensorCount());
}

TEST(ExtractCheckpointBundleTest, FindsANestedModelAndItsNeighbours) {
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ReadBundle("nested_bundle.pt"));
  EXPECT_EQ(bundle.model_key_path, "checkpoint/state_dict");
  ExpectStateMatchesPython("nested_bundle.pt", bundle.model);
  EXPECT_EQ(bundle.step, 99);
  EXPECT_EQ(bundle.epoch, -1);
  ASSERT_TRUE(bundle.optimizer.has_value());
  EXPECT_NE(bundle.optimizer->Find("param_groups"), nullptr);
  EXPECT_FALSE(bundle.scheduler.has_value());
  // The step is read, not taken: it stays where the producer put it, as an int.
  EXPECT_EQ(bundle.extra, Value::Dict({{"checkpoint", Value::Dict({{"step", Value::Int(99)}})}}));
}

TEST(ExtractCheckpointBundleTest, ReadsAWholeDataParallelModelInABundle) {
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ReadBundle("whole_dataparallel.pt"));
  EXPECT_EQ(bundle.model_key_path, "model");
  EXPECT_EQ(bundle.epoch, 3);
  ExpectStateMatchesPython("whole_dataparallel.pt", bundle.model);
}

TEST(ExtractCheckpointBundleTest, ReadsADistributedDataParallelStateDict) {
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ReadBundle("ddp.pt"));
  EXPECT_EQ(bundle.model_key_path, "");
  EXPECT_TRUE(bundle.extra.is_none());
  EXPECT_THAT(bundle.model.keys(),
              ElementsAre("module.0.weight", "module.0.bias", "module.2.weight", "module.2.bias"));
  ExpectStateMatchesPython("ddp.pt", bundle.model);
}

TEST(ExtractCheckpointBundleTest, TiedWeightsAndBatchNormBuffersOfAStateDict) {
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ReadBundle("tied_bn.pt"));
  const StateDict& model = bundle.model;
  EXPECT_TRUE(
      model.Find("embed.weight")->storage().is_alias_of(model.Find("head.weight")->storage()));
  EXPECT_EQ(model.Find("block.1.num_batches_tracked")->scalar_type(), at::kLong);
  EXPECT_EQ(model.Find("block.1.num_batches_tracked")->item<int64_t>(), 1);
  EXPECT_FALSE(model.contains("cache"));
  // Python's state_dict() and torch.save give the same tensors as the whole-model walk.
  ExpectStateMatchesPython("whole_model.pt", model);
}

TEST(ExtractCheckpointBundleTest, ReportsWhatItLookedAtWhenThereIsNoModel) {
  Value root = Value::Dict({{"epoch", Value::Int(1)}, {"notes", Value::String("x")}});
  EXPECT_THAT(ExtractCheckpointBundle(root),
              StatusIs(absl::StatusCode::kNotFound, "a dict with keys 'epoch', 'notes'"));
  EXPECT_THAT(ExtractCheckpointBundle(Value::Int(3)),
              StatusIs(absl::StatusCode::kNotFound, "no model state dict"));
}

TEST(ExtractCheckpointBundleTest, NeverTakesOptimizerStateForAModel) {
  Value adam_state = Value::Dict(
      {{"exp_avg", Value::Tensor(at::zeros({2}))}, {"exp_avg_sq", Value::Tensor(at::zeros({2}))}});
  Value optimizer =
      Value::Dict({{"state", Value::Dict({{0, adam_state}})}, {"param_groups", Value::List()}});
  EXPECT_THAT(ExtractCheckpointBundle(optimizer),
              StatusIs(absl::StatusCode::kNotFound, "no model state dict"));
  EXPECT_THAT(ExtractCheckpointBundle(Value::Dict({{"opt", optimizer}})),
              StatusIs(absl::StatusCode::kNotFound, "no model state dict"));
}

TEST(ExtractCheckpointBundleTest, AcceptsCountsStoredAsFloatsOrTensors) {
  Value root = Value::Dict({{"net", Value::Dict({{"w", Value::Tensor(at::ones({1}))}})},
                            {"epoch", Value::Float(4.0)},
                            {"iteration", Value::Tensor(at::scalar_tensor(12, at::kLong))},
                            {"lr_scheduler", Value::Dict({{"last_epoch", Value::Int(4)}})}});
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ExtractCheckpointBundle(root));
  EXPECT_EQ(bundle.model_key_path, "net");
  EXPECT_EQ(bundle.epoch, 4);
  EXPECT_EQ(bundle.step, 12);
  EXPECT_TRUE(bundle.scheduler.has_value());
  // Counts stay in `extra` with the producer's types (float, tensor).
  ASSERT_EQ(bundle.extra.entries().size(), 2u);
  EXPECT_EQ(*bundle.extra.Find("epoch"), Value::Float(4.0));
  EXPECT_TRUE(bundle.extra.Find("iteration")->is_tensor());
}

}  // namespace
}  // namespace ckpt
