// ReadDcpDirectory on directories real PyTorch wrote (torch 1.13's DCP FileSystemWriter, run by
// testdata/dcp_fixtures.py in setup): every tensor and value as saved, a sharded tensor
// assembled from its shards, and shards that overlap, leave a hole or lost their file refused
// naming the key.

#include "libs/format/dcp_reader.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/checkpoint_file.h"
#include "libs/status/status_matchers.h"
#include "libs/tensor/dtype.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

std::string Dir() { return std::string(std::getenv("TEST_TMPDIR")) + "/dcp"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// The description dcp_fixtures.py writes: "key|dtype|shape|hex" per tensor, "key=repr" else.
std::string Describe(const Value& root) {
  std::string text;
  for (const auto& [key, value] : root.entries()) {
    if (value.is_tensor()) {
      const at::Tensor bytes = value.tensor().contiguous();
      // ckpt's dtype names are PyTorch's without "torch.", as the script prints them.
      const absl::string_view dtype =
          GetDTypeInfo(FromScalarType(bytes.scalar_type()).value()).name;
      absl::StrAppend(&text, key.string_key(), "|", dtype, "|", absl::StrJoin(bytes.sizes(), ","),
                      "|",
                      absl::BytesToHexString(absl::string_view(
                          static_cast<const char*>(bytes.data_ptr()), bytes.nbytes())),
                      "\n");
    } else if (value.is_int()) {
      absl::StrAppend(&text, key.string_key(), "=", value.int_value(), "\n");
    } else if (value.is_bytes()) {
      absl::StrAppend(&text, key.string_key(), "=b'", value.string_value(), "'\n");
    } else {
      absl::StrAppend(&text, key.string_key(), "=", value.DebugString(), "\n");
    }
  }
  return text;
}

class DcpReaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/dcp_fixtures.py",
                                           "write " + Dir());
  }
};

TEST_F(DcpReaderTest, ReadsEveryValueOfAFlatStateDictAsSaved) {
  ASSERT_TRUE(IsDcpDirectory(Dir() + "/plain"));
  EXPECT_FALSE(IsDcpDirectory(Dir()));
  ASSERT_OK_AND_ASSIGN(DcpCheckpoint dcp, ReadDcpDirectory(Dir() + "/plain"));
  EXPECT_EQ(Describe(dcp.root), ReadFile(Dir() + "/plain.txt"));
  EXPECT_GT(dcp.file_bytes, 0u);
  EXPECT_TRUE(dcp.warnings.empty()) << absl::StrJoin(dcp.warnings, "\n");
}

TEST_F(DcpReaderTest, AssemblesAShardedTensorFromItsShards) {
  ASSERT_OK_AND_ASSIGN(DcpCheckpoint dcp, ReadDcpDirectory(Dir() + "/sharded"));
  EXPECT_EQ(Describe(dcp.root), ReadFile(Dir() + "/sharded.txt"));
}

// torch 2.x flattens a nested state dict and says how in planner_data: read back nested.
TEST_F(DcpReaderTest, NestsWhatA2xPlannerFlattened) {
  ASSERT_OK_AND_ASSIGN(DcpCheckpoint dcp, ReadDcpDirectory(Dir() + "/nested"));
  const Value* model = dcp.root.Find("model");
  const Value* optim = dcp.root.Find("optim");
  ASSERT_NE(model, nullptr) << dcp.root.DebugString();
  ASSERT_NE(optim, nullptr) << dcp.root.DebugString();
  const Value* state = optim->Find("state");
  ASSERT_NE(state, nullptr);
  const Value* fc = state->Find("fc.weight");  // keyed by parameter name, as get_state_dict does
  ASSERT_NE(fc, nullptr) << optim->DebugString();
  // An int in the path is a list position: param_groups comes back a list.
  const Value* groups = optim->Find("param_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_TRUE(groups->is_list()) << groups->DebugString();
  ASSERT_EQ(groups->items().size(), 1u);
  // The values, flattened again, are those saved.
  const Value flat = Value::Dict({{"model.fc.weight", *model->Find("fc.weight")},
                                  {"model.fc.bias", *model->Find("fc.bias")},
                                  {"optim.state.fc.weight.step", *fc->Find("step")},
                                  {"optim.param_groups.0.lr", *groups->items()[0].Find("lr")},
                                  {"epoch", *dcp.root.Find("epoch")}});
  EXPECT_EQ(Describe(flat), ReadFile(Dir() + "/nested.txt"));
}

TEST_F(DcpReaderTest, ShardsThatDoNotTileTheirTensorAreRefusedNamingTheKey) {
  EXPECT_THAT(ReadDcpDirectory(Dir() + "/overlap"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'table' of shape [4, 3]: its chunks at [0, 0] (size [2, 3]) and [1, 0] "
                       "(size [2, 3]) overlap"));
  EXPECT_THAT(ReadDcpDirectory(Dir() + "/hole"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'table' of shape [4, 3]: its chunks cover 6 of its 12 elements: a shard "
                       "is missing"));
  EXPECT_THAT(ReadDcpDirectory(Dir() + "/nofile"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(DcpReaderTest, NotADcpDirectoryIsRefused) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/not-dcp";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/.metadata", std::ios::binary);
    out << "\x80\x04K\x07.";  // pickle.dumps(7)
  }
  EXPECT_THAT(ReadDcpDirectory(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a torch.distributed.checkpoint"));
}

// `ckpt import` and `inspect` read a DCP directory through ReadCheckpointFile.
TEST_F(DcpReaderTest, ReadCheckpointFileTakesADcpDirectory) {
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/sharded"));
  EXPECT_EQ(file.format, CheckpointFormat::kDcp);
  EXPECT_EQ(CheckpointFormatName(file.format), "dcp");
  EXPECT_EQ(Describe(file.root), ReadFile(Dir() + "/sharded.txt"));
  EXPECT_NE(file.bundle.model.Find("table"), nullptr);
  // A 2.x training checkpoint's model is found under its key, as in a torch.save bundle.
  ASSERT_OK_AND_ASSIGN(CheckpointFile nested, ReadCheckpointFile(Dir() + "/nested"));
  EXPECT_NE(nested.bundle.model.Find("fc.weight"), nullptr);
}

}  // namespace
}  // namespace ckpt
