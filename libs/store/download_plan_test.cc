#include "libs/store/download_plan.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/child_process.h"

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
    big_ = at::arange(kChunkBytes * 3 / 2 / 4, at::kFloat);
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("encoder.weight", big_, "cpu"));
    ASSERT_OK(contents.model.Insert("encoder.empty", at::zeros({0}), "cpu"));
    ASSERT_OK(contents.model.Insert("head.bias", at::ones({3}), "cpu"));
    Value optimizer = Value::Dict();
    optimizer.Set("state",
                  Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(at::ones({2}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict({{"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents));
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

// A ranged download sends the whole chunks holding each range, tensors in manifest order.
TEST_F(DownloadPlanTest, RangesSendTheWholeChunksHoldingThemInManifestOrder) {
  v1::DownloadRequest request;
  request.set_include_state(true);
  v1::TensorByteRange* state = request.add_ranges();
  state->set_key("optimizer/state/0/exp_avg");
  state->set_begin(4);
  state->set_end(8);
  v1::TensorByteRange* second_chunk = request.add_ranges();
  second_chunk->set_key("encoder.weight");
  second_chunk->set_begin(kChunkBytes + 4);
  second_chunk->set_end(kChunkBytes + 8);
  v1::TensorByteRange* empty = request.add_ranges();
  empty->set_key("head.bias");
  empty->set_begin(4);
  empty->set_end(4);
  ASSERT_OK_AND_ASSIGN(DownloadPlan plan, DownloadPlan::Create(reader_->manifest(), request));
  EXPECT_THAT(plan.tensor_indices(), ElementsAre(0, 2, 3));
  std::vector<std::pair<int, int64_t>> seen;
  while (std::optional<DownloadPlan::Chunk> chunk = plan.NextChunk()) {
    seen.emplace_back(chunk->tensor_index, chunk->offset);
    std::string bytes(static_cast<size_t>(chunk->length), '\0');
    ASSERT_OK(plan.ReadChunk(*reader_, *chunk, bytes.data()));
    if (chunk->tensor_index == 0) {
      EXPECT_EQ(chunk->length, big_.nbytes() - kChunkBytes);
      EXPECT_EQ(std::memcmp(bytes.data(), static_cast<const char*>(big_.data_ptr()) + kChunkBytes,
                            bytes.size()),
                0);
    }
  }
  EXPECT_THAT(seen,
              ElementsAre(std::pair<int, int64_t>{0, kChunkBytes}, std::pair<int, int64_t>{3, 0}));
}

TEST_F(DownloadPlanTest, BadRangesAreRefusedNamingTheTensor) {
  auto plan_for = [&](const std::string& key, int64_t begin, int64_t end, bool include_state) {
    v1::DownloadRequest request;
    request.set_include_state(include_state);
    v1::TensorByteRange* range = request.add_ranges();
    range->set_key(key);
    range->set_begin(begin);
    range->set_end(end);
    return DownloadPlan::Create(reader_->manifest(), request).status();
  };
  EXPECT_THAT(plan_for("head.bias", 0, 13, false),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("bytes 0..13 of tensor 'head.bias' of net@1: it holds 12 bytes")));
  EXPECT_THAT(plan_for("head.bias", 5, 4, false), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(plan_for("optimizer/state/0/exp_avg", 0, 4, false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("set include_state")));
  EXPECT_THAT(plan_for("no.such", 0, 0, true), StatusIs(absl::StatusCode::kNotFound));
  v1::DownloadRequest twice;
  for (int i = 0; i < 2; ++i) {
    v1::TensorByteRange* range = twice.add_ranges();
    range->set_key("head.bias");
    range->set_end(4);
  }
  EXPECT_THAT(DownloadPlan::Create(reader_->manifest(), twice).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("two byte ranges")));
  v1::DownloadRequest mixed = twice;
  mixed.mutable_ranges()->RemoveLast();
  mixed.add_keys("head.bias");
  EXPECT_THAT(DownloadPlan::Create(reader_->manifest(), mixed).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not both")));
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
