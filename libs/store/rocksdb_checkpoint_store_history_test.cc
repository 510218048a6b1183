// The RocksDB store's registry beyond the conformance suite: the history and its sequence numbers
// survive reopening (so a watch resumes across a store restart), and a store from before the
// registry opens with an empty history.

#include <cstdlib>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/rocksdb_schema.h"
#include "libs/store/testing/legacy_store.h"

namespace ckpt {
namespace {

using ::testing::IsEmpty;

class RocksDbRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    options_.db_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
    Reopen();
  }

  void Reopen() {
    store_.reset();
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options_));
  }

  void Commit(const std::string& model, float value, std::vector<std::string> aliases = {}) {
    CommitOptions options;
    options.aliases = std::move(aliases);
    CheckpointContents contents;
    ASSERT_OK(contents.model.Insert("w", at::full({4}, value)));
    ASSERT_OK(CommitCheckpoint(*store_, model, contents, options).status());
  }

  StoreOptions options_;
  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(RocksDbRegistryTest, AWatchResumesAcrossAStoreRestartWithoutGapsOrRepeats) {
  Commit("m", 1, {"production"});
  v1::WatchRequest request;
  request.add_models("m");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, store_->Watch(request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> state,
                       watch->Next(absl::Now() + absl::Seconds(5)));
  ASSERT_TRUE(state.has_value() && state->has_state());
  const int64_t token = state->resume_token();
  watch.reset();

  // While the watcher is away: a change, a restart, more changes.
  Commit("m", 2);
  Reopen();
  ASSERT_OK(store_->SetAlias("m", "production", 2, 1, {"ops", "roll forward"}).status());
  Commit("m", 3);

  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> history, store_->ListHistory({}));
  std::vector<int64_t> expected;
  for (const v1::RegistryEvent& event : history) {
    if (event.sequence() > token) expected.push_back(event.sequence());
  }
  ASSERT_EQ(expected.size(), 3u);
  request.set_resume_token(token);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> resumed, store_->Watch(request));
  std::vector<int64_t> seen;
  while (true) {
    ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> update,
                         resumed->Next(absl::Now() + absl::Milliseconds(300)));
    if (!update.has_value()) break;
    ASSERT_TRUE(update->has_event());
    seen.push_back(update->event().sequence());
  }
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(history.back().kind(), v1::RegistryEvent::VERSION_COMMITTED);
  EXPECT_EQ(history[history.size() - 2].identity(), "ops");
}

TEST_F(RocksDbRegistryTest, StoreFromBeforeTheRegistryOpensWithAnEmptyHistory) {
  store_.reset();
  const std::string path = options_.db_path + "_old";
  // The column families a store had before `history` and `annotations` existed.
  ASSERT_OK(testing::CreateLegacyStore(path, ColumnFamily::kAudit));
  options_.db_path = path;
  options_.create_if_missing = false;
  Reopen();
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> history, store_->ListHistory({}));
  EXPECT_THAT(history, IsEmpty());
  Commit("m", 1);
  ASSERT_OK_AND_ASSIGN(history, store_->ListHistory({}));
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].sequence(), 1);
  EXPECT_EQ(history[0].identity(), "unknown");  // a bare store is told no identity.
}

}  // namespace
}  // namespace ckpt
