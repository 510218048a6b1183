#include "libs/registry/serving_sync.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/full.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/format/checkpoint_file.h"
#include "libs/loader/local_loader.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// The names in `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    names.insert(entry.path().filename().string());
  }
  return {names.begin(), names.end()};
}

// Exports through a LocalLoader, then damages the written file's last byte (tensor data in a
// safetensors file): what a failing disk or a buggy exporter would hand the sync.
class DamagingLoader final : public Loader {
 public:
  explicit DamagingLoader(const Loader& inner) : inner_(inner) {}
  absl::StatusOr<LoadedState> Load(const v1::VersionRef& ref,
                                   const LoadTarget& target) const override {
    return inner_.Load(ref, target);
  }
  absl::StatusOr<PreflightReport> Preflight(const v1::VersionRef& ref,
                                            const std::vector<ExpectedTensor>& expected,
                                            const LoadTarget& target) const override {
    return inner_.Preflight(ref, expected, target);
  }
  absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref, const ExportOptions& options,
                                      const std::string& path) const override {
    absl::StatusOr<ExportResult> result = inner_.Export(ref, options, path);
    if (!result.ok()) return result;
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x01;
    file.seekp(-1, std::ios::end);
    file.write(&byte, 1);
    return result;
  }

 private:
  const Loader& inner_;
};

class ServingSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string base = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(base);
    StoreOptions store_options;
    store_options.db_path = base + "/store";
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(store_options));
    loader_ = std::make_unique<LocalLoader>(*store_);
    serving_ = base + "/serving";
  }

  // Commits version N of "m" whose tensors are filled with N; returns N.
  int64_t Commit(float fill, std::vector<std::string> aliases = {}) {
    CommitOptions options;
    options.aliases = std::move(aliases);
    CheckpointContents contents;
    EXPECT_OK(contents.model.Insert("encoder.weight", at::full({16, 4}, fill)));
    EXPECT_OK(contents.model.Insert("encoder.bias", at::arange(4, at::kFloat) + fill));
    EXPECT_OK(contents.model.Insert("steps", at::full({}, 7, at::kLong)));
    contents.metadata.mutable_lineage()->set_run_id("run-42");
    contents.metadata.mutable_lineage()->set_dataset("imagenet-1k");
    (*contents.metadata.mutable_metrics())["loss"] = 0.25;
    absl::StatusOr<CommitResult> committed = CommitCheckpoint(*store_, "m", contents, options);
    EXPECT_OK(committed.status());
    return committed.ok() ? committed->version.version() : 0;
  }

  ServingSyncOptions Options(const std::string& alias = "production") {
    ServingSyncOptions options;
    options.model = "m";
    options.alias = alias;
    options.directory = serving_;
    options.initial_backoff = absl::Milliseconds(20);
    options.log = [this](absl::string_view line) {
      absl::MutexLock lock(&log_mu_);
      log_.emplace_back(line);
    };
    return options;
  }

  std::string Current() { return ReadAll(serving_ + "/m/CURRENT"); }

  // Waits (up to 30 s) until CURRENT holds `version`.
  bool WaitForCurrent(int64_t version) {
    const std::string wanted = absl::StrCat(version, "\n");
    for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
      if (Current() == wanted) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::vector<std::string> Log() {
    absl::MutexLock lock(&log_mu_);
    return log_;
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::unique_ptr<LocalLoader> loader_;
  std::string serving_;
  absl::Mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(ServingSyncTest, SyncOnceWritesTheVersionDirectoryMetadataAndCurrent) {
  const int64_t first = Commit(1, {"production"});
  v1::AnnotationChange change;
  (*change.mutable_set_metrics())["val_acc"] = 0.91;
  ASSERT_OK(store_->AnnotateVersion("m", first, change, {"eval", "nightly"}).status());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> sync,
                       ServingSync::Create(*store_, *loader_, Options()));
  ASSERT_OK_AND_ASSIGN(SyncedVersion synced, sync->SyncOnce());
  EXPECT_EQ(synced.version, first);
  EXPECT_TRUE(synced.exported);
  EXPECT_EQ(synced.path, serving_ + "/m/1");
  EXPECT_EQ(Current(), "1\n");
  EXPECT_EQ(sync->current_version(), 1);
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock", "1", "CURRENT"));
  EXPECT_THAT(Entries(synced.path), ElementsAre("metadata.json", "model.safetensors"));

  // The file holds the version's tensors, byte for byte.
  ASSERT_OK_AND_ASSIGN(CheckpointFile file, ReadCheckpointFile(synced.path + "/model.safetensors"));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint stored, LoadCheckpoint(*store_, MakeVersionRef("m", 1)));
  ASSERT_EQ(file.root.entries().size(), 3u);
  for (const StateDict::Entry& entry : stored.contents.model) {
    const Value* written = file.root.Find(entry.key);
    ASSERT_NE(written, nullptr) << entry.key;
    EXPECT_TRUE(written->tensor().equal(entry.tensor)) << entry.key;
  }

  const nlohmann::json metadata = nlohmann::json::parse(ReadAll(synced.path + "/metadata.json"));
  EXPECT_EQ(metadata["model"], "m");
  EXPECT_EQ(metadata["version"], 1);
  EXPECT_EQ(metadata["alias"], "production");
  EXPECT_EQ(metadata["format"], "safetensors");
  EXPECT_EQ(metadata["file"], "model.safetensors");
  EXPECT_EQ(metadata["file_bytes"], fs::file_size(synced.path + "/model.safetensors"));
  EXPECT_EQ(metadata["tensor_count"], 3);
  EXPECT_EQ(metadata["metadata"]["lineage"]["run_id"], "run-42");
  EXPECT_EQ(metadata["metadata"]["lineage"]["dataset"], "imagenet-1k");
  EXPECT_EQ(metadata["metadata"]["metrics"]["loss"], 0.25);
  EXPECT_EQ(metadata["annotations"]["metrics"]["val_acc"], 0.91);
  EXPECT_EQ(metadata["annotations"]["updated_by"], "eval");
  EXPECT_EQ(metadata["aliases"], nlohmann::json::array({"production"}));
  ASSERT_EQ(metadata["tensors"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(metadata["tensors"][i]["key"], stored.manifest.tensors(i).key());
    EXPECT_EQ(metadata["tensors"][i]["content_hash"],
              HexEncode(stored.manifest.tensors(i).content_hash()));
  }
  EXPECT_EQ(metadata["tensors"][0]["shape"], nlohmann::json::array({16, 4}));
  EXPECT_EQ(metadata["tensors"][0]["dtype"], "float32");
  EXPECT_TRUE(metadata.contains("synced_at"));
  EXPECT_THAT(Log(), ElementsAre(HasSubstr("synced m@production -> version 1 in ")));

  // A second sync finds it on disk.
  ASSERT_OK_AND_ASSIGN(SyncedVersion again, sync->SyncOnce());
  EXPECT_FALSE(again.exported);
}

TEST_F(ServingSyncTest, TorchFormatWritesModelPtThatMatchesTheStore) {
  Commit(3, {"production"});
  ServingSyncOptions options = Options();
  options.format = ExportFormat::kTorch;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> sync,
                       ServingSync::Create(*store_, *loader_, options));
  ASSERT_OK_AND_ASSIGN(SyncedVersion synced, sync->SyncOnce());
  EXPECT_THAT(Entries(synced.path), ElementsAre("metadata.json", "model.pt"));
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(MakeVersionRef("m", 1)));
  EXPECT_OK(CheckExportAgainstManifest(synced.path + "/model.pt", manifest));
  EXPECT_EQ(nlohmann::json::parse(ReadAll(synced.path + "/metadata.json"))["format"], "torch");
}

TEST_F(ServingSyncTest, KeepsTheNewestVersionsAndNeverTheCurrentOneAndRemovesStaleTemporaries) {
  for (int i = 1; i <= 4; ++i) Commit(i);
  fs::create_directories(serving_ + "/m/.tmp-3-deadbeef");
  std::ofstream(serving_ + "/m/.tmp-3-deadbeef/model.safetensors") << "half";
  // A sync killed while it wrote CURRENT leaves AtomicFileWriter's temporary beside it.
  std::ofstream(serving_ + "/m/CURRENT.tmp-abcdef") << "3";
  ServingSyncOptions options = Options();
  options.keep = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> sync,
                       ServingSync::Create(*store_, *loader_, options));
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock"));

  ASSERT_OK(sync->SyncVersion(1).status());
  ASSERT_OK(sync->SyncVersion(2).status());
  ASSERT_OK(sync->SyncVersion(3).status());
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock", "2", "3", "CURRENT"));
  // A rollback to an older version keeps it, dropping the oldest other.
  ASSERT_OK(sync->SyncVersion(1).status());
  EXPECT_EQ(Current(), "1\n");
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock", "1", "3", "CURRENT"));
  ASSERT_OK(sync->SyncVersion(4).status());
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock", "3", "4", "CURRENT"));
  EXPECT_THAT(sync->SyncVersion(9), StatusIs(absl::StatusCode::kNotFound, HasSubstr("m@9")));
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock", "3", "4", "CURRENT"));

  // keep 0 keeps everything.
  sync.reset();
  options.keep = 0;
  ASSERT_OK_AND_ASSIGN(sync, ServingSync::Create(*store_, *loader_, options));
  EXPECT_EQ(sync->current_version(), 4);  // read back from CURRENT
  ASSERT_OK(sync->SyncVersion(1).status());
  ASSERT_OK(sync->SyncVersion(2).status());
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock", "1", "2", "3", "4", "CURRENT"));
}

TEST_F(ServingSyncTest, ADamagedExportIsRefusedAndLeavesNothingBehind) {
  Commit(1, {"production"});
  DamagingLoader damaging(*loader_);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> sync,
                       ServingSync::Create(*store_, damaging, Options()));
  EXPECT_THAT(sync->SyncOnce(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("the export of m@1 does not match the store"),
                             HasSubstr("do not hash to the content hash"))));
  EXPECT_THAT(Entries(serving_ + "/m"), ElementsAre(".lock"));
  EXPECT_EQ(sync->current_version(), 0);

  // The same check on a file damaged later, and on one missing a tensor.
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(MakeVersionRef("m", 1)));
  const std::string path = serving_ + "/elsewhere.safetensors";
  ASSERT_OK(damaging.Export(MakeVersionRef("m", 1), {ExportFormat::kSafetensors}, path).status());
  EXPECT_THAT(CheckExportAgainstManifest(path, manifest),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("do not hash to the content hash")));
  ExportOptions subset{ExportFormat::kSafetensors};
  subset.target.include_keys = {"encoder.weight"};
  ASSERT_OK(loader_->Export(MakeVersionRef("m", 1), subset, path).status());
  EXPECT_THAT(CheckExportAgainstManifest(path, manifest),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("holds 1 tensors; m@1 has 3")));
}

TEST_F(ServingSyncTest, OneSyncPerModelDirectory) {
  Commit(1, {"production"});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> first,
                       ServingSync::Create(*store_, *loader_, Options()));
  EXPECT_THAT(ServingSync::Create(*store_, *loader_, Options("staging")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another sync holds")));
  first.reset();
  EXPECT_OK(ServingSync::Create(*store_, *loader_, Options("staging")).status());
  EXPECT_THAT(ServingSync::Create(*store_, *loader_, Options("latest!")),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ServingSyncTest, RunFollowsTheAliasThroughMovesAndDeletesUntilStopped) {
  ServingSyncOptions options = Options();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> sync,
                       ServingSync::Create(*store_, *loader_, options));
  absl::Status ended = absl::UnknownError("still running");
  std::thread runner([&] { ended = sync->Run(); });

  // Nothing to serve yet; then the alias appears with a commit, moves, and is rolled back.
  const int64_t first = Commit(1, {"production"});
  EXPECT_TRUE(WaitForCurrent(first)) << Current();
  const int64_t second = Commit(2);
  EXPECT_EQ(Current(), "1\n");  // a commit without the alias changes nothing served
  ASSERT_OK(store_->SetAlias("m", "production", second, first).status());
  EXPECT_TRUE(WaitForCurrent(second)) << Current();
  ASSERT_OK(store_->SetAlias("m", "production", first, second).status());
  EXPECT_TRUE(WaitForCurrent(first)) << Current();
  // Another alias is not followed.
  ASSERT_OK(store_->SetAlias("m", "staging", second).status());
  // Deleting the alias keeps serving what is there.
  ASSERT_OK(store_->DeleteAlias("m", "production"));
  ASSERT_OK(store_->SetAlias("m", "production", second).status());
  EXPECT_TRUE(WaitForCurrent(second)) << Current();

  sync->Stop();
  runner.join();
  EXPECT_OK(ended);
  const std::vector<std::string> log = Log();
  EXPECT_THAT(log.front(), HasSubstr("m@production does not exist (yet); waiting for it"));
  std::vector<std::string> synced;
  for (const std::string& line : log) {
    if (line.find("synced ") == 0) synced.push_back(line.substr(0, line.find(" in ")));
  }
  EXPECT_THAT(synced,
              ElementsAre("synced m@production -> version 1", "synced m@production -> version 2",
                          "synced m@production -> version 1 (already on disk)",
                          "synced m@production -> version 2 (already on disk)"));
  bool deleted_logged = false;
  for (const std::string& line : log) {
    deleted_logged |=
        line.find("no longer points anywhere; still serving version 1") != std::string::npos;
  }
  EXPECT_TRUE(deleted_logged);
}

TEST_F(ServingSyncTest, LatestFollowsEveryCommit) {
  Commit(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServingSync> sync,
                       ServingSync::Create(*store_, *loader_, Options("latest")));
  std::thread runner([&] { EXPECT_OK(sync->Run()); });
  EXPECT_TRUE(WaitForCurrent(1)) << Current();
  Commit(2);
  EXPECT_TRUE(WaitForCurrent(2)) << Current();
  // Deleting the newest version falls back to the one before.
  ASSERT_OK(store_->DeleteVersion("m", 2, false).status());
  EXPECT_TRUE(WaitForCurrent(1)) << Current();
  sync->Stop();
  runner.join();
}

}  // namespace
}  // namespace ckpt
