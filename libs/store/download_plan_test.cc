#include "libs/store/download_plan.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/child_process.h"
#include "torch/torch.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DownloadPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = testing::TestCaseDir();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    // 1.5 chunks of float32, an empty tensor, a small one, and an optimizer state tensor.
    big_ = torch::arange(kChunkBytes * 3 / 2 / 4, torch::kFloat32);
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("encoder.weight", big_, "cpu"));
    ASSERT_OK(contents.model.Insert("encoder.empty", torch::zeros({0}), "cpu"));
    ASSERT_OK(contents.model.Insert("head.bias", torch::ones({3}), "cpu"));
    Value optimizer = Value::Dict();
    optimizer.Set("state",
                  Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(torch::ones({2}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict({{"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, store_->CommitCheckpoint("net", contents));
    ASSERT_OK_AND_ASSIGN(reader_, store_->OpenVersion(committed.version));
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::unique_ptr<VersionReader> reader_;
  at::Tensor big_;
};

TEST_F(DownloadPlanTest, HandsOutEveryNonEmptyChunkInOrderAndReadsIt) {
  v1::DownloadRequest request;
  request.set_include_state(true);
  ASSERT_OK_AND_ASSIGN(DownloadPlan plan, DownloadPlan::Create(reader_->manifest(), request));
  EXPECT_THAT(plan.tensor_indices(), ElementsAre(0, 1, 2, 3));
  std::vector<std::pair<int, int64_t>> seen;
  std::string big(static_cast<size_t>(big_.nbytes()), '\0');
  while (std::optional<DownloadPlan::Chunk> chunk = plan.NextChunk()) {
    seen.emplace_back(chunk->tensor_index, chunk->offset);
    std::string bytes(static_cast<size_t>(chunk->length), '\0');
    ASSERT_OK(plan.ReadChunk(*reader_, *chunk, bytes.data()));
    if (chunk->tensor_index == 0) {
      std::memcpy(big.data() + chunk->offset, bytes.data(), bytes.size());
    }
  }
  // The empty tensor has no chunk to send.
  EXPECT_THAT(seen,
              ElementsAre(std::pair<int, int64_t>{0, 0}, std::pair<int, int64_t>{0, kChunkBytes},
                          std::pair<int, int64_t>{2, 0}, std::pair<int, int64_t>{3, 0}));
  EXPECT_EQ(std::memcmp(big.data(), big_.data_ptr(), big.size()), 0);
  EXPECT_FALSE(plan.NextChunk().has_value());
}

TEST_F(DownloadPlanTest, SelectsByKeyAndPrefixAndNamesAMissingOrStateKey) {
  v1::DownloadRequest request;
  request.add_key_prefixes("head.");
  request.add_keys("encoder.empty");
  ASSERT_OK_AND_ASSIGN(DownloadPlan plan, DownloadPlan::Create(reader_->manifest(), request));
  EXPECT_THAT(plan.tensor_indices(), ElementsAre(1, 2));

  v1::DownloadRequest missing;
  missing.add_keys("decoder.weight");
  EXPECT_THAT(
      DownloadPlan::Create(reader_->manifest(), missing),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no tensor 'decoder.weight' in net@1")));
  const std::string state_key = reader_->manifest().state_tensors(0).key();
  v1::DownloadRequest state;
  state.add_keys(state_key);
  EXPECT_THAT(DownloadPlan::Create(reader_->manifest(), state),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("set include_state")));
  state.set_include_state(true);
  EXPECT_OK(DownloadPlan::Create(reader_->manifest(), state).status());
}

TEST_F(DownloadPlanTest, ADamagedManifestIsRefusedBeforeAnyByteIsRead) {
  v1::Manifest damaged = reader_->manifest();
  damaged.mutable_tensors(0)->mutable_chunks(0)->set_length(kChunkBytes * 64);
  EXPECT_THAT(DownloadPlan::Create(damaged, v1::DownloadRequest()),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'encoder.weight' of net@1 names a chunk of")));
  damaged = reader_->manifest();
  damaged.mutable_tensors(2)->set_byte_length(99);
  EXPECT_THAT(DownloadPlan::Create(damaged, v1::DownloadRequest()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("its byte_length is 99")));
}

}  // namespace
}  // namespace ckpt
