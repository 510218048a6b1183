#include "libs/store/refused_call_log.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

class RefusedCallLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.db_path = ::testing::TempDir() + "/refused_call_log_" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(options.db_path);
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(options));
  }

  std::vector<v1::AuditRecord> Records() {
    absl::StatusOr<std::vector<v1::AuditRecord>> records = store_->ListAudit({});
    EXPECT_OK(records.status());
    return records.ok() ? *records : std::vector<v1::AuditRecord>();
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
};

TEST_F(RefusedCallLogTest, ARefusedCallIsOneFailedRecordNamingWhoWhereWhatAndWhy) {
  RefusedCallLog log(*store_, {});
  log.Record({"team-a", "ipv4:10.0.0.1:5000", "GetManifest", "team-b-net",
              absl::PermissionDeniedError("identity 'team-a' may not read model 'team-b-net'")});
  log.Record({"", "ipv4:10.0.0.9:6000", "ListModels", "",
              absl::UnauthenticatedError("the bearer token is not valid")});
  const std::vector<v1::AuditRecord> records = Records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].identity(), "team-a");
  EXPECT_EQ(records[0].peer(), "ipv4:10.0.0.1:5000");
  EXPECT_EQ(records[0].action(), "refused");
  EXPECT_EQ(records[0].model(), "team-b-net");
  EXPECT_EQ(records[0].detail(), "GetManifest");
  EXPECT_EQ(records[0].outcome(), v1::AuditRecord::FAILED);
  EXPECT_EQ(records[0].error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(records[0].error_message(), HasSubstr("may not read model 'team-b-net'"));
  EXPECT_EQ(records[1].identity(), "unknown");
  EXPECT_EQ(records[1].error_code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(log.recorded(), 2);
  EXPECT_EQ(log.dropped(), 0);
}

TEST_F(RefusedCallLogTest, AFloodIsBoundedAndTheDroppedAreCountedInASummary) {
  RefusedCallLog::Options options;
  options.burst = 5;
  options.records_per_second = 2;
  {
    RefusedCallLog log(*store_, options);
    for (int i = 0; i < 10000; ++i) {
      log.Record({"", "ipv4:10.0.0.9:6000", "ListModels", "", absl::UnauthenticatedError("no")});
    }
    EXPECT_EQ(log.seen(), 10000);
    // The burst, and what the rate refilled while the loop ran (well under a second here).
    EXPECT_GE(log.recorded(), 5);
    EXPECT_LE(log.recorded(), 10);
    EXPECT_EQ(log.recorded() + log.dropped(), 10000);
    const size_t flood_records = Records().size();
    EXPECT_EQ(flood_records, static_cast<size_t>(log.recorded()));
    // Once the bucket refilled, the next refusal brings the summary of the dropped ones.
    absl::SleepFor(absl::Seconds(1.2));
    log.Record(
        {"team-a", "ipv4:10.0.0.1:5000", "GarbageCollect", "", absl::PermissionDeniedError("no")});
    const std::vector<v1::AuditRecord> records = Records();
    ASSERT_EQ(records.size(), flood_records + 2);
    const v1::AuditRecord& summary = records[records.size() - 2];
    EXPECT_EQ(summary.action(), "refusals_dropped");
    EXPECT_EQ(summary.outcome(), v1::AuditRecord::OK);
    EXPECT_THAT(summary.detail(),
                HasSubstr(absl::StrCat(10000 - flood_records, " refused calls from ")));
    EXPECT_EQ(records.back().identity(), "team-a");
    // Refusals that stop mid-flood are summarized when the log goes.
    for (int i = 0; i < 100; ++i) {
      log.Record({"", "ipv4:10.0.0.9:6000", "ListModels", "", absl::UnauthenticatedError("no")});
    }
  }
  const std::vector<v1::AuditRecord> records = Records();
  EXPECT_EQ(records.back().action(), "refusals_dropped");
  EXPECT_LT(records.size(), 30u);
}

TEST_F(RefusedCallLogTest, WritesGoWhereTheyAreScheduled) {
  std::vector<std::function<void()>> queued;
  RefusedCallLog::Options options;
  options.schedule = [&](std::function<void()> work) { queued.push_back(std::move(work)); };
  RefusedCallLog log(*store_, options);
  log.Record({"team-a", "p", "Verify", "", absl::PermissionDeniedError("no")});
  EXPECT_TRUE(Records().empty());
  ASSERT_EQ(queued.size(), 1u);
  queued[0]();
  EXPECT_EQ(Records().size(), 1u);
}

}  // namespace
}  // namespace ckpt
