// WriteDcpDirectory: what it writes, real PyTorch loads (torch 1.13's DCP load_state_dict, run by
// testdata/dcp_fixtures.py, with 2.x's module names pointed at 1.13's classes), value for value;
// ckpt's own reader reads it back; nested dicts are flattened as 2.x's planner flattens them.

#include "libs/format/dcp_writer.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/scalar_tensor.h"
#include "ATen/ops/tensor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/dcp_reader.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

// As dcp_fixtures.py describes a state dict: "key|dtype|shape|hex" per tensor, "key=repr" else.
std::string Describe(const std::vector<std::pair<std::string, Value>>& flat) {
  std::string text;
  for (const auto& [key, value] : flat) {
    if (value.is_tensor()) {
      const at::Tensor bytes = value.tensor().contiguous();
      absl::StrAppend(&text, key, "|",
                      GetDTypeInfo(FromScalarType(bytes.scalar_type()).value()).name, "|",
                      absl::StrJoin(bytes.sizes(), ","), "|",
                      absl::BytesToHexString(absl::string_view(
                          static_cast<const char*>(bytes.data_ptr()), bytes.nbytes())),
                      "\n");
    } else {
      absl::StrAppend(&text, key, "=", value.DebugString(), "\n");
    }
  }
  return text;
}

Value Model() {
  at::manual_seed(3);
  return Value::OrderedDict({
      {"fc.weight", Value::Tensor(at::randn({3, 2}))},
      {"fc.bias", Value::Tensor(at::arange(3, at::kDouble))},
      {"embed.weight", Value::Tensor(at::randn({2, 2}).to(at::kBFloat16))},
      {"bn.num_batches_tracked", Value::Tensor(at::scalar_tensor(9, at::kLong))},
      {"mask", Value::Tensor(at::tensor({1, 0, 1}).to(at::kBool))},
  });
}

TEST(DcpWriterTest, PyTorchLoadsWhatItWritesValueForValue) {
  const std::string dir = TmpDir() + "/model.dcp";
  const Value model = Model();
  ASSERT_OK_AND_ASSIGN(DcpWriteReport report, WriteDcpDirectory(dir, model));
  EXPECT_EQ(report.tensors, 5);
  ASSERT_EQ(report.files.size(), 2u);
  EXPECT_EQ(report.files[0], dir + "/__0_0.distcp");
  std::vector<std::pair<std::string, Value>> flat;
  for (const auto& [key, value] : model.entries()) flat.emplace_back(key.string_key(), value);
  EXPECT_EQ(
      ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/dcp_fixtures.py", "load " + dir),
      Describe(flat));
  // And ckpt reads it back as it was.
  ASSERT_OK_AND_ASSIGN(DcpCheckpoint read, ReadDcpDirectory(dir));
  EXPECT_EQ(read.root, Value::Dict(model.entries()));
}

TEST(DcpWriterTest, NestedDictsAreFlattenedAsTorch2sPlannerFlattensThem) {
  const std::string dir = TmpDir() + "/bundle.dcp";
  const Value bundle = Value::Dict({{"model", Model()}, {"epoch", Value::Int(3)}});
  ASSERT_OK(WriteDcpDirectory(dir, bundle).status());
  std::vector<std::pair<std::string, Value>> flat;
  const Value model = Model();
  for (const auto& [key, value] : model.entries()) {
    flat.emplace_back("model." + key.string_key(), value);
  }
  flat.emplace_back("epoch", Value::Int(3));
  EXPECT_EQ(
      ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/dcp_fixtures.py", "load " + dir),
      Describe(flat));
  // planner_data nests them again on the way back.
  ASSERT_OK_AND_ASSIGN(DcpCheckpoint read, ReadDcpDirectory(dir));
  ASSERT_NE(read.root.Find("model"), nullptr) << read.root.DebugString();
  EXPECT_EQ(*read.root.Find("model"), Value::Dict(Model().entries()));
  EXPECT_EQ(*read.root.Find("epoch"), Value::Int(3));
}

TEST(DcpWriterTest, DeferredTensorsAreFetchedWhenWritten) {
  DeferredTensors deferred;
  int fetched = 0;
  const at::Tensor bytes = at::arange(12, at::kFloat).reshape({3, 4});
  ASSERT_OK_AND_ASSIGN(at::Tensor placeholder, deferred.Add(DType::kFloat32, {3, 4}, [&] {
    ++fetched;
    return absl::StatusOr<at::Tensor>(bytes);
  }));
  const std::string dir = TmpDir() + "/deferred.dcp";
  ASSERT_OK(
      WriteDcpDirectory(dir, Value::Dict({{"w", Value::Tensor(placeholder)}}), &deferred).status());
  EXPECT_EQ(fetched, 1);
  ASSERT_OK_AND_ASSIGN(DcpCheckpoint read, ReadDcpDirectory(dir));
  EXPECT_TRUE(at::equal(read.root.Find("w")->tensor(), bytes));
}

TEST(DcpWriterTest, KeysThatFlattenToOneNameAreRefused) {
  const Value clash =
      Value::Dict({{"a.b", Value::Int(1)}, {"a", Value::Dict({{"b", Value::Int(2)}})}});
  EXPECT_THAT(WriteDcpDirectory(TmpDir() + "/clash.dcp", clash),
              StatusIs(absl::StatusCode::kInvalidArgument, "two values flatten to the key 'a.b'"));
  EXPECT_THAT(WriteDcpDirectory(TmpDir() + "/list.dcp", Value::List()),
              StatusIs(absl::StatusCode::kInvalidArgument, "no dict"));
}

}  // namespace
}  // namespace ckpt
