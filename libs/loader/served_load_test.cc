#include "libs/loader/served_load.h"

#include <cstring>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/io/xxh3.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/child_process.h"
#include "torch/torch.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

class ServedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = testing::TestCaseDir();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    torch::manual_seed(3);
    weight_ = torch::randn({5, 3});
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("module.fc.weight", weight_, "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.fc.steps",
                                    torch::full({}, 9, torch::dtype(torch::kInt64)), "cpu"));
    Value optimizer = Value::Dict();
    optimizer.Set(
        "state",
        Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(torch::ones({5, 3}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict({{"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    Value extra = Value::Dict();
    extra.Set("epoch", Value::Int(4));
    extra.Set("rng", Value::Tensor(torch::arange(4, torch::dtype(torch::kUInt8))));
    contents.extra = extra;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, store_->CommitCheckpoint("net", contents));
    ASSERT_OK_AND_ASSIGN(reader_, store_->OpenVersion(committed.version));
    request_.mutable_ref()->CopyFrom(committed.version);
  }

  v1::LoadRequest Request(const LoadTarget& target) const {
    v1::LoadRequest request = request_;
    *request.mutable_target() = LoadTargetToProto(target);
    return request;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::unique_ptr<VersionReader> reader_;
  v1::LoadRequest request_;
  at::Tensor weight_;
};

TEST_F(ServedLoadTest, CastsFloatingTensorsOnlyAndDigestsWhatNoChunkNames) {
  LoadTarget target;
  target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  target.keys = KeyPolicy::AddPrefix("module.");
  target.include_optimizer = true;
  target.device = *ParseDevice("cuda:0");  // the consumer places tensors; the answer is CPU.
  ASSERT_OK_AND_ASSIGN(const ServedLoad load,
                       ServedLoad::Plan(reader_->manifest(), Request(target)));
  EXPECT_EQ(load.target().device, DeviceSpec::Cpu());
  // Two model tensors, then the state tensors (exp_avg; the extra entries' rng goes along as
  // stored, though the extra state itself was not asked for).
  ASSERT_EQ(load.tensors().size(), 4u);
  EXPECT_EQ(load.manifest().tensors_size(), 2);
  EXPECT_EQ(load.manifest().state_tensors_size(), 2);
  EXPECT_FALSE(load.manifest().has_extra_state());

  const ServedTensor& weight = load.tensors()[0];
  EXPECT_EQ(weight.sent->key(), "module.fc.weight");
  EXPECT_TRUE(weight.cast);
  EXPECT_TRUE(weight.needs_digest);  // cast bytes: no stored chunk names them.
  const ServedTensor& steps = load.tensors()[1];
  EXPECT_FALSE(steps.cast);          // integers are never cast.
  EXPECT_FALSE(steps.needs_digest);  // its stored chunks name its bytes.
  const ServedTensor& exp_avg = load.tensors()[2];
  EXPECT_EQ(exp_avg.index, 2);
  EXPECT_FALSE(exp_avg.cast);  // state tensors go as stored.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(load.wanted(i));

  ASSERT_OK_AND_ASSIGN(const at::Tensor cast, load.Cast(*reader_, weight));
  EXPECT_TRUE(cast.equal(weight_.to(torch::kBFloat16)));
  EXPECT_EQ(static_cast<int64_t>(cast.nbytes()), weight.sent->byte_length());
  std::string into(static_cast<size_t>(weight.sent->byte_length()), '\0');
  ASSERT_OK(load.CastInto(*reader_, weight, into.data()));
  EXPECT_EQ(std::memcmp(into.data(), cast.data_ptr(), into.size()), 0);
  const v1::TensorDigest digest = ServedLoad::Digest(0, into);
  EXPECT_EQ(digest.tensor_index(), 0);
  EXPECT_EQ(digest.byte_length(), weight.sent->byte_length());
  EXPECT_EQ(digest.xxh3_64(), Xxh3(into));
}

// The bundle's other entries (epoch, RNG state) only when asked for: what load_bundle through
// a loader needs to resume.
TEST_F(ServedLoadTest, TheExtraStateGoesWhenAskedFor) {
  ASSERT_OK_AND_ASSIGN(const ServedLoad weights,
                       ServedLoad::Plan(reader_->manifest(), Request(LoadTarget())));
  EXPECT_FALSE(weights.manifest().has_extra_state());
  EXPECT_EQ(weights.manifest().state_tensors_size(), 0);
  LoadTarget target;
  target.include_extra = true;
  EXPECT_TRUE(LoadTargetFromProto(LoadTargetToProto(target))->include_extra);
  ASSERT_OK_AND_ASSIGN(const ServedLoad bundle,
                       ServedLoad::Plan(reader_->manifest(), Request(target)));
  ASSERT_TRUE(bundle.manifest().has_extra_state());
  EXPECT_FALSE(bundle.manifest().has_optimizer_state());
  EXPECT_EQ(bundle.manifest().state_tensors_size(), 2);
  EXPECT_EQ(bundle.tensors().size(), 4u);
}

TEST_F(ServedLoadTest, OnlyTensorsSelectsAndOutOfRangeIsRefusedNamingTheVersion) {
  v1::LoadRequest request = Request(LoadTarget());
  request.mutable_only_tensors()->add_indexes(1);
  ASSERT_OK_AND_ASSIGN(const ServedLoad load, ServedLoad::Plan(reader_->manifest(), request));
  EXPECT_FALSE(load.wanted(0));
  EXPECT_TRUE(load.wanted(1));
  EXPECT_FALSE(load.tensors()[0].cast);  // Keep: nothing is cast.

  request.mutable_only_tensors()->add_indexes(2);  // two model tensors, no optimizer asked.
  EXPECT_THAT(ServedLoad::Plan(reader_->manifest(), request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("index 2 is outside the 2 tensors of the adapted net@")));
}

TEST_F(ServedLoadTest, BadTargetIsInvalidArgument) {
  v1::LoadRequest request = request_;
  request.mutable_target()->set_cast_floating_to(v1::DTYPE_INT64);  // not a floating dtype
  EXPECT_THAT(ServedLoad::Plan(reader_->manifest(), request),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt
