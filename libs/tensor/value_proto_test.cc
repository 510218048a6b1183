#include "libs/tensor/value_proto.h"

#include <map>
#include <string>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

Value SchedulerAndOptimizerBundle() {
  Value step_state = Value::Dict();
  step_state.Set("momentum_buffer", Value::Tensor(at::arange(6, at::kFloat).reshape({2, 3})));
  Value state = Value::Dict();
  state.Set(0, step_state);
  Value root = Value::Dict();
  root.Set("state", state);
  root.Set("epoch", Value::Int(-3));
  root.Set("gamma", Value::Float(0.5));
  root.Set("name", Value::String("StepLR"));
  root.Set("blob", Value::Bytes(std::string("\0\xff", 2)));
  root.Set("nothing", Value::None());
  root.Set("flags", Value::Tuple({Value::Bool(true), Value::Bool(false)}));
  root.Set("lambda", Value::Opaque("mymodule.<lambda>", Value::Tuple({Value::Int(1)}), Value()));
  return root;
}

TEST(ValueProtoTest, RoundTripsEveryKindWithTensorsByReference) {
  std::map<std::string, at::Tensor> table;
  const Value original = SchedulerAndOptimizerBundle();
  ASSERT_OK_AND_ASSIGN(v1::Value proto,
                       ValueToProto(original,
                                    [&](const std::string& path,
                                        const at::Tensor& tensor) -> absl::StatusOr<std::string> {
                                      std::string key = "optimizer/" + path;
                                      table[key] = tensor;
                                      return key;
                                    }));
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table.begin()->first, "optimizer/state/0/momentum_buffer");

  // Through the wire format and back.
  v1::Value parsed;
  ASSERT_TRUE(parsed.ParseFromString(proto.SerializeAsString()));
  ASSERT_OK_AND_ASSIGN(
      Value back, ValueFromProto(parsed, [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
        return table.at(std::string(key));
      }));
  EXPECT_EQ(back, original) << back.DebugString();
}

TEST(ValueProtoTest, RegistrarErrorsStopTheConversion) {
  EXPECT_THAT(
      ValueToProto(SchedulerAndOptimizerBundle(),
                   [](const std::string&, const at::Tensor&) -> absl::StatusOr<std::string> {
                     return absl::ResourceExhaustedError("disk full");
                   }),
      StatusIs(absl::StatusCode::kResourceExhausted, "disk full"));
}

TEST(ValueProtoTest, RejectsMalformedTrees) {
  auto no_tensors = [](absl::string_view key) -> absl::StatusOr<at::Tensor> {
    return absl::NotFoundError(std::string("no tensor ") + std::string(key));
  };
  EXPECT_THAT(ValueFromProto(v1::Value(), no_tensors),
              StatusIs(absl::StatusCode::kInvalidArgument, "no kind"));

  v1::Value keyless;
  keyless.mutable_dict_value()->add_entries()->mutable_value()->set_int_value(1);
  EXPECT_THAT(ValueFromProto(keyless, no_tensors),
              StatusIs(absl::StatusCode::kInvalidArgument, "without a key"));

  v1::Value dangling;
  dangling.mutable_tensor_value()->set_key("optimizer/state/9/exp_avg");
  EXPECT_THAT(ValueFromProto(dangling, no_tensors),
              StatusIs(absl::StatusCode::kNotFound, "optimizer/state/9/exp_avg"));

  v1::Value deep;
  v1::Value* cursor = &deep;
  for (int i = 0; i < kMaxValueDepth + 5; ++i) cursor = cursor->mutable_list_value()->add_items();
  cursor->set_int_value(1);
  EXPECT_THAT(ValueFromProto(deep, no_tensors),
              StatusIs(absl::StatusCode::kInvalidArgument, "deeper than"));
}

TEST(DTypeProtoTest, ConvertsBothWaysAndRejectsUnknownValues) {
  EXPECT_EQ(DTypeToProto(DType::kBFloat16), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(DTypeFromProto(v1::DTYPE_COMPLEX64).value(), DType::kComplex64);
  EXPECT_THAT(DTypeFromProto(static_cast<v1::DType>(99)),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown dtype value 99"));
  EXPECT_THAT(DTypeFromProto(v1::DTYPE_UNSPECIFIED), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt
