#include "libs/loader/export.h"

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
  ASSERT_OK_AND_ASSIGN(ExportResult result,
                       ExportToSink(*reader_, options, Dir(), /*piece_bytes=*/7,
                                    [&](const ExportResult&, uint64_t total,
                                        absl::string_view bytes) {
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
            }).status());
  const std::string copy = Dir() + "/streamed.pt";
  std::ofstream(copy, std::ios::binary) << streamed;
  ASSERT_OK_AND_ASSIGN(CheckpointFile reread, ReadCheckpointFile(copy));
  EXPECT_TRUE(
      at::equal(*reread.bundle.model.Find("head.bias"), *file.bundle.model.Find("head.bias")));
}

TEST_F(ExportTest, SinkErrorsStopTheExportAndBadNamesAreRejected) {
  ExportOptions options;
  options.format = ExportFormat::kSafetensors;
  EXPECT_THAT(ExportToSink(
                  *reader_, options, Dir(), 64,
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
