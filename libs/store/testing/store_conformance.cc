#include "libs/store/testing/store_conformance.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ATen/Context.h"
#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "ATen/ops/quantize_per_channel.h"
#include "ATen/ops/quantize_per_tensor.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/tensor.h"
#include "ATen/ops/zeros.h"
#include "gmock/gmock.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/version_ref.h"

namespace ckpt::testing {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Every byte, dtype and shape equal.
void ExpectSameTensor(const at::Tensor& actual, const at::Tensor& expected,
                      const std::string& what) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const at::Tensor a = actual.contiguous();
  const at::Tensor b = expected.contiguous();
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  if (a.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what;
  }
}

std::string TensorBytes(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
}

at::Tensor Seeded(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape);
}

StateDict MakeStateDict(std::vector<std::pair<std::string, at::Tensor>> entries) {
  StateDict state_dict;
  for (auto& [key, tensor] : entries) EXPECT_OK(state_dict.Insert(key, tensor));
  return state_dict;
}

CheckpointContents WeightsOnly(std::vector<std::pair<std::string, at::Tensor>> entries) {
  CheckpointContents contents;
  contents.model = MakeStateDict(std::move(entries));
  return contents;
}

v1::VersionRef Ref(absl::string_view text) {
  absl::StatusOr<v1::VersionRef> ref = ParseVersionRef(text);
  EXPECT_OK(ref.status());
  return ref.value_or(v1::VersionRef());
}

// An Adam-like optimizer state dict for `params` parameters with the shapes of `like`.
Value AdamState(const std::vector<at::Tensor>& like, int64_t step, uint64_t seed) {
  Value state = Value::Dict();
  std::vector<Value> params;
  for (size_t i = 0; i < like.size(); ++i) {
    Value per_param = Value::Dict();
    per_param.Set("step", Value::Tensor(at::full({}, static_cast<double>(step))));
    per_param.Set("exp_avg", Value::Tensor(Seeded(like[i].sizes().vec(), seed + i)));
    per_param.Set("exp_avg_sq", Value::Tensor(Seeded(like[i].sizes().vec(), seed + 100 + i).abs()));
    state.Set(static_cast<int64_t>(i), per_param);
    params.push_back(Value::Int(static_cast<int64_t>(i)));
  }
  Value group = Value::Dict();
  group.Set("lr", Value::Float(1e-3));
  group.Set("betas", Value::Tuple({Value::Float(0.9), Value::Float(0.999)}));
  group.Set("eps", Value::Float(1e-8));
  group.Set("amsgrad", Value::Bool(false));
  group.Set("params", Value::List(params));
  Value optimizer = Value::Dict();
  optimizer.Set("state", state);
  optimizer.Set("param_groups", Value::List({group}));
  return optimizer;
}

Value StepLrState(int64_t last_epoch) {
  Value scheduler = Value::Dict();
  scheduler.Set("step_size", Value::Int(30));
  scheduler.Set("gamma", Value::Float(0.1));
  scheduler.Set("base_lrs", Value::List({Value::Float(1e-3)}));
  scheduler.Set("last_epoch", Value::Int(last_epoch));
  scheduler.Set("_step_count", Value::Int(last_epoch + 1));
  scheduler.Set("_last_lr", Value::List({Value::Float(1e-3)}));
  return scheduler;
}

v1::Manifest OneTensorHeader(const std::string& key, int64_t bytes) {
  v1::Manifest header;
  v1::TensorMeta* meta = header.add_tensors();
  meta->set_key(key);
  meta->set_dtype(v1::DTYPE_UINT8);
  meta->add_shape(bytes);
  meta->set_byte_length(bytes);
  return header;
}

void StoreConformanceTest::SetUp() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '_');  // "Case/param" of a parameterized test.
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  harness_ = GetParam().make(dir);
  ASSERT_NE(harness_, nullptr);
  store_ = &harness_->store();
}

void StoreConformanceTest::TearDown() {
  store_ = nullptr;
  harness_.reset();
}

CommitResult StoreConformanceTest::MustCommit(const std::string& model,
                                              const CheckpointContents& contents,
                                              const CommitOptions& options) {
  absl::StatusOr<CommitResult> result = CommitCheckpoint(*store_, model, contents, options);
  EXPECT_OK(result.status());
  return result.value_or(CommitResult());
}

TEST_P(StoreConformanceTest, RoundTripsMixedDTypesByteForByte) {
  const at::Tensor wide = Seeded({6, 8}, 1);
  const at::Tensor big = Seeded({10 * kMiB / 4}, 2);  // 10 MiB: chunks of 4 + 4 + 2 MiB.
  const at::Tensor exact = Seeded({2 * kMiB}, 3);     // 8 MiB: exactly two chunks.
  CheckpointContents contents = WeightsOnly({
      {"fc.weight", Seeded({3, 4}, 4)},
      {"emb.bf16", Seeded({5}, 5).to(at::kBFloat16)},
      {"ids", at::arange(7, at::kLong)},
      {"mask", at::arange(9) % 2 == 0},
      {"transposed", wide.t()},  // not contiguous
      {"scale", at::full({}, 3.25, at::kDouble)},
      {"empty", at::empty({0, 3})},
      {"big", big},
      {"exact", exact},
  });
  ASSERT_FALSE(contents.model.Find("transposed")->is_contiguous());
  const CommitResult committed = MustCommit("mixed", contents);
  EXPECT_EQ(FormatVersionRef(committed.version), "mixed@1");
  EXPECT_EQ(committed.logical_bytes, contents.model.TotalBytes());
  EXPECT_EQ(committed.new_bytes, contents.model.TotalBytes());

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("mixed")));
  ASSERT_EQ(loaded.contents.model.size(), contents.model.size());
  for (size_t i = 0; i < contents.model.size(); ++i) {
    const StateDict::Entry& expected = contents.model.entry(i);
    const StateDict::Entry& actual = loaded.contents.model.entry(i);
    EXPECT_EQ(actual.key, expected.key);
    EXPECT_EQ(actual.original_device, "cpu");
    EXPECT_TRUE(actual.tensor.is_contiguous());
    ExpectSameTensor(actual.tensor, expected.tensor, expected.key);
  }
  EXPECT_FALSE(loaded.contents.optimizer.has_value());
  EXPECT_TRUE(loaded.contents.extra.is_none());

  // The manifest describes chunks and content hashes.
  const v1::Manifest& manifest = loaded.manifest;
  EXPECT_EQ(manifest.model(), "mixed");
  EXPECT_EQ(manifest.version(), 1);
  const v1::TensorMeta& big_meta = manifest.tensors(7);
  ASSERT_EQ(big_meta.chunks_size(), 3);
  EXPECT_EQ(big_meta.chunks(0).length(), 4 * kMiB);
  EXPECT_EQ(big_meta.chunks(2).length(), 2 * kMiB);
  EXPECT_EQ(big_meta.content_hash(), ContentHashOfBytes(TensorBytes(big)));
  EXPECT_EQ(big_meta.chunks(1).sha256(),
            Sha256(absl::string_view(TensorBytes(big)).substr(4 * kMiB, 4 * kMiB)));
  EXPECT_EQ(manifest.tensors(8).chunks_size(), 2);
  EXPECT_EQ(manifest.tensors(6).chunks_size(), 0);  // empty
  EXPECT_EQ(manifest.tensors(6).content_hash(), Sha256(""));
  EXPECT_EQ(manifest.tensors(5).shape_size(), 0);  // scalar
  EXPECT_GT(manifest.metadata().created_unix_micros(), 0);

  // One tensor, and the chunk-level stream of a version's reader. (The store-level
  // ReadTensorChunks(meta) is not part of this contract: a remote store has no way to read by
  // chunk list and says so.)
  ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*store_, "mixed", 1, "transposed"));
  ExpectSameTensor(read, wide.t(), "transposed");
  std::string streamed;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader,
                       store_->OpenVersion(MakeVersionRef("mixed", 1)));
  ASSERT_OK(reader->ReadTensorChunks(big_meta, [&](int64_t offset, absl::string_view bytes) {
    EXPECT_EQ(offset, static_cast<int64_t>(streamed.size()));
    streamed.append(bytes.data(), bytes.size());
    return absl::OkStatus();
  }));
  EXPECT_EQ(streamed, TensorBytes(big));
  EXPECT_THAT(ReadTensor(*store_, "mixed", 1, "nope"),
              StatusIs(absl::StatusCode::kNotFound, "no tensor 'nope' in mixed@1"));
}

TEST_P(StoreConformanceTest, RoundTripsQuantizedTensors) {
  const at::Tensor per_tensor = at::quantize_per_tensor(Seeded({4, 4}, 1), 0.05, 3, at::kQInt8);
  const at::Tensor per_channel =
      at::quantize_per_channel(Seeded({3, 5}, 2), at::tensor(std::vector<double>{0.1, 0.2, 0.3}),
                               at::tensor(std::vector<int64_t>{0, 1, 2}), 0, at::kQUInt8);
  MustCommit("quantized", WeightsOnly({{"q", per_tensor}, {"qc", per_channel}}));
  ASSERT_OK_AND_ASSIGN(at::Tensor q, ReadTensor(*store_, "quantized", 1, "q"));
  EXPECT_EQ(q.qscheme(), at::kPerTensorAffine);
  EXPECT_EQ(q.q_scale(), 0.05);
  EXPECT_EQ(q.q_zero_point(), 3);
  EXPECT_TRUE(at::equal(q.int_repr(), per_tensor.int_repr()));
  ASSERT_OK_AND_ASSIGN(at::Tensor qc, ReadTensor(*store_, "quantized", 1, "qc"));
  EXPECT_TRUE(at::equal(qc.q_per_channel_scales(), per_channel.q_per_channel_scales()));
  EXPECT_TRUE(at::equal(qc.int_repr(), per_channel.int_repr()));
  EXPECT_TRUE(at::equal(qc.dequantize(), per_channel.dequantize()));
}

TEST_P(StoreConformanceTest, NormalizesDdpPrefixAndRecordsIt) {
  CheckpointContents contents = WeightsOnly({
      {"module.encoder.weight", Seeded({4, 4}, 1)},
      {"module.encoder.bias", Seeded({4}, 2)},
  });
  contents.optimizer = AdamState({Seeded({4, 4}, 0), Seeded({4}, 0)}, 1, 10);
  contents.optimizer_param_names = {{0, "module.encoder.weight"}, {1, "encoder.bias"}};
  MustCommit("ddp", contents);

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("ddp@1")));
  EXPECT_THAT(loaded.contents.model.keys(), ElementsAre("encoder.weight", "encoder.bias"));
  ExpectSameTensor(*loaded.contents.model.Find("encoder.weight"),
                   *contents.model.Find("module.encoder.weight"), "weight");
  const v1::KeyNormalization& normalization = loaded.manifest.metadata().key_normalization();
  EXPECT_EQ(normalization.stripped_prefix(), "module.");
  EXPECT_THAT(normalization.wrappers(), ElementsAre("ddp"));
  EXPECT_EQ(loaded.manifest.tensors(0).original_key(), "module.encoder.weight");
  EXPECT_THAT(loaded.contents.optimizer_param_names,
              ElementsAre(std::make_pair(0, "encoder.weight"), std::make_pair(1, "encoder.bias")));
}

TEST_P(StoreConformanceTest, KeepsKeysAsGivenWhenNormalizationIsOff) {
  CommitOptions options;
  options.normalize_keys = false;
  MustCommit("raw", WeightsOnly({{"module.w", Seeded({2}, 1)}}), options);
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("raw")));
  EXPECT_EQ(manifest.tensors(0).key(), "module.w");
}

TEST_P(StoreConformanceTest, OptimizerSchedulerAndExtraRoundTripEqual) {
  const at::Tensor weight = Seeded({16, 8}, 1);
  const at::Tensor bias = Seeded({16}, 2);
  CheckpointContents contents = WeightsOnly({
      {"fc.weight", weight},
      {"fc.bias", bias},
      {"bn.num_batches_tracked", at::full({}, 7, at::kLong)},
  });
  contents.optimizer = AdamState({weight, bias}, 12, 20);
  contents.scheduler = StepLrState(12);
  Value extra = Value::Dict();
  extra.Set("epoch", Value::Int(3));
  extra.Set("rng_state", Value::Tensor(at::arange(16, at::kByte)));
  extra.Set("note", Value::String("resume here"));
  extra.Set("none", Value::None());
  contents.extra = extra;
  contents.metadata.set_epoch(3);
  contents.metadata.set_global_step(1200);
  (*contents.metadata.mutable_metrics())["loss"] = 0.25;
  contents.optimizer_param_names = {{0, "fc.weight"}, {1, "fc.bias"}};
  const CommitResult committed = MustCommit("resume", contents);
  EXPECT_THAT(committed.warnings, IsEmpty());

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("resume@1")));
  ASSERT_TRUE(loaded.contents.optimizer.has_value());
  EXPECT_EQ(*loaded.contents.optimizer, *contents.optimizer)
      << loaded.contents.optimizer->DebugString();
  ASSERT_TRUE(loaded.contents.scheduler.has_value());
  EXPECT_EQ(*loaded.contents.scheduler, *contents.scheduler);
  EXPECT_EQ(loaded.contents.extra, contents.extra) << loaded.contents.extra.DebugString();
  EXPECT_EQ(loaded.contents.metadata.epoch(), 3);
  EXPECT_EQ(loaded.contents.metadata.global_step(), 1200);
  EXPECT_EQ(loaded.contents.metadata.metrics().at("loss"), 0.25);

  std::vector<std::string> state_keys;
  for (const v1::TensorMeta& meta : loaded.manifest.state_tensors())
    state_keys.push_back(meta.key());
  EXPECT_THAT(state_keys, ElementsAre("optimizer/state/0/step", "optimizer/state/0/exp_avg",
                                      "optimizer/state/0/exp_avg_sq", "optimizer/state/1/step",
                                      "optimizer/state/1/exp_avg", "optimizer/state/1/exp_avg_sq",
                                      "extra/rng_state"));
  ASSERT_OK_AND_ASSIGN(at::Tensor exp_avg,
                       ReadTensor(*store_, "resume", 1, "optimizer/state/1/exp_avg"));
  ExpectSameTensor(exp_avg, contents.optimizer->Find("state")->Find(1)->Find("exp_avg")->tensor(),
                   "exp_avg");
}

TEST_P(StoreConformanceTest, VersionsIncrementAndRefsResolve) {
  for (int i = 1; i <= 3; ++i) {
    const CommitResult committed = MustCommit("m", WeightsOnly({{"w", at::full({4}, 1.0 * i)}}));
    EXPECT_EQ(committed.version.version(), i);
  }
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store_->GetManifest(Ref("m")));
  EXPECT_EQ(latest.version(), 3);
  ASSERT_OK_AND_ASSIGN(v1::Manifest second, store_->GetManifest(Ref("m@2")));
  EXPECT_EQ(second.version(), 2);
  ASSERT_OK_AND_ASSIGN(at::Tensor w, ReadTensor(*store_, "m", 2, "w"));
  EXPECT_TRUE(at::equal(w, at::full({4}, 2.0)));

  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store_->ListVersions("m"));
  ASSERT_EQ(versions.size(), 3u);
  EXPECT_EQ(versions[0].version(), 1);
  EXPECT_EQ(versions[2].version(), 3);
  EXPECT_EQ(versions[2].logical_bytes(), 16);
  EXPECT_EQ(versions[2].tensor_count(), 1);
  EXPECT_FALSE(versions[2].has_optimizer_state());

  MustCommit("other", WeightsOnly({{"w", at::full({4}, 1)}}));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].name(), "m");
  EXPECT_EQ(models[0].latest_version(), 3);
  EXPECT_EQ(models[0].version_count(), 3);
  EXPECT_EQ(models[0].logical_bytes(), 48);
  EXPECT_EQ(models[1].name(), "other");
}

TEST_P(StoreConformanceTest, MissingRefsAreNotFoundNamingTheRef) {
  MustCommit("m", WeightsOnly({{"w", at::ones({2})}}));
  EXPECT_THAT(store_->GetManifest(Ref("m@9")), StatusIs(absl::StatusCode::kNotFound, "m@9"));
  EXPECT_THAT(store_->GetManifest(Ref("m@best")),
              StatusIs(absl::StatusCode::kNotFound, "m@best not found: model 'm' has no alias"));
  EXPECT_THAT(store_->GetManifest(Ref("ghost")),
              StatusIs(absl::StatusCode::kNotFound, "ghost@latest: no model 'ghost'"));
  EXPECT_THAT(store_->ListVersions("ghost"), StatusIs(absl::StatusCode::kNotFound, "ghost"));
}

TEST_P(StoreConformanceTest, AliasesMoveAtomicallyWithCompareAndSet) {
  for (int i = 1; i <= 3; ++i) MustCommit("m", WeightsOnly({{"w", at::full({2}, i)}}));
  ASSERT_OK_AND_ASSIGN(int64_t previous, store_->SetAlias("m", "best", 1, kAliasMustNotExist));
  EXPECT_EQ(previous, 0);
  EXPECT_THAT(store_->SetAlias("m", "best", 2, kAliasMustNotExist),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "alias m@best points at version 1; expected it not to exist"));
  EXPECT_THAT(store_->SetAlias("m", "best", 2, -2), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(previous, store_->SetAlias("m", "best", 2, /*expected_current=*/1));
  EXPECT_EQ(previous, 1);
  EXPECT_THAT(store_->SetAlias("m", "best", 3, /*expected_current=*/1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "alias m@best points at version 2; expected version 1"));
  ASSERT_OK_AND_ASSIGN(v1::Manifest best, store_->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 2);
  EXPECT_THAT(best.aliases(), ElementsAre("best"));

  // A commit moves aliases in the same batch.
  CommitOptions options;
  options.aliases = {"best", "production"};
  MustCommit("m", WeightsOnly({{"w", at::full({2}, 4)}}), options);
  ASSERT_OK_AND_ASSIGN(best, store_->GetManifest(Ref("m@best")));
  EXPECT_EQ(best.version(), 4);
  EXPECT_THAT(best.aliases(), ElementsAre("best", "production"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  EXPECT_EQ(models[0].aliases().at("production"), 4);

  EXPECT_THAT(store_->SetAlias("m", "latest", 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "reserved"));
  EXPECT_THAT(store_->SetAlias("m", "best", 99, 0), StatusIs(absl::StatusCode::kNotFound, "m@99"));
  ASSERT_OK(store_->DeleteAlias("m", "best"));
  EXPECT_THAT(store_->GetManifest(Ref("m@best")), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->DeleteAlias("m", "best"), StatusIs(absl::StatusCode::kNotFound, "best"));
}

TEST_P(StoreConformanceTest, ExpectedLatestVersionConflictIsFailedPrecondition) {
  MustCommit("m", WeightsOnly({{"w", at::ones({2})}}));
  CommitOptions expect_one;
  expect_one.expected_latest_version = 1;
  CommitOptions expect_five;
  expect_five.expected_latest_version = 5;
  EXPECT_THAT(CommitCheckpoint(*store_, "m", WeightsOnly({{"w", at::ones({2})}}), expect_five),
              StatusIs(absl::StatusCode::kFailedPrecondition, "expects latest version 5"));

  // Checked again atomically at commit: another writer got in between.
  v1::Manifest header;
  v1::TensorMeta* meta = header.add_tensors();
  meta->set_key("w");
  meta->set_dtype(v1::DTYPE_UINT8);
  meta->add_shape(3);
  meta->set_byte_length(3);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("m", header, expect_one));
  ASSERT_OK(session->AddTensorData(0, 0, "abc"));
  MustCommit("m", WeightsOnly({{"w", at::zeros({2})}}));
  EXPECT_THAT(session->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          "expected latest version 1 but it is 2"));
  EXPECT_THAT(session->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition, "failed earlier"));
  ASSERT_OK_AND_ASSIGN(v1::Manifest latest, store_->GetManifest(Ref("m")));
  EXPECT_EQ(latest.version(), 2);
}

TEST_P(StoreConformanceTest, ACommitSentAgainWithItsIdempotencyKeyLandsOnce) {
  CommitOptions keyed;
  keyed.idempotency_key = "commit-0123456789abcdef";
  const CheckpointContents contents = WeightsOnly({{"w", Seeded({64}, 7)}});
  const CommitResult first = MustCommit("m", contents, keyed);
  EXPECT_FALSE(first.replayed);

  // The answer was lost; the client sends the whole upload again with the same key.
  ASSERT_OK_AND_ASSIGN(CommitResult again, CommitCheckpoint(*store_, "m", contents, keyed));
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.version.version(), first.version.version());
  EXPECT_EQ(again.logical_bytes, first.logical_bytes);
  EXPECT_EQ(again.new_bytes, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store_->ListVersions("m"));
  EXPECT_EQ(versions.size(), 1u);

  // Another commit without the key (or with another) is a version of its own.
  CommitOptions other_key;
  other_key.idempotency_key = "commit-fedcba9876543210";
  EXPECT_EQ(MustCommit("m", contents, other_key).version.version(), 2);
  EXPECT_EQ(MustCommit("m", contents).version.version(), 3);

  // One key names one commit: other tensors under a used key are refused, nothing is made.
  EXPECT_THAT(CommitCheckpoint(*store_, "m", WeightsOnly({{"w", Seeded({64}, 8)}}), keyed),
              StatusIs(absl::StatusCode::kAlreadyExists, "holds other tensors"));
  // Keys belong to their model.
  EXPECT_FALSE(MustCommit("other", contents, keyed).replayed);

  CommitOptions spaced;
  spaced.idempotency_key = "two words";
  EXPECT_THAT(CommitCheckpoint(*store_, "m", contents, spaced),
              StatusIs(absl::StatusCode::kInvalidArgument, "idempotency key"));
  ASSERT_OK_AND_ASSIGN(versions, store_->ListVersions("m"));
  EXPECT_EQ(versions.size(), 3u);
}

TEST_P(StoreConformanceTest, TwoThreadsCommittingToOneModelGetDistinctVersions) {
  constexpr int kPerThread = 5;
  std::vector<int64_t> versions[2];
  std::vector<std::thread> writers;
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const float value = static_cast<float>(t * 100 + i);
        absl::StatusOr<CommitResult> committed =
            CommitCheckpoint(*store_, "shared", WeightsOnly({{"w", at::full({64 * 1024}, value)}}));
        ASSERT_OK(committed.status());
        versions[t].push_back(committed->version.version());
      }
    });
  }
  for (std::thread& writer : writers) writer.join();

  std::set<int64_t> all(versions[0].begin(), versions[0].end());
  all.insert(versions[1].begin(), versions[1].end());
  EXPECT_EQ(all.size(), 2u * kPerThread);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), 2 * kPerThread);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      ASSERT_OK_AND_ASSIGN(at::Tensor w, ReadTensor(*store_, "shared", versions[t][i], "w"));
      EXPECT_TRUE(at::equal(w, at::full({64 * 1024}, static_cast<float>(t * 100 + i))));
    }
  }
}

TEST_P(StoreConformanceTest, RecordsOriginalDevice) {
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("w", at::ones({3}), "cuda:1"));
  MustCommit("m", contents);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m")));
  EXPECT_EQ(loaded.manifest.tensors(0).original_device(), "cuda:1");
  EXPECT_EQ(loaded.contents.model.entry(0).original_device, "cuda:1");
  EXPECT_TRUE(loaded.contents.model.entry(0).tensor.device().is_cpu());
}

// Sparse tensors, in the model and in a bundle's other state, come back in their layout with
// the same indices and values; their bytes dedup like any tensor's.
TEST_P(StoreConformanceTest, SparseTensorsComeBackInTheirLayout) {
  const at::Tensor dense = Seeded({6, 8}, 3) * (Seeded({6, 8}, 4) > 0.5);
  const at::Tensor coo = dense.to_sparse();
  const at::Tensor csr = dense.to_sparse_csr();
  CheckpointContents contents = WeightsOnly({{"coo", coo}, {"dense", dense}});
  contents.extra = Value::Dict({{DictKey("csr"), Value::Tensor(csr)}});
  MustCommit("m", contents);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, Ref("m")));
  ASSERT_EQ(loaded.manifest.tensors(0).sparse().kind(), v1::SparseLayout::KIND_COO);
  const at::Tensor coo_back = loaded.contents.model.entry(0).tensor;
  ASSERT_TRUE(coo_back.is_sparse());
  EXPECT_TRUE(at::equal(coo_back._indices(), coo._indices()));
  EXPECT_TRUE(at::equal(coo_back._values(), coo._values()));
  const Value* csr_back = loaded.contents.extra.Find("csr");
  ASSERT_NE(csr_back, nullptr);
  ASSERT_TRUE(csr_back->is_tensor());
  ASSERT_EQ(csr_back->tensor().layout(), at::kSparseCsr);
  EXPECT_TRUE(at::equal(csr_back->tensor().crow_indices(), csr.crow_indices()));
  EXPECT_TRUE(at::equal(csr_back->tensor().to_dense(), dense));

  ASSERT_OK_AND_ASSIGN(CommitResult again, CommitCheckpoint(*store_, "m", contents));
  EXPECT_EQ(again.new_bytes, 0);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_THAT(verified.problems(), IsEmpty());
}

TEST_P(StoreConformanceTest, StreamedUploadInPiecesDedupsWithOneShotCommit) {
  const at::Tensor big = Seeded({9 * kMiB / 4}, 1);  // 9 MiB
  const at::Tensor small = Seeded({1000}, 2);
  MustCommit("m", WeightsOnly({{"big", big}, {"small", small}}));

  // The same bytes in 1 MiB messages (what the gRPC service sends), tensors interleaved.
  v1::Manifest header;
  for (const auto& [key, tensor] : {std::make_pair("big", big), std::make_pair("small", small)}) {
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key(key);
    meta->set_dtype(v1::DTYPE_FLOAT32);
    meta->add_shape(tensor.numel());
    meta->set_byte_length(tensor.nbytes());
  }
  const std::string big_bytes = TensorBytes(big);
  const std::string small_bytes = TensorBytes(small);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("m", header, {}));
  ASSERT_OK(session->AddTensorData(1, 0, absl::string_view(small_bytes).substr(0, 1000)));
  for (int64_t offset = 0; offset < static_cast<int64_t>(big_bytes.size()); offset += kMiB) {
    ASSERT_OK(session->AddTensorData(0, offset, absl::string_view(big_bytes).substr(offset, kMiB)));
  }
  ASSERT_OK(session->AddTensorData(1, 1000, absl::string_view(small_bytes).substr(1000)));
  ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());
  EXPECT_EQ(committed.new_bytes, 0);
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(stats.chunks(), 4);  // 4 + 4 + 1 MiB and the small tensor

  ASSERT_OK_AND_ASSIGN(v1::Manifest one_shot, store_->GetManifest(Ref("m@1")));
  ASSERT_OK_AND_ASSIGN(v1::Manifest streamed, store_->GetManifest(Ref("m@2")));
  EXPECT_EQ(streamed.tensors(0).content_hash(), one_shot.tensors(0).content_hash());
  EXPECT_EQ(streamed.tensors(0).chunks_size(), 3);

  ASSERT_OK_AND_ASSIGN(
      std::vector<std::string> missing,
      store_->FindMissingChunks({one_shot.tensors(0).chunks(0).sha256(), Sha256("not stored")}));
  EXPECT_THAT(missing, ElementsAre(Sha256("not stored")));
}

TEST_P(StoreConformanceTest, StoredChunksAreReferencedWithoutTheirBytes) {
  const at::Tensor big = Seeded({9 * kMiB / 4}, 1);  // 9 MiB: chunks of 4, 4 and 1 MiB
  MustCommit("m", WeightsOnly({{"big", big}}));
  ASSERT_OK_AND_ASSIGN(v1::Manifest first, store_->GetManifest(Ref("m@1")));
  const v1::TensorMeta& stored = first.tensors(0);
  ASSERT_EQ(stored.chunks_size(), 3);

  // The first two chunks unchanged and referenced; the last one changed and sent.
  std::string bytes = TensorBytes(big);
  bytes.back() ^= 1;
  v1::Manifest header;
  v1::TensorMeta* meta = header.add_tensors();
  meta->set_key("big");
  meta->set_dtype(v1::DTYPE_FLOAT32);
  meta->add_shape(big.numel());
  meta->set_byte_length(big.nbytes());
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", header, {}));
    ASSERT_OK(session->AddStoredChunk(0, 0, stored.chunks(0).sha256(), 4 * kMiB));
    ASSERT_OK(session->AddStoredChunk(0, 4 * kMiB, stored.chunks(1).sha256(), 4 * kMiB));
    ASSERT_OK(session->AddTensorData(0, 8 * kMiB, absl::string_view(bytes).substr(8 * kMiB)));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());
    EXPECT_EQ(committed.new_bytes, kMiB);
  }
  ASSERT_OK_AND_ASSIGN(v1::Manifest second, store_->GetManifest(Ref("m@2")));
  EXPECT_EQ(second.tensors(0).chunks(0).xxh3_64(), stored.chunks(0).xxh3_64());
  EXPECT_EQ(second.tensors(0).content_hash(), ContentHashOfBytes(bytes));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(Ref("m@2")));
  ASSERT_OK_AND_ASSIGN(at::Tensor read, ReadTensor(*reader, "big"));
  EXPECT_EQ(TensorBytes(read), bytes);

  // Deleting the first version and collecting keeps the chunks the second one references.
  ASSERT_OK(store_->DeleteVersion("m", 1, false).status());
  ASSERT_OK(store_->GarbageCollect(false).status());
  ASSERT_OK_AND_ASSIGN(reader, store_->OpenVersion(Ref("m@2")));
  ASSERT_OK_AND_ASSIGN(read, ReadTensor(*reader, "big"));
  EXPECT_EQ(TensorBytes(read), bytes);

  auto refused = [&](int64_t offset, const std::string& sha256, int64_t length) {
    absl::StatusOr<std::unique_ptr<UploadSession>> session = store_->BeginUpload("m", header, {});
    if (!session.ok()) return session.status();
    if (offset > 0) {
      absl::Status sent =
          (*session)->AddTensorData(0, 0, absl::string_view(bytes).substr(0, offset));
      if (!sent.ok()) return sent;
    }
    absl::Status added = (*session)->AddStoredChunk(0, offset, sha256, length);
    if (!added.ok()) return added;
    return (*session)->Commit().status();  // a remote store reports it when the stream ends.
  };
  EXPECT_THAT(refused(0, Sha256("never stored"), 4 * kMiB),
              StatusIs(absl::StatusCode::kNotFound, "send its bytes"));
  EXPECT_THAT(refused(kMiB, stored.chunks(1).sha256(), 4 * kMiB),
              StatusIs(absl::StatusCode::kInvalidArgument, "multiples of 4194304"));
  EXPECT_THAT(refused(0, stored.chunks(0).sha256(), kMiB),
              StatusIs(absl::StatusCode::kInvalidArgument, "the chunk there holds 4194304"));
  EXPECT_THAT(refused(8 * kMiB, second.tensors(0).chunks(0).sha256(), kMiB),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds 4194304 bytes, not 1048576"));
  EXPECT_THAT(refused(0, "short", 4 * kMiB),
              StatusIs(absl::StatusCode::kInvalidArgument, "a SHA-256 has 32"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store_->ListVersions("m"));
  EXPECT_EQ(versions.size(), 1u);  // none of them committed.
}

TEST_P(StoreConformanceTest, ValidationErrorsAreInvalidArgumentWithClearMessages) {
  EXPECT_THAT(CommitCheckpoint(*store_, "bad name", WeightsOnly({{"w", at::ones({1})}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "model name 'bad name' has ' '"));
  CommitOptions latest_alias;
  latest_alias.aliases = {"latest"};
  EXPECT_THAT(CommitCheckpoint(*store_, "m", WeightsOnly({{"w", at::ones({1})}}), latest_alias),
              StatusIs(absl::StatusCode::kInvalidArgument, "reserved"));

  v1::Manifest wrong_length = OneTensorHeader("w", 10);
  wrong_length.mutable_tensors(0)->set_byte_length(11);
  EXPECT_THAT(store_->BeginUpload("m", wrong_length, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'w' (index 0): byte_length 11 but uint8 [10] is 10 bytes"));

  v1::Manifest dangling = OneTensorHeader("w", 10);
  dangling.mutable_optimizer_state()->mutable_tensor_value()->set_key("optimizer/x");
  EXPECT_THAT(store_->BeginUpload("m", dangling, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "references tensor 'optimizer/x', which is not in state_tensors"));

  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> short_upload,
                         store_->BeginUpload("m", OneTensorHeader("w", 10), {}));
    ASSERT_OK(short_upload->AddTensorData(0, 0, "12345"));
    EXPECT_THAT(short_upload->Commit(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "incomplete: tensor 'w' (index 0) got 5 of 10 bytes"));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> long_upload,
                         store_->BeginUpload("m", OneTensorHeader("w", 10), {}));
    EXPECT_THAT(
        long_upload->AddTensorData(0, 0, "12345678901"),
        StatusIs(absl::StatusCode::kInvalidArgument, "11 bytes sent but its byte_length is 10"));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> gap,
                         store_->BeginUpload("m", OneTensorHeader("w", 10), {}));
    ASSERT_OK(gap->AddTensorData(0, 0, "123"));
    EXPECT_THAT(gap->AddTensorData(0, 5, "45"),
                StatusIs(absl::StatusCode::kInvalidArgument, "offset 5, expected offset 3"));
    EXPECT_THAT(gap->AddTensorData(7, 0, "45"),
                StatusIs(absl::StatusCode::kFailedPrecondition, "failed earlier"));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> bad_index,
                         store_->BeginUpload("m", OneTensorHeader("w", 10), {}));
    EXPECT_THAT(bad_index->AddTensorData(1, 0, "1"),
                StatusIs(absl::StatusCode::kInvalidArgument, "tensor index 1 is out of range"));
  }
  // None of them left a version behind.
  EXPECT_THAT(store_->GetManifest(Ref("m")), StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(StoreConformanceTest, ContentHashFromTheClientIsChecked) {
  v1::Manifest header = OneTensorHeader("w", 3);
  header.mutable_tensors(0)->set_content_hash(ContentHashOfBytes("abc"));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", header, {}));
    // A store checks when the tensor is complete (local) or at the latest on Commit (a remote
    // store streams the bytes and hears back once).
    absl::Status added = session->AddTensorData(0, 0, "abd");
    absl::Status failed = added.ok() ? session->Commit().status() : added;
    EXPECT_THAT(failed, StatusIs(absl::StatusCode::kDataLoss,
                                 "content_hash is " + HexEncode(ContentHashOfBytes("abc"))));
  }
  EXPECT_THAT(store_->GetManifest(Ref("m")), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("m", header, {}));
  ASSERT_OK(session->AddTensorData(0, 0, "abc"));
  ASSERT_OK(session->Commit().status());
}

}  // namespace ckpt::testing
