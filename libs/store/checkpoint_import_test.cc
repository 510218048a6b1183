// Importing the files real PyTorch writes -- DDP on cuda:1, a bundle with Adam and StepLR, a
// legacy file, a whole pickled model whose class no longer exists, safetensors -- and reading
// them back gives canonical keys and identical values.

#include "libs/store/checkpoint_import.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/convert.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/testing/python_runner.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string Dir() { return std::string(std::getenv("TEST_TMPDIR")); }

class CheckpointImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::ckpt::testing::RunPythonOrAddFailure("libs/format/testdata/checkpoint_fixtures.py",
                                           "make " + Dir());
  }

  void SetUp() override {
    const std::string db =
        Dir() + "/store-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    StoreOptions options;
    options.db_path = db;
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
  }

  // The state dict of `file`, read by libs/format (itself checked against Python elsewhere).
  static StateDict Reference(const std::string& file) {
    absl::StatusOr<CheckpointFile> read = ReadCheckpointFile(Dir() + "/" + file);
    EXPECT_TRUE(read.ok()) << read.status();
    return read.ok() ? read->bundle.model : StateDict();
  }

  // Loads MODEL@latest and checks it holds exactly `expected`, key by key and byte by byte.
  void ExpectStored(const std::string& model, const StateDict& expected) {
    ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded,
                         LoadCheckpoint(*store_, ParseVersionRef(model).value()));
    EXPECT_EQ(loaded.contents.model.keys(), expected.keys());
    for (const StateDict::Entry& entry : expected) {
      const at::Tensor* stored = loaded.contents.model.Find(entry.key);
      ASSERT_NE(stored, nullptr) << entry.key;
      EXPECT_EQ(stored->scalar_type(), entry.tensor.scalar_type()) << entry.key;
      EXPECT_TRUE(at::equal(*stored, entry.tensor)) << entry.key;
    }
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(CheckpointImportTest, DdpCheckpointFromCuda1ComesBackCanonicalWithItsDeviceRecorded) {
  ASSERT_OK_AND_ASSIGN(ImportResult result,
                       ImportCheckpointFile(*store_, Dir() + "/ddp_cuda1.pt", "mlp"));
  EXPECT_EQ(result.source_format, "torch_zip");
  EXPECT_EQ(result.stripped_prefix, "module.");
  EXPECT_EQ(FormatVersionRef(result.commit.version), "mlp@1");
  ExpectStored("mlp", Reference("reference.pt"));
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest,
                       store_->GetManifest(ParseVersionRef("mlp@1").value()));
  EXPECT_EQ(manifest.tensors(0).key(), "0.weight");
  EXPECT_EQ(manifest.tensors(0).original_key(), "module.0.weight");
  EXPECT_EQ(manifest.tensors(0).original_device(), "cuda:1");
}

TEST_F(CheckpointImportTest, BundleKeepsOptimizerSchedulerEpochAndExtras) {
  ImportOptions options;
  options.aliases = {"best"};
  ASSERT_OK_AND_ASSIGN(ImportResult result,
                       ImportCheckpointFile(*store_, Dir() + "/bundle.pt", "run", options));
  ExpectStored("run@best", Reference("reference.pt"));
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(Dir() + "/bundle.pt"));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded,
                       LoadCheckpoint(*store_, ParseVersionRef("run@best").value()));
  ASSERT_TRUE(loaded.contents.optimizer.has_value());
  EXPECT_EQ(*loaded.contents.optimizer, *file.bundle.optimizer);
  ASSERT_TRUE(loaded.contents.scheduler.has_value());
  EXPECT_EQ(*loaded.contents.scheduler, *file.bundle.scheduler);
  EXPECT_EQ(loaded.manifest.metadata().epoch(), 3);
  EXPECT_EQ(loaded.contents.extra.Find("best_acc")->float_value(), 0.5);
  EXPECT_EQ(loaded.manifest.metadata().labels().at("source_model_key"), "model");
}

TEST_F(CheckpointImportTest, WholeModelPickleWithoutItsClassImportsAsItsStateDict) {
  ASSERT_OK(ImportCheckpointFile(*store_, Dir() + "/whole_model.pt", "net").status());
  ExpectStored("net", Reference("whole_reference.pt"));
}

TEST_F(CheckpointImportTest, LegacyAndSafetensorsFilesImportToo) {
  ASSERT_OK(ImportCheckpointFile(*store_, Dir() + "/legacy.pt", "legacy").status());
  ExpectStored("legacy", Reference("reference.pt"));
  const std::string safetensors = Dir() + "/model.safetensors";
  ASSERT_OK(ConvertCheckpoint(Dir() + "/ddp_cuda1.pt", safetensors, {}).status());
  ASSERT_OK_AND_ASSIGN(ImportResult result, ImportCheckpointFile(*store_, safetensors, "st"));
  EXPECT_EQ(result.source_format, "safetensors");
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded,
                       LoadCheckpoint(*store_, ParseVersionRef("st").value()));
  const StateDict reference = Reference("reference.pt");
  EXPECT_EQ(loaded.contents.model.size(), reference.size());
  for (const StateDict::Entry& entry : reference) {
    ASSERT_NE(loaded.contents.model.Find(entry.key), nullptr) << entry.key;
    EXPECT_TRUE(at::equal(*loaded.contents.model.Find(entry.key), entry.tensor)) << entry.key;
  }
}

TEST_F(CheckpointImportTest, PrefixOptionsAndErrors) {
  ImportOptions none;
  none.strip_prefix = "none";
  ASSERT_OK(ImportCheckpointFile(*store_, Dir() + "/ddp_cuda1.pt", "raw", none).status());
  ASSERT_OK_AND_ASSIGN(v1::Manifest raw, store_->GetManifest(ParseVersionRef("raw").value()));
  EXPECT_EQ(raw.tensors(0).key(), "module.0.weight");

  ImportOptions exact;
  exact.strip_prefix = "module.0.";
  EXPECT_THAT(ImportCheckpointFile(*store_, Dir() + "/ddp_cuda1.pt", "bad", exact),
              StatusIs(absl::StatusCode::kInvalidArgument, "does not start with the prefix"));
  EXPECT_THAT(ImportCheckpointFile(*store_, Dir() + "/missing.pt", "m"),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ImportCheckpointFile(*store_, Dir() + "/ddp_cuda1.pt", "bad name!"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  EXPECT_EQ(models.size(), 1u);  // Nothing but "raw" became visible.
}

TEST_F(CheckpointImportTest, ReportsProgress) {
  int64_t last_done = 0, total = 0;
  int calls = 0;
  ImportOptions options;
  options.progress = [&](int64_t done, int64_t all) {
    EXPECT_GE(done, last_done);
    last_done = done;
    total = all;
    ++calls;
  };
  ASSERT_OK(ImportCheckpointFile(*store_, Dir() + "/bundle.pt", "p", options).status());
  EXPECT_GT(calls, 9);  // Nine model tensors and the optimizer's.
  EXPECT_EQ(last_done, total);
}

}  // namespace
}  // namespace ckpt
