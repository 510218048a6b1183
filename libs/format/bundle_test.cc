#include "libs/format/bundle.h"

#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/module_state.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Value Tensor(float value) { return Value::Tensor(at::full({2}, value)); }

Value OptimizerState() {
  Value group = Value::Dict({{"lr", Value::Float(0.1)},
                             {"momentum", Value::Float(0.9)},
                             {"nesterov", Value::Bool(false)},
                             {"foreach", Value::None()},
                             {"params", Value::List({Value::Int(0), Value::Int(1)})}});
  return Value::Dict({{"state", Value::Dict({{0, Value::Dict({{"momentum_buffer", Tensor(1)}})},
                                             {1, Value::Dict({{"momentum_buffer", Tensor(2)}})}})},
                      {"param_groups", Value::List({group})}});
}

Value Model() {
  return Value::OrderedDict({{"module.fc.weight", Tensor(3)}, {"module.fc.bias", Tensor(4)}});
}

// Splits `root` as an import does and puts it back together as an export does.
AssembledBundle RoundTrip(const Value& root) {
  absl::StatusOr<CheckpointBundle> bundle = ExtractCheckpointBundle(root);
  EXPECT_OK(bundle.status());
  BundleParts parts;
  std::vector<Value::Entry> model;
  for (const StateDict::Entry& entry : bundle->model) {
    model.emplace_back(DictKey(entry.key), Value::Tensor(entry.tensor));
  }
  parts.model = Value::Dict(std::move(model));
  parts.optimizer = bundle->optimizer;
  parts.scheduler = bundle->scheduler;
  parts.extra = bundle->extra;
  absl::StatusOr<AssembledBundle> assembled = AssembleBundle(bundle->layout, std::move(parts));
  EXPECT_OK(assembled.status());
  return assembled.ok() ? *std::move(assembled) : AssembledBundle();
}

std::vector<std::string> Keys(const Value& dict) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : dict.entries()) keys.push_back(key.DebugString());
  return keys;
}

TEST(BundleTest, RebuildsTheSavedDictInItsOrderWithItsTypes) {
  // The optimizer before the model, epoch in the middle: the order is the producer's, not ours.
  const Value root =
      Value::Dict({{"optimizer", OptimizerState()},
                   {"epoch", Value::Int(7)},
                   {"model", Model()},
                   {"best_acc", Value::Float(0.875)},
                   {"scheduler", Value::Dict({{"last_epoch", Value::Int(7)},
                                              {"_last_lr", Value::List({Value::Float(0.01)})}})},
                   {"note", Value::None()},
                   {"metric", Tensor(5)}});
  const AssembledBundle assembled = RoundTrip(root);
  EXPECT_EQ(assembled.root, root);
  EXPECT_THAT(Keys(assembled.root), ElementsAre("'optimizer'", "'epoch'", "'model'", "'best_acc'",
                                                "'scheduler'", "'note'", "'metric'"));
  EXPECT_TRUE(assembled.left_out.empty());
  EXPECT_FALSE(assembled.root.is_ordered_dict());
  EXPECT_TRUE(assembled.root.Find("model")->is_ordered_dict());
  EXPECT_FALSE(assembled.root.Find("optimizer")->Find("state")->Find(0)->is_ordered_dict());
  EXPECT_TRUE(assembled.root.Find("epoch")->is_int());
  EXPECT_TRUE(assembled.root.Find("best_acc")->is_float());
}

TEST(BundleTest, KeepsAPlainDictModelPlainAndNestedPartsWhereTheyWere) {
  const Value plain_model = Value::Dict({{"w", Tensor(1)}});
  const Value root =
      Value::OrderedDict({{"run", Value::String("r1")},
                          {"checkpoint", Value::Dict({{"step", Value::Float(12.0)},
                                                      {"state_dict", plain_model},
                                                      {"optimizer_state_dict", OptimizerState()},
                                                      {"tag", Value::String("x")}})}});
  const AssembledBundle assembled = RoundTrip(root);
  EXPECT_EQ(assembled.root, root);
  EXPECT_TRUE(assembled.root.is_ordered_dict());
  const Value* checkpoint = assembled.root.Find("checkpoint");
  ASSERT_NE(checkpoint, nullptr);
  EXPECT_THAT(Keys(*checkpoint),
              ElementsAre("'step'", "'state_dict'", "'optimizer_state_dict'", "'tag'"));
  EXPECT_FALSE(checkpoint->Find("state_dict")->is_ordered_dict());
  EXPECT_TRUE(checkpoint->Find("step")->is_float());
}

TEST(BundleTest, LeavesOutOpaqueObjectsAndNamesThem) {
  // torch 1.13's OneCycleLR pickles a bound method; a user class hides in a list of callbacks.
  const Value method = Value::Opaque(
      "builtins.getattr",
      Value::Tuple(
          {Value::Opaque("torch.optim.lr_scheduler.OneCycleLR", Value::None(), Value::None()),
           Value::String("_annealing_cos")}),
      Value::None());
  const Value root = Value::Dict(
      {{"model", Model()},
       {"opaque_first", Value::Opaque("mypkg.Config", Value::None(), Value::Dict())},
       {"optimizer", OptimizerState()},
       {"scheduler", Value::Dict({{"total_steps", Value::Int(10)}, {"anneal_func", method}})},
       {"callbacks",
        Value::List({Value::Int(1), Value::Opaque("mypkg.Hook", Value::None(), Value::None())})},
       {"fine", Value::List({Value::Dict(
                    {{"x", Value::Int(1)},
                     {"obj", Value::Opaque("mypkg.X", Value::None(), Value::None())}})})}});
  const AssembledBundle assembled = RoundTrip(root);
  EXPECT_THAT(Keys(assembled.root), ElementsAre("'model'", "'optimizer'", "'scheduler'", "'fine'"));
  EXPECT_THAT(Keys(*assembled.root.Find("scheduler")), ElementsAre("'total_steps'"));
  EXPECT_EQ(*assembled.root.Find("fine"), Value::List({Value::Dict({{"x", Value::Int(1)}})}));
  ASSERT_EQ(assembled.left_out.size(), 4u);
  EXPECT_THAT(assembled.left_out[0], HasSubstr("opaque_first: a mypkg.Config object"));
  EXPECT_THAT(assembled.left_out[1], HasSubstr("scheduler/anneal_func: a builtins.getattr object"));
  EXPECT_THAT(assembled.left_out[2],
              HasSubstr("callbacks: holds a mypkg.Hook object at callbacks/1"));
  EXPECT_THAT(assembled.left_out[3], HasSubstr("fine/0/obj: a mypkg.X object"));
}

TEST(BundleTest, ABareStateDictStaysABareStateDict) {
  const Value root = Model();
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ExtractCheckpointBundle(root));
  EXPECT_FALSE(IsBundleLayout(bundle.layout));
  BundleParts parts;
  parts.model = root;
  ASSERT_OK_AND_ASSIGN(AssembledBundle assembled, AssembleBundle(bundle.layout, parts));
  EXPECT_EQ(assembled.root, root);
  EXPECT_TRUE(assembled.root.is_ordered_dict());
}

TEST(BundleTest, AnAbsentPartIsLeftOutAndTheRestKeepsItsOrder) {
  const Value root = Value::Dict({{"epoch", Value::Int(1)},
                                  {"model", Model()},
                                  {"optimizer", OptimizerState()},
                                  {"best", Value::Float(1.5)}});
  ASSERT_OK_AND_ASSIGN(CheckpointBundle bundle, ExtractCheckpointBundle(root));
  EXPECT_TRUE(IsBundleLayout(bundle.layout));
  BundleParts parts;
  parts.model = Model();
  parts.extra = bundle.extra;  // no optimizer: retention dropped it.
  ASSERT_OK_AND_ASSIGN(AssembledBundle assembled, AssembleBundle(bundle.layout, parts));
  EXPECT_THAT(Keys(assembled.root), ElementsAre("'epoch'", "'model'", "'best'"));
}

TEST(BundleTest, RefusesALayoutThatDoesNotFitTheFields) {
  v1::BundleLayout layout;
  v1::BundleLayout::Placement* model = layout.add_placements();
  model->set_part(v1::BundleLayout::PART_MODEL);
  model->add_path()->set_string_key("checkpoint");
  model->add_path()->set_string_key("state_dict");
  BundleParts parts;
  parts.model = Model();
  parts.extra = Value::Dict({{"epoch", Value::Int(1)}});
  EXPECT_THAT(AssembleBundle(layout, parts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "belongs at 'checkpoint/state_dict', but the saved object has no dict"));

  v1::BundleLayout twice = layout;
  twice.mutable_placements(0)->mutable_path()->RemoveLast();
  *twice.add_placements() = twice.placements(0);
  EXPECT_THAT(AssembleBundle(twice, parts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "PART_MODEL placed twice"));

  v1::BundleLayout clash;
  *clash.add_placements() = twice.placements(0);
  clash.mutable_placements(0)->mutable_path(0)->set_string_key("epoch");
  EXPECT_THAT(AssembleBundle(clash, parts).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "both a part and another field"));
}

}  // namespace
}  // namespace ckpt
