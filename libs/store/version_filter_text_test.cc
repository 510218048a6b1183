#include "libs/store/version_filter_text.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

TEST(ParseTimeSpecTest, DurationsAgoAndRfc3339Times) {
  ASSERT_OK_AND_ASSIGN(absl::Time week, ParseTimeSpec("--since", "7d", kNow));
  EXPECT_EQ(week, kNow - absl::Hours(168));
  ASSERT_OK_AND_ASSIGN(absl::Time minutes, ParseTimeSpec("--since", "90m", kNow));
  EXPECT_EQ(minutes, kNow - absl::Minutes(90));
  ASSERT_OK_AND_ASSIGN(absl::Time time, ParseTimeSpec("--since", "2024-05-01T12:00:00Z", kNow));
  EXPECT_EQ(time, absl::FromUnixSeconds(1714564800));
  EXPECT_THAT(ParseTimeSpec("since", "yesterday", kNow),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "since 'yesterday' is neither a duration (30m, 24h, 7d) nor an RFC 3339 "
                       "time (2024-05-01T12:00:00Z)"));
  EXPECT_THAT(ParseTimeSpec("--since", "-5h", kNow).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(VersionFilterFromTextTest, EveryPartBecomesItsCondition) {
  VersionFilterText text;
  text.tags = {"dataset=imagenet"};
  text.labels = {"team"};
  text.where = {"val_acc>=0.9", "loss=0..1"};
  text.since = "7d";
  text.until = "1h";
  ASSERT_OK_AND_ASSIGN(v1::VersionFilter filter, VersionFilterFromText(text, kNow));
  EXPECT_THAT(filter.tags(), ::testing::ElementsAre("dataset=imagenet"));
  EXPECT_THAT(filter.labels(), ::testing::ElementsAre("team"));
  ASSERT_EQ(filter.metrics_size(), 2);
  EXPECT_EQ(filter.metrics(0).name(), "val_acc");
  EXPECT_EQ(filter.created_after_unix_micros(), absl::ToUnixMicros(kNow - absl::Hours(168)));
  EXPECT_EQ(filter.created_before_unix_micros(), absl::ToUnixMicros(kNow - absl::Hours(1)));
  EXPECT_TRUE(VersionFilterText().empty());
}

TEST(VersionFilterFromTextTest, WhatCannotBeReadIsNamed) {
  VersionFilterText bad_metric;
  bad_metric.where = {"val_acc>0.9"};
  EXPECT_THAT(VersionFilterFromText(bad_metric, kNow).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  VersionFilterText backwards;
  backwards.since = "1h";
  backwards.until = "7d";  // until before since: an empty window.
  EXPECT_THAT(VersionFilterFromText(backwards, kNow).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt
