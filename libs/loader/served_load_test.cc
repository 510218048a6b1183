#include "libs/loader/served_load.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/randn.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/io/xxh3.h"
#include "libs/loader/chunk_cache.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ServedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = testing::TestCaseDir();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    at::manual_seed(3);
    weight_ = at::randn({5, 3});
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("module.fc.weight", weight_, "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.fc.steps",
                                    at::full({}, 9, at::dtype(at::kLong)), "cpu"));
    Value optimizer = Value::Dict();
    optimizer.Set(
        "state",
        Value::Dict({{0, Value::Dict({{"exp_avg", Value::Tensor(at::ones({5, 3}))}})}}));
    optimizer.Set("param_groups",
                  Value::List({Value::Dict({{"params", Value::List({Value::Int(0)})}})}));
    contents.optimizer = optimizer;
    Value extra = Value::Dict();
    extra.Set("epoch", Value::Int(4));
    extra.Set("rng", Value::Tensor(at::arange(4, at::dtype(at::kByte))));
    contents.extra = extra;
    ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "net", contents));
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
  EXPECT_TRUE(cast.equal(weight_.to(at::kBFloat16)));
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

// A sink that takes every tensor one way and records what it was given.
class RecordingSink final : public ServedLoadSink {
 public:
  explicit RecordingSink(Placement placement) : placement_(placement) {}

  Placement Place(const ServedTensor& tensor) override {
    placed.push_back(tensor.index);
    return placement_;
  }
  char* Destination(const ServedTensor& tensor) override {
    std::string& into = bytes[tensor.index];
    into.assign(static_cast<size_t>(tensor.sent->byte_length()), '\0');
    return into.data();
  }
  absl::Status Piece(const ServedTensor& tensor, int64_t offset, absl::string_view piece,
                     const std::shared_ptr<const void>& owner) override {
    std::string& received = bytes[tensor.index];
    EXPECT_EQ(offset, static_cast<int64_t>(received.size())) << "pieces come in order";
    received.append(piece.data(), piece.size());
    if (owner != nullptr) ++owned_pieces;
    if (--pieces_before_error == 0) return absl::CancelledError("the consumer went away");
    return absl::OkStatus();
  }
  absl::Status Digest(const v1::TensorDigest& digest) override {
    digests.push_back(digest);
    return absl::OkStatus();
  }

  std::vector<int> placed;
  std::map<int, std::string> bytes;
  std::vector<v1::TensorDigest> digests;
  int owned_pieces = 0;
  int pieces_before_error = -1;  // never, unless set.

 private:
  const Placement placement_;
};

// What every transport is handed, as pieces or into memory, with the cache or without: the sent
// bytes (cast where the target says, as stored otherwise) and the digest of the cast ones.
TEST_F(ServedLoadTest, SendHandsEveryTransportTheSameBytesAndDigests) {
  LoadTarget target;
  target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
  target.include_optimizer = true;
  ASSERT_OK_AND_ASSIGN(const ServedLoad load,
                       ServedLoad::Plan(reader_->manifest(), Request(target)));
  ASSERT_OK_AND_ASSIGN(const at::Tensor cast, load.Cast(*reader_, load.tensors()[0]));
  const std::string cast_bytes(static_cast<const char*>(cast.data_ptr()), cast.nbytes());
  const at::Tensor steps = at::full({}, 9, at::dtype(at::kLong));
  const std::string steps_bytes(static_cast<const char*>(steps.data_ptr()), steps.nbytes());
  const at::Tensor ones = at::ones({5, 3});
  const std::string exp_avg_bytes(static_cast<const char*>(ones.data_ptr()), ones.nbytes());

  ChunkCache cache(int64_t{1} << 20);
  for (const auto placement :
       {ServedLoadSink::Placement::kPieces, ServedLoadSink::Placement::kInto}) {
    for (ChunkCache* through : {&cache, static_cast<ChunkCache*>(nullptr)}) {
      SCOPED_TRACE(::testing::Message() << "placement " << static_cast<int>(placement)
                                        << (through != nullptr ? " through the cache" : ""));
      RecordingSink sink(placement);
      ASSERT_OK(load.Send(*reader_, through, /*digests=*/true, sink));
      // Every tensor has bytes (the extra state's rng goes along as stored, as above).
      EXPECT_THAT(sink.placed, ElementsAre(0, 1, 2, 3));
      EXPECT_EQ(sink.bytes[0], cast_bytes);
      EXPECT_EQ(sink.bytes[1], steps_bytes);
      EXPECT_EQ(sink.bytes[2], exp_avg_bytes);
      EXPECT_EQ(sink.bytes[3], std::string("\x00\x01\x02\x03", 4));
      // Only the cast tensor needs one: stored chunks name the others' bytes.
      ASSERT_EQ(sink.digests.size(), 1u);
      EXPECT_EQ(sink.digests[0].tensor_index(), 0);
      EXPECT_EQ(sink.digests[0].byte_length(), static_cast<int64_t>(cast_bytes.size()));
      EXPECT_EQ(sink.digests[0].xxh3_64(), Xxh3(cast_bytes));
      if (placement == ServedLoadSink::Placement::kPieces && through != nullptr) {
        EXPECT_EQ(sink.owned_pieces, 4) << "cached chunks and the cast come with their owners";
      }
    }
  }
  EXPECT_GT(cache.stats().hits, 0) << cache.stats().ToString();

  RecordingSink without_digests(ServedLoadSink::Placement::kPieces);
  ASSERT_OK(load.Send(*reader_, &cache, /*digests=*/false, without_digests));
  EXPECT_TRUE(without_digests.digests.empty());
}

TEST_F(ServedLoadTest, SendSkipsWhatTheSinkPlacedAndStopsAtItsError) {
  v1::LoadRequest request = Request(LoadTarget());
  request.mutable_only_tensors()->add_indexes(1);
  ASSERT_OK_AND_ASSIGN(const ServedLoad only_steps, ServedLoad::Plan(reader_->manifest(), request));
  RecordingSink skipping(ServedLoadSink::Placement::kSkip);
  ASSERT_OK(only_steps.Send(*reader_, nullptr, /*digests=*/true, skipping));
  EXPECT_THAT(skipping.placed, ElementsAre(1));  // the unwanted tensor is not even asked about.
  EXPECT_TRUE(skipping.bytes.empty());

  ASSERT_OK_AND_ASSIGN(const ServedLoad load,
                       ServedLoad::Plan(reader_->manifest(), Request(LoadTarget())));
  RecordingSink failing(ServedLoadSink::Placement::kPieces);
  failing.pieces_before_error = 1;
  EXPECT_THAT(load.Send(*reader_, nullptr, /*digests=*/true, failing),
              StatusIs(absl::StatusCode::kCancelled, "the consumer went away"));
  EXPECT_THAT(failing.placed, ElementsAre(0));  // nothing after the error.
}

TEST_F(ServedLoadTest, BadTargetIsInvalidArgument) {
  v1::LoadRequest request = request_;
  request.mutable_target()->set_cast_floating_to(v1::DTYPE_INT64);  // not a floating dtype
  EXPECT_THAT(ServedLoad::Plan(reader_->manifest(), request),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt
