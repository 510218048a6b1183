#include "libs/loader/testing/loader_conformance.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/eye.h"
#include "ATen/ops/full.h"
#include "ATen/ops/ones.h"
#include "gmock/gmock.h"
#include "libs/format/checkpoint_file.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"

namespace ckpt::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

at::Tensor Weight() { return at::arange(12, at::kFloat).reshape({3, 4}) / 7; }

}  // namespace

std::string LoaderConformanceTest::Dir() const {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '_');  // "Case/param" of a parameterized test.
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

void LoaderConformanceTest::SetUp() {
  StoreOptions options;
  options.db_path = Dir();
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> opened =
      RocksDbCheckpointStore::Open(options);
  ASSERT_OK(opened.status());
  store_ = *std::move(opened);
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("module.fc.weight", Weight(), "cuda:1"));
  ASSERT_OK(contents.model.Insert("module.fc.steps", at::full({}, 5, at::kLong), "cuda:1"));
  ASSERT_OK(contents.model.Insert("module.head.bias", at::ones({4}), "cuda:1"));
  ASSERT_OK_AND_ASSIGN(CommitResult weights, CommitCheckpoint(*store_, "m", contents));
  weights_only_ = weights.version;
  contents.optimizer = Value::Dict(
      {{"state", Value::Dict({{0, Value::Dict({{"momentum_buffer",
                                                Value::Tensor(at::full({3, 4}, 0.5))}})}})},
       {"param_groups",
        Value::List({Value::Dict({{"lr", Value::Float(0.1)},
                                  {"params", Value::List({Value::Int(0), Value::Int(1)})}})})}});
  contents.scheduler = Value::Dict({{"last_epoch", Value::Int(2)}});
  contents.extra = Value::Dict({{"best_acc", Value::Float(0.75)}});
  ASSERT_OK_AND_ASSIGN(CommitResult bundle, CommitCheckpoint(*store_, "m", contents));
  bundle_ = bundle.version;
  harness_ = GetParam().make(*store_);
  ASSERT_NE(harness_, nullptr);
}

void LoaderConformanceTest::TearDown() { harness_.reset(); }

TEST_P(LoaderConformanceTest, LoadsEveryTensorUnderTheAskedKeysWithItsBytes) {
  ASSERT_OK_AND_ASSIGN(LoadedState canonical, loader().Load(weights_only_, LoadTarget()));
  EXPECT_THAT(canonical.model.keys(), ElementsAre("fc.weight", "fc.steps", "head.bias"));
  EXPECT_TRUE(at::equal(*canonical.model.Find("fc.weight"), Weight()));
  EXPECT_EQ(canonical.model.entry(0).original_device, "cuda:1");
  LoadTarget original;
  original.keys = KeyPolicy::Original();
  ASSERT_OK_AND_ASSIGN(LoadedState producer, loader().Load(weights_only_, original));
  EXPECT_THAT(producer.model.keys(),
              ElementsAre("module.fc.weight", "module.fc.steps", "module.head.bias"));
}

TEST_P(LoaderConformanceTest, CastsFloatingTensorsOnlyAndLoadsStateWhenAsked) {
  LoadTarget target;
  ASSERT_OK_AND_ASSIGN(target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  target.include_optimizer = true;
  ASSERT_OK_AND_ASSIGN(LoadedState state, loader().Load(bundle_, target));
  EXPECT_EQ(state.model.Find("fc.weight")->scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(*state.model.Find("fc.weight"), Weight().to(at::kBFloat16)));
  EXPECT_EQ(state.model.Find("fc.steps")->scalar_type(), at::kLong);
  ASSERT_TRUE(state.optimizer.has_value());
  EXPECT_TRUE(at::equal(state.optimizer->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
                        at::full({3, 4}, 0.5)));
  EXPECT_FALSE(state.scheduler.has_value());
}

// Sparse tensors arrive in their layout on every transport; a cast touches their values only.
TEST_P(LoaderConformanceTest, SparseTensorsArriveInTheirLayoutCastInTheirValuesOnly) {
  const at::Tensor dense = Weight() * at::eye(3, 4);
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("coo", dense.to_sparse()));
  ASSERT_OK(contents.model.Insert("csr", dense.to_sparse_csr()));
  ASSERT_OK(contents.model.Insert("dense", Weight()));
  ASSERT_OK_AND_ASSIGN(CommitResult sparse, CommitCheckpoint(*store_, "s", contents));
  for (const bool cast : {false, true}) {
    LoadTarget target;
    if (cast) {
      ASSERT_OK_AND_ASSIGN(target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
    }
    const at::ScalarType values = cast ? at::kBFloat16 : at::kFloat;
    ASSERT_OK_AND_ASSIGN(LoadedState state, loader().Load(sparse.version, target));
    const at::Tensor coo = *state.model.Find("coo");
    ASSERT_TRUE(coo.is_sparse()) << cast;
    EXPECT_EQ(coo.scalar_type(), values);
    EXPECT_TRUE(at::equal(coo._indices(), dense.to_sparse()._indices()));
    EXPECT_TRUE(at::equal(coo._values(), dense.to_sparse()._values().to(values)));
    const at::Tensor csr = *state.model.Find("csr");
    ASSERT_EQ(csr.layout(), at::kSparseCsr) << cast;
    EXPECT_EQ(csr.crow_indices().scalar_type(), at::kLong);
    EXPECT_TRUE(at::equal(csr.to_dense(), dense.to(values)));
    EXPECT_TRUE(at::equal(*state.model.Find("dense"), Weight().to(values)));
  }
}

TEST_P(LoaderConformanceTest, NamesWhatIsMissing) {
  EXPECT_THAT(loader().Load(MakeVersionRef("m", 9), LoadTarget()).status(),
              StatusIs(absl::StatusCode::kNotFound, "m@9"));
  LoadTarget subset;
  subset.include_keys = {"fc.weight", "fc.nope"};
  EXPECT_THAT(loader().Load(bundle_, subset).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "fc.nope"));
  EXPECT_THAT(loader().Preflight(bundle_, {}, subset).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "fc.nope"));
}

// The same failure is the same status code whatever carries the load: a version, alias or model
// that does not exist is NOT_FOUND naming it, a device that is not there FAILED_PRECONDITION, for
// loads and exports alike.
TEST_P(LoaderConformanceTest, TheSameFailureIsTheSameCodeOnEveryTransport) {
  ASSERT_OK_AND_ASSIGN(const v1::VersionRef no_alias, ParseVersionRef("m@nope"));
  EXPECT_THAT(loader().Load(no_alias, LoadTarget()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(loader().Load(MakeVersionRef("no-such-model", 1), LoadTarget()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-model")));
  EXPECT_THAT(loader().Export(MakeVersionRef("m", 9), ExportOptions(), Dir() + "-missing.pt"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("m@9")));
  LoadTarget absent_device;
  absent_device.device = *ParseDevice("cuda:99");
  EXPECT_THAT(loader().Load(weights_only_, absent_device).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:99")));
}

// One flipped byte in a pack file: every transport answers DATA_LOSS naming the tensor, for the
// bytes as stored and cast, and the tensors that are intact still load.
TEST_P(LoaderConformanceTest, ADamagedChunkIsDataLossNamingItsTensor) {
  CheckpointContents contents;
  ASSERT_OK(contents.model.Insert("big.weight", at::arange(1 << 18, at::kFloat), ""));
  ASSERT_OK(contents.model.Insert("big.bias", at::ones({16}), ""));
  ASSERT_OK_AND_ASSIGN(CommitResult committed, CommitCheckpoint(*store_, "damaged", contents));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader,
                         store_->OpenVersion(committed.version));
    const v1::TensorMeta* meta = nullptr;
    for (const v1::TensorMeta& tensor : reader->manifest().tensors()) {
      if (tensor.key() == "big.weight") meta = &tensor;
    }
    ASSERT_NE(meta, nullptr);
    ASSERT_OK_AND_ASSIGN(std::optional<VersionReader::FileRegion> region,
                         reader->LocateTensorBytes(*meta));
    ASSERT_TRUE(region.has_value()) << "the store keeps a 1 MiB tensor in a pack file";
    const int fd = open(region->path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << region->path;
    const off_t at = static_cast<off_t>(region->offset + 4321);
    char byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, at), 1);
    byte ^= 0x10;
    ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
    close(fd);
  }
  EXPECT_THAT(loader().Load(committed.version, LoadTarget()).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("big.weight")));
  LoadTarget cast;
  ASSERT_OK_AND_ASSIGN(cast.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  EXPECT_THAT(loader().Load(committed.version, cast).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("big.weight")));
  EXPECT_THAT(loader().Export(committed.version, ExportOptions(), Dir() + "-damaged.pt"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("big.weight")));
  LoadTarget intact;
  intact.include_keys = {"big.bias"};
  ASSERT_OK_AND_ASSIGN(LoadedState bias, loader().Load(committed.version, intact));
  EXPECT_TRUE(at::equal(*bias.model.Find("big.bias"), at::ones({16})));
}

TEST_P(LoaderConformanceTest, PreflightSuggestsTheLayoutAndReportsDtypes) {
  std::vector<ExpectedTensor> ddp_consumer = {{"module.fc.weight", {3, 4}, DType::kFloat16},
                                              {"module.fc.steps", {}, DType::kUnspecified},
                                              {"module.head.bias", {4}, DType::kFloat32}};
  ASSERT_OK_AND_ASSIGN(PreflightReport report,
                       loader().Preflight(bundle_, ddp_consumer, LoadTarget()));
  EXPECT_FALSE(report.report.compatible());
  ASSERT_TRUE(report.suggested_keys.has_value());
  EXPECT_EQ(report.suggested_keys->kind(), KeyPolicy::Kind::kAddPrefix);
  EXPECT_EQ(report.suggested_keys->prefix(), "module.");
  LoadTarget prefixed;
  prefixed.keys = *report.suggested_keys;
  ASSERT_OK_AND_ASSIGN(report, loader().Preflight(bundle_, ddp_consumer, prefixed));
  EXPECT_TRUE(report.report.compatible()) << report.summary;
  EXPECT_THAT(report.dtype_differences,
              ElementsAre("module.fc.weight: float32 in checkpoint, float16 expected"));
  // A subset restricts the comparison: the other tensors are not "unexpected".
  prefixed.include_prefixes = {"fc."};
  ASSERT_OK_AND_ASSIGN(report, loader().Preflight(bundle_, {ddp_consumer[0]}, prefixed));
  EXPECT_THAT(report.report.unexpected_keys, ElementsAre("module.fc.steps"));
}

TEST_P(LoaderConformanceTest, ExportsTheWholeBundleAndSaysWhatItLeavesOut) {
  ExportOptions options;
  options.target.include_optimizer = true;
  options.target.include_scheduler = true;
  const std::string path = Dir() + "-bundle.pt";
  ASSERT_OK_AND_ASSIGN(ExportResult result, loader().Export(bundle_, options, path));
  EXPECT_EQ(result.version, "m@2");
  EXPECT_TRUE(result.bundle);
  EXPECT_TRUE(result.left_out.empty());
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(path));
  std::vector<std::string> keys;
  for (const auto& [key, value] : file.root.entries()) keys.push_back(key.string_key());
  EXPECT_THAT(keys, ElementsAre("model", "optimizer", "scheduler", "best_acc"));
  EXPECT_EQ(*file.root.Find("best_acc"), Value::Float(0.75));

  options.format = ExportFormat::kSafetensors;
  ASSERT_OK_AND_ASSIGN(result, loader().Export(bundle_, options, Dir() + "-model.safetensors"));
  EXPECT_FALSE(result.bundle);
  EXPECT_THAT(result.left_out, ::testing::Contains(HasSubstr("safetensors holds tensors only")));
}

TEST_P(LoaderConformanceTest, ABundleOfAVersionWithoutOptimizerStateLeavesItOutAndSaysSo) {
  ExportOptions options;
  options.target.include_optimizer = true;
  const std::string path = Dir() + "-none.pt";
  ASSERT_OK_AND_ASSIGN(ExportResult result, loader().Export(weights_only_, options, path));
  EXPECT_THAT(result.left_out, ::testing::Contains(HasSubstr("optimizer: m@1 holds none")));
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
}

}  // namespace ckpt::testing
