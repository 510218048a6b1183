#include "libs/tensor/value.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// What torch.optim.Adam(...).state_dict() looks like for two parameters.
Value AdamState() {
  Value state = Value::Dict();
  for (int index : {0, 1}) {
    Value param_state = Value::Dict();
    param_state.Set("step", Value::Tensor(at::full({}, 3.0)));
    param_state.Set("exp_avg", Value::Tensor(at::ones({2, 2}) * index, "cuda:1"));
    param_state.Set("exp_avg_sq", Value::Tensor(at::zeros({2, 2})));
    state.Set(index, std::move(param_state));
  }
  Value group = Value::Dict();
  group.Set("lr", Value::Float(0.001));
  group.Set("betas", Value::Tuple({Value::Float(0.9), Value::Float(0.999)}));
  group.Set("amsgrad", Value::Bool(false));
  group.Set("params", Value::List({Value::Int(0), Value::Int(1)}));
  Value root = Value::Dict();
  root.Set("state", std::move(state));
  root.Set("param_groups", Value::List({std::move(group)}));
  return root;
}

TEST(ValueTest, DefaultIsNone) {
  Value value;
  EXPECT_TRUE(value.is_none());
  EXPECT_EQ(value.DebugString(), "None");
}

TEST(ValueTest, DictKeepsInsertionOrderAndReplacesInPlace) {
  Value dict = Value::Dict();
  dict.Set("b", Value::Int(1));
  dict.Set("a", Value::Int(2));
  dict.Set(7, Value::String("int key"));
  dict.Set("b", Value::Int(3));
  ASSERT_EQ(dict.entries().size(), 3u);
  EXPECT_EQ(dict.entries()[0].first.string_key(), "b");
  EXPECT_EQ(dict.entries()[0].second.int_value(), 3);
  EXPECT_EQ(dict.entries()[2].first.int_key(), 7);
  EXPECT_EQ(dict.Find(7)->string_value(), "int key");
  EXPECT_EQ(dict.Find("missing"), nullptr);
  // An int key and the string of that int are different keys, as in Python.
  EXPECT_EQ(dict.Find("7"), nullptr);
}

TEST(ValueTest, ForEachTensorVisitsEveryTensorWithItsPath) {
  std::vector<std::string> paths;
  AdamState().ForEachTensor(
      [&](const std::string& path, const at::Tensor&) { paths.push_back(path); });
  EXPECT_THAT(paths, ElementsAre("state/0/step", "state/0/exp_avg", "state/0/exp_avg_sq",
                                 "state/1/step", "state/1/exp_avg", "state/1/exp_avg_sq"));
  EXPECT_EQ(AdamState().TensorCount(), 6);
}

TEST(ValueTest, TensorsRememberTheirOriginalDevice) {
  const Value state = AdamState();
  const Value& exp_avg = *state.Find("state")->Find(1)->Find("exp_avg");
  EXPECT_EQ(exp_avg.tensor_original_device(), "cuda:1");
  EXPECT_TRUE(exp_avg.tensor().device().is_cpu());
}

TEST(ValueTest, EqualityIsDeepAndComparesTensorBytes) {
  EXPECT_EQ(AdamState(), AdamState());
  Value changed = AdamState();
  changed.FindMutable("state")->FindMutable(0)->FindMutable("exp_avg")->mutable_tensor()[0][0] = 5;
  EXPECT_NE(AdamState(), changed);
  EXPECT_NE(Value::List({Value::Int(1)}), Value::Tuple({Value::Int(1)}));
  EXPECT_NE(Value::Int(1), Value::Float(1.0));  // Python's 1 == 1.0, but the types differ.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(Value::Float(nan), Value::Float(nan));
  EXPECT_EQ(Value::Tensor(at::full({2}, nan)), Value::Tensor(at::full({2}, nan)));
  EXPECT_NE(Value::Tensor(at::zeros({2})), Value::Tensor(at::zeros({2}, at::kDouble)));
}

TEST(ValueTest, OpaqueObjectsKeepClassArgsAndState) {
  Value state = Value::Dict();
  state.Set("last_epoch", Value::Int(4));
  const Value opaque = Value::Opaque("mypkg.schedulers.Warmup", Value::Tuple(), state);
  EXPECT_TRUE(opaque.is_opaque());
  EXPECT_EQ(opaque.opaque_class_name(), "mypkg.schedulers.Warmup");
  EXPECT_EQ(opaque.opaque_state().Find("last_epoch")->int_value(), 4);
  EXPECT_EQ(opaque.DebugString(),
            "<opaque mypkg.schedulers.Warmup args=() state={'last_epoch': 4}>");
}

TEST(ValueTest, DebugStringReadsLikePython) {
  EXPECT_EQ(AdamState().Find("param_groups")->DebugString(),
            "[{'lr': 0.001, 'betas': (0.9, 0.999), 'amsgrad': False, 'params': [0, 1]}]");
  EXPECT_EQ(Value::Tuple({Value::Int(1)}).DebugString(), "(1,)");
  EXPECT_EQ(Value::Tensor(at::zeros({3, 4})).DebugString(), "tensor(Float[3, 4])");
  EXPECT_EQ(Value::Bytes("\x01z").DebugString(), "b'\\x01z'");
}

TEST(ValueTest, AccessorOfTheWrongKindIsAProgrammerError) {
  EXPECT_ANY_THROW(Value::Int(1).float_value());
  EXPECT_ANY_THROW(Value::List().Find("x"));
}

}  // namespace
}  // namespace ckpt
