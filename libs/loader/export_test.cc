#include "libs/loader/export.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/safetensors.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/tensor/device.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::ElementsAre;

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = Dir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
    weight_ = at::randn({6, 5});
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("module.enc.weight", weight_, "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.enc.steps", at::full({}, 3, at::kLong), "cuda:1"));
    ASSERT_OK(contents.model.Insert("module.head.bias", at::randn({5}), "cuda:1"));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, store_->CommitCheckpoint("m", contents));
    ASSERT_OK_AND_ASSIGN(reader_, store_->OpenVersion(committed.version));
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::unique_ptr<VersionReader> reader_;
  at::Tensor weight_;
};

TEST_F(ExportTest, SafetensorsStreamsTheAdaptedSubsetInPiecesEqualToTheFile) {
  ExportOptions options;
  options.format = ExportFormat::kSafetensors;
  options.target.keys = KeyPolicy::AddPrefix("module.");
  options.target.include_prefixes = {"enc."};
  ASSERT_OK_AND_ASSIGN(options.target.dtype, DTypePolicy::CastFloatingTo(DType::kBFloat16));
  const std::string path = Dir() + "/subset.safetensors";
  ASSERT_OK_AND_ASSIGN(ExportResult written, ExportToFile(*reader_, options, path));
  EXPECT_EQ(written.tensors, 2);

  std::string streamed;
  uint64_t announced = 0;
  ASSERT_OK_AND_ASSIGN(
      ExportResult result,
      ExportToSink(*reader_, options, Dir(), /*piece_bytes=*/7,
                   [&](const ExportResult&, uint64_t total, absl::string_view bytes) {
                     EXPECT_LE(bytes.size(), 7u);
                     announced = total;
                     streamed.append(bytes.data(), bytes.size());
                     return absl::OkStatus();
                   }));
  EXPECT_EQ(streamed, ReadAll(path));
  EXPECT_EQ(announced, streamed.size());
  EXPECT_EQ(result.file_bytes, streamed.size());

  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, ReadSafetensorsFile(path));
  EXPECT_EQ(file.header.metadata.at("ckpt.version"), "m@1");
  const at::Tensor* weight = file.tensors.Find("module.enc.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_TRUE(at::equal(*weight, weight_.to(at::kBFloat16)));
  const at::Tensor* steps = file.tensors.Find("module.enc.steps");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(steps->scalar_type(), at::kLong);  // never cast.
  EXPECT_EQ(file.tensors.Find("module.head.bias"), nullptr);
}

TEST_F(ExportTest, TorchFileStreamsLikeTheFileAndReadsBack) {
  ExportOptions options;
  const std::string path = Dir() + "/all.pt";
  ASSERT_OK(ExportToFile(*reader_, options, path).status());
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(path));
  EXPECT_THAT(file.bundle.model.keys(), ElementsAre("enc.weight", "enc.steps", "head.bias"));
  EXPECT_TRUE(at::equal(*file.bundle.model.Find("enc.weight"), weight_));

  std::string streamed;
  ASSERT_OK(ExportToSink(*reader_, options, Dir(), 1 << 20,
                         [&](const ExportResult&, uint64_t, absl::string_view bytes) {
                           streamed.append(bytes.data(), bytes.size());
                           return absl::OkStatus();
                         })
                .status());
  const std::string copy = Dir() + "/streamed.pt";
  std::ofstream(copy, std::ios::binary) << streamed;
  ASSERT_OK_AND_ASSIGN(CheckpointFile reread, ReadCheckpointFile(copy));
  EXPECT_TRUE(
      at::equal(*reread.bundle.model.Find("head.bias"), *file.bundle.model.Find("head.bias")));
}

// A version with optimizer, scheduler and other fields but no recorded layout (as the trainer
// writes them): the bundle is {"epoch", "global_step", "model", "optimizer", "scheduler", ...}.
class BundleExportTest : public ExportTest {
 protected:
  v1::VersionRef Commit(bool with_names) {
    CheckpointContents contents;
    EXPECT_OK(contents.model.Insert("enc.weight", at::ones({2, 2})));
    EXPECT_OK(contents.model.Insert("enc.running_mean", at::zeros({2})));
    EXPECT_OK(contents.model.Insert("head.bias", at::ones({2})));
    Value group = Value::Dict(
        {{"lr", Value::Float(0.5)}, {"params", Value::List({Value::Int(0), Value::Int(1)})}});
    contents.optimizer = Value::Dict(
        {{"state", Value::Dict({{0, Value::Dict({{"momentum_buffer",
                                                  Value::Tensor(at::full({2, 2}, 0.25))}})}})},
         {"param_groups", Value::List({group})}});
    contents.scheduler = Value::Dict({{"last_epoch", Value::Int(3)}});
    contents.extra = Value::Dict({{"trainer", Value::Dict({{"seed", Value::Int(7)}})}});
    contents.metadata.set_source_format("trainer");
    contents.metadata.set_epoch(2);
    contents.metadata.set_global_step(3);
    if (with_names) contents.optimizer_param_names = {{0, "enc.weight"}, {1, "head.bias"}};
    absl::StatusOr<CommitResult> committed = store_->CommitCheckpoint("b", contents);
    EXPECT_OK(committed.status());
    return committed->version;
  }

  absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref, const LoadTarget& target,
                                      const std::string& path) {
    ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref));
    ExportOptions options;
    options.target = target;
    return ExportToFile(*reader, options, path);
  }

  static LoadTarget Everything() {
    LoadTarget target;
    target.include_optimizer = true;
    target.include_scheduler = true;
    return target;
  }
};

TEST_F(BundleExportTest, AVersionWithoutALayoutGetsTheUsualBundle) {
  const v1::VersionRef ref = Commit(/*with_names=*/false);
  const std::string path = Dir() + "/bundle.pt";
  ASSERT_OK_AND_ASSIGN(ExportResult result, Export(ref, Everything(), path));
  EXPECT_TRUE(result.bundle);
  EXPECT_EQ(result.tensors, 3);
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(path));
  std::vector<std::string> keys;
  for (const auto& [key, value] : file.root.entries()) keys.push_back(key.string_key());
  EXPECT_THAT(keys,
              ElementsAre("epoch", "global_step", "model", "optimizer", "scheduler", "trainer"));
  EXPECT_EQ(*file.root.Find("epoch"), Value::Int(2));
  EXPECT_TRUE(file.root.Find("model")->is_ordered_dict());
  EXPECT_TRUE(at::equal(
      file.root.Find("optimizer")->Find("state")->Find(0)->Find("momentum_buffer")->tensor(),
      at::full({2, 2}, 0.25)));
  EXPECT_EQ(*file.root.Find("scheduler"), Value::Dict({{"last_epoch", Value::Int(3)}}));

  // Only the scheduler: the optimizer is named as left out.
  LoadTarget scheduler_only;
  scheduler_only.include_scheduler = true;
  ASSERT_OK_AND_ASSIGN(result, Export(ref, scheduler_only, path));
  EXPECT_THAT(result.left_out, ElementsAre("optimizer: not asked for"));
  ASSERT_OK_AND_ASSIGN(file, ReadCheckpointFile(path));
  EXPECT_EQ(file.root.Find("optimizer"), nullptr);

  // Safetensors cannot hold a bundle, and says so.
  ExportOptions safetensors;
  safetensors.format = ExportFormat::kSafetensors;
  safetensors.target = Everything();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VersionReader> reader, store_->OpenVersion(ref));
  ASSERT_OK_AND_ASSIGN(result, ExportToFile(*reader, safetensors, Dir() + "/b.safetensors"));
  EXPECT_FALSE(result.bundle);
  EXPECT_THAT(
      result.left_out,
      ElementsAre(::testing::HasSubstr("optimizer: safetensors holds tensors only"),
                  ::testing::HasSubstr("scheduler"), ::testing::HasSubstr("the other fields")));
}

TEST_F(BundleExportTest, ASubsetMustKeepEveryParameterTheOptimizerIndexes) {
  const std::string path = Dir() + "/subset.pt";
  LoadTarget target = Everything();
  target.include_keys = {"enc.weight", "head.bias"};  // drops a buffer only.
  // Without parameter names nothing proves the subset keeps the optimizer's parameters.
  EXPECT_THAT(
      Export(Commit(/*with_names=*/false), target, path).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "does not record which tensor each index is"));
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  const v1::VersionRef named = Commit(/*with_names=*/true);
  ASSERT_OK(Export(named, target, path).status());
  target.include_keys = {"enc.weight"};
  EXPECT_THAT(Export(named, target, Dir() + "/misaligned.pt").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "leaves out optimizer parameter(s) 1 (head.bias)"));
  target.include_optimizer = false;
  ASSERT_OK(Export(named, target, Dir() + "/no_optimizer.pt").status());
}

TEST_F(BundleExportTest, AskingForOptimizerStateAVersionLacksIsAPreconditionError) {
  // The fixture's version holds model tensors only.
  const std::string path = Dir() + "/none.pt";
  EXPECT_THAT(ExportToFile(
                  *reader_,
                  [] {
                    ExportOptions options;
                    options.target = Everything();
                    return options;
                  }(),
                  path)
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "m@1 holds no optimizer state (it has 3 model tensors"));
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST_F(ExportTest, SinkErrorsStopTheExportAndBadNamesAreRejected) {
  ExportOptions options;
  options.format = ExportFormat::kSafetensors;
  EXPECT_THAT(ExportToSink(*reader_, options, Dir(), 64,
                           [](const ExportResult&, uint64_t, absl::string_view) {
                             return absl::CancelledError("consumer left");
                           })
                  .status(),
              StatusIs(absl::StatusCode::kCancelled, "consumer left"));
  EXPECT_THAT(ParseExportFormat("onnx").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "torch or safetensors"));
  EXPECT_THAT(ExportFormatFromProto(v1::EXPORT_FORMAT_UNSPECIFIED).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_EQ(ExportFileName("m", 3, ExportFormat::kSafetensors), "m-v3.safetensors");
}

}  // namespace
}  // namespace ckpt
