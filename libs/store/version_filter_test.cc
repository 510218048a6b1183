#include "libs/store/version_filter.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

v1::VersionInfo Version(double commit_loss, double annotated_acc) {
  v1::VersionInfo info;
  (*info.mutable_metadata()->mutable_metrics())["loss"] = commit_loss;
  (*info.mutable_metadata()->mutable_metrics())["val_acc"] = 0.1;  // overridden below.
  (*info.mutable_annotations()->mutable_metrics())["val_acc"] = annotated_acc;
  (*info.mutable_annotations()->mutable_tags())["dataset"] = "imagenet";
  (*info.mutable_metadata()->mutable_labels())["team"] = "vision";
  info.mutable_metadata()->set_created_unix_micros(1000);
  return info;
}

TEST(VersionFilterTest, AnnotationMetricsOverrideCommitMetrics) {
  const std::map<std::string, double> metrics = EffectiveMetrics(Version(0.5, 0.93));
  EXPECT_EQ(metrics.at("val_acc"), 0.93);
  EXPECT_EQ(metrics.at("loss"), 0.5);
}

TEST(VersionFilterTest, ParsesEveryConditionForm) {
  ASSERT_OK_AND_ASSIGN(auto at_least, ParseMetricCondition("val_acc>=0.9"));
  EXPECT_EQ(at_least.name(), "val_acc");
  EXPECT_TRUE(at_least.has_min());
  EXPECT_FALSE(at_least.has_max());
  EXPECT_EQ(at_least.min(), 0.9);
  ASSERT_OK_AND_ASSIGN(auto at_most, ParseMetricCondition("loss <= 1e-3"));
  EXPECT_EQ(at_most.name(), "loss");
  EXPECT_EQ(at_most.max(), 1e-3);
  ASSERT_OK_AND_ASSIGN(auto between, ParseMetricCondition("lr=0.1..0.2"));
  EXPECT_EQ(between.min(), 0.1);
  EXPECT_EQ(between.max(), 0.2);
  ASSERT_OK_AND_ASSIGN(auto exactly, ParseMetricCondition("epoch=3"));
  EXPECT_EQ(exactly.min(), 3);
  EXPECT_EQ(exactly.max(), 3);
  EXPECT_EQ(FormatMetricCondition(at_least), "val_acc>=0.9");
  EXPECT_EQ(FormatMetricCondition(between), "lr=0.1..0.2");
}

TEST(VersionFilterTest, RejectsMalformedConditionsNamingTheForms) {
  for (const char* text :
       {"val_acc>0.9", ">=0.9", "val_acc", "val_acc>=x", "lr=0.3..0.2", "loss<=inf"}) {
    absl::StatusOr<v1::VersionFilter::MetricRange> range = ParseMetricCondition(text);
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_THAT(ParseMetricCondition("val_acc>0.9").status().message(), HasSubstr("NAME>=X"));
}

TEST(VersionFilterTest, MatchesTagsLabelsMetricsAndTime) {
  const v1::VersionInfo info = Version(0.5, 0.93);
  v1::VersionFilter filter;
  EXPECT_TRUE(MatchesVersionFilter(info, filter));
  filter.add_tags("dataset=imagenet");
  filter.add_labels("team");
  ASSERT_OK_AND_ASSIGN(*filter.add_metrics(), ParseMetricCondition("val_acc>=0.9"));
  filter.set_created_after_unix_micros(1000);
  filter.set_created_before_unix_micros(1001);
  ASSERT_OK(ValidateVersionFilter(filter));
  EXPECT_TRUE(MatchesVersionFilter(info, filter));

  v1::VersionFilter wrong_tag = filter;
  wrong_tag.set_tags(0, "dataset=cifar");
  EXPECT_FALSE(MatchesVersionFilter(info, wrong_tag));
  v1::VersionFilter low = filter;
  ASSERT_OK_AND_ASSIGN(*low.add_metrics(), ParseMetricCondition("val_acc>=0.95"));
  EXPECT_FALSE(MatchesVersionFilter(info, low));
  v1::VersionFilter missing_metric = filter;
  ASSERT_OK_AND_ASSIGN(*missing_metric.add_metrics(), ParseMetricCondition("f1>=0"));
  EXPECT_FALSE(MatchesVersionFilter(info, missing_metric));
  v1::VersionFilter later = filter;
  later.set_created_after_unix_micros(1001);
  later.clear_created_before_unix_micros();
  EXPECT_FALSE(MatchesVersionFilter(info, later));
}

TEST(VersionFilterTest, ExplainsWhyAMetricFails) {
  const std::map<std::string, double> metrics = {{"val_acc", 0.87}};
  ASSERT_OK_AND_ASSIGN(auto range, ParseMetricCondition("val_acc>=0.9"));
  EXPECT_EQ(MetricConditionFailure(metrics, range), "val_acc is 0.87, below 0.9");
  ASSERT_OK_AND_ASSIGN(auto f1, ParseMetricCondition("f1>=0.5"));
  EXPECT_EQ(MetricConditionFailure(metrics, f1), "it has no metric 'f1'");
  ASSERT_OK_AND_ASSIGN(auto passes, ParseMetricCondition("val_acc<=0.9"));
  EXPECT_EQ(MetricConditionFailure(metrics, passes), "");
}

TEST(VersionFilterTest, RejectsEmptyOrUnboundedFilters) {
  v1::VersionFilter filter;
  filter.add_tags("=x");
  EXPECT_EQ(ValidateVersionFilter(filter).code(), absl::StatusCode::kInvalidArgument);
  v1::VersionFilter unbounded;
  unbounded.add_metrics()->set_name("loss");
  EXPECT_EQ(ValidateVersionFilter(unbounded).code(), absl::StatusCode::kInvalidArgument);
  v1::VersionFilter empty_time;
  empty_time.set_created_after_unix_micros(5);
  empty_time.set_created_before_unix_micros(5);
  EXPECT_EQ(ValidateVersionFilter(empty_time).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
