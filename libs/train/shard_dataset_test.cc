#include "libs/train/shard_dataset.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/rand.h"
#include "ATen/ops/tensor.h"
#include "ATen/ops/zeros.h"
#include "absl/strings/str_cat.h"
#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ddp/distributed_sampler.h"
#include "libs/format/safetensors.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/python_runner.h"
#include "libs/train/dataset.h"

namespace ckpt::train::internal {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// Runs a Python snippet (real torch 1.13) through a script file.
void RunPythonSnippet(const std::string& name, const std::string& code) {
  const std::string script = TmpPath(name + ".py");
  std::ofstream(script) << code;
  ckpt::testing::RunPythonOrAddFailure(script, "");
}

// Example i of every shard below has inputs [i, i + 0.5] and label i % 3, so a row shows which
// example it is.
at::Tensor Inputs(int64_t first, int64_t count) {
  at::Tensor ids = at::arange(first, first + count, at::kDouble).unsqueeze(1);
  return at::cat({ids, ids + 0.5}, 1);
}

void WriteSafetensorsShard(const std::string& path, int64_t first, int64_t count) {
  StateDict tensors;
  ASSERT_OK(tensors.Insert("inputs", Inputs(first, count).to(at::kFloat)));
  ASSERT_OK(tensors.Insert("labels", at::arange(first, first + count, at::kLong).remainder(3)));
  ASSERT_OK(WriteSafetensorsFile(path, tensors, {}));
}

// A directory of three torch.save shards of 5, 3 and 4 examples (written by Python, names out
// of creation order) and one safetensors shard of 2: 14 examples in name order.
class ShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TmpPath(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    RunPythonSnippet("write_shards", absl::StrCat(R"(
import torch
def shard(path, first, count):
    ids = torch.arange(first, first + count, dtype=torch.float64).unsqueeze(1)
    torch.save({'x': torch.cat([ids, ids + 0.5], 1), 'y': torch.arange(first, first + count) % 3},
               path)
d = ')",
                                                  dir_, R"('
shard(d + '/part-2.pt', 8, 4)
shard(d + '/part-0.pt', 0, 5)
shard(d + '/part-1.pth', 5, 3)
open(d + '/README.txt', 'w').write('not a shard')
)"));
    WriteSafetensorsShard(dir_ + "/part-3.safetensors", 12, 2);
  }

  std::string dir_;
};

TEST_F(ShardsTest, ReadsEveryShardInNameOrderAsOneDataSet) {
  DataSpec spec;
  spec.source = "shards:" + dir_;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> data, OpenDataset(spec));
  EXPECT_EQ(data->size(), 14);
  EXPECT_THAT(data->shard_sizes(), ElementsAre(5, 3, 4, 2));
  EXPECT_THAT(data->example_shape(), ElementsAre(2));
  EXPECT_EQ(data->num_classes(), 3);
  EXPECT_EQ(data->Describe(),
            absl::StrCat("shards:", dir_, ": 4 file(s), 14 examples of [2], 3 classes"));
  // Rows from three shards, out of order, come back in the order asked.
  const Batch batch = data->Get({13, 0, 6, 4, 5});
  EXPECT_TRUE(at::equal(batch.inputs.select(1, 0), at::tensor({13.f, 0.f, 6.f, 4.f, 5.f})));
  EXPECT_TRUE(at::equal(batch.targets, at::tensor({1, 0, 0, 1, 2}, at::kLong)));
  EXPECT_EQ(batch.inputs.scalar_type(), at::kFloat);
}

TEST_F(ShardsTest, AGlobSelectsItsFiles) {
  DataSpec spec;
  spec.source = "shards:" + dir_ + "/part-[02].pt";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Dataset> data, OpenDataset(spec));
  EXPECT_THAT(data->shard_sizes(), ElementsAre(5, 4));
  EXPECT_TRUE(at::equal(data->Get({5}).inputs.select(1, 0), at::tensor({8.f})));
}

TEST_F(ShardsTest, AnEpochOfTwoRanksReadsEachShardOnceWithTwoResidentAtMost) {
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardedDataset> data, ShardedDataset::Open(dir_));
    ddp::DistributedSampler sampler(data->size(), rank, 2, /*shuffle=*/true, /*seed=*/7);
    sampler.set_block_sizes(data->shard_sizes());
    sampler.set_epoch(3);
    std::set<int64_t> seen;
    int64_t max_resident = 0;
    for (auto batch = sampler.NextBatch(2); !batch.empty(); batch = sampler.NextBatch(2)) {
      const Batch rows = data->Get(batch);
      data->Prefetch(sampler.Peek(2));
      for (int64_t i = 0; i < rows.inputs.size(0); ++i) {
        EXPECT_EQ(rows.inputs[i][0].item<float>(), static_cast<float>(batch[i]));
        seen.insert(batch[i]);
      }
      max_resident = std::max(max_resident, data->resident());
    }
    EXPECT_EQ(seen.size(), 7u) << "rank " << rank;  // half of 14, no padding needed
    EXPECT_LE(max_resident, 2) << "rank " << rank;
    EXPECT_EQ(data->loads(), 4) << "rank " << rank;  // each shard once
  }
}

TEST_F(ShardsTest, ShardsThatDisagreeAreNamed) {
  RunPythonSnippet("write_odd_shard", absl::StrCat(R"(
import torch
torch.save({'x': torch.zeros(2, 3), 'y': torch.tensor([0, 1])}, ')",
                                                   dir_, "/part-4.pt')\n"));
  EXPECT_THAT(ShardedDataset::Open(dir_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(dir_,
                                    "/part-4.pt has examples of inputs [3] Float and "
                                    "targets [] Long but ",
                                    dir_, "/part-0.pt has inputs [2] Float")));
}

TEST_F(ShardsTest, AShardWithoutLabelsIsNamedWithWhatItHolds) {
  RunPythonSnippet("write_unlabelled", absl::StrCat(R"(
import torch
torch.save({'x': torch.zeros(2, 2), 'weights': torch.ones(2)}, ')",
                                                    dir_, "/part-5.pt')\n"));
  EXPECT_THAT(ShardedDataset::Open(dir_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(dir_,
                                    "/part-5.pt: no targets (a tensor named 'y' or "
                                    "'targets' or 'labels'); it holds 'x', 'weights'")));
}

TEST_F(ShardsTest, AShardThatChangesUnderTheRunFailsTheBatchThatReadsIt) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ShardedDataset> data, ShardedDataset::Open(dir_));
  WriteSafetensorsShard(dir_ + "/part-3.safetensors", 12, 1);
  EXPECT_EQ(data->Get({0}).inputs.size(0), 1);
  try {
    data->Get({12});
    ADD_FAILURE() << "a changed shard was read";
  } catch (const c10::Error& error) {
    EXPECT_THAT(error.what_without_backtrace(),
                HasSubstr(absl::StrCat(dir_,
                                       "/part-3.safetensors changed since the run started: "
                                       "it held 2 examples")));
  }
}

TEST(ShardsErrorsTest, EmptyMissingAndSingleFileLocationsAreRefused) {
  const std::string empty = TmpPath("empty");
  std::filesystem::create_directories(empty);
  EXPECT_THAT(ShardedDataset::Open(empty).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds no .pt, .pth or .safetensors"));
  EXPECT_THAT(ShardedDataset::Open(TmpPath("nowhere")).status(),
              StatusIs(absl::StatusCode::kNotFound, "no such directory"));
  EXPECT_THAT(ShardedDataset::Open(empty + "/*.pt").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "matches no files"));
  const std::string file = TmpPath("one.safetensors");
  WriteSafetensorsShard(file, 0, 2);
  EXPECT_THAT(ShardedDataset::Open(file).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "use pt:FILE"));
}

TEST(CheckExamplesTest, FloatTargetsAreKeptAndIntegerOnesMustBeClassIds) {
  ASSERT_OK_AND_ASSIGN(Examples regression,
                       CheckExamples("f", at::zeros({4, 3}), at::rand({4, 2}, at::kDouble)));
  EXPECT_EQ(regression.targets.scalar_type(), at::kFloat);
  EXPECT_EQ(regression.num_classes, 0);
  EXPECT_THAT(CheckExamples("f", at::zeros({4, 3}), at::zeros({4, 2}, at::kLong)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be 1-D [N]"));
  EXPECT_THAT(CheckExamples("f", at::zeros({4, 3}), at::zeros({4}, at::kBool)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'y' has dtype Bool"));
  EXPECT_THAT(CheckExamples("f", at::zeros({0, 3}), at::zeros({0}, at::kLong)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "N > 0"));
  // An expanded view would be materialized at its claimed size: refused before converting.
  EXPECT_THAT(
      CheckExamples("f", at::zeros({1}).expand({1000000, 1000}), at::zeros({1000000}, at::kLong))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "'x' [1000000,1000] claims 4000000000 bytes from a storage of 4"));
}

}  // namespace
}  // namespace ckpt::train::internal
