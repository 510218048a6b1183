#ifndef CKPT_LIBS_STORE_VERSION_FILTER_H_
#define CKPT_LIBS_STORE_VERSION_FILTER_H_

// Selecting versions by what is known about them: v1::VersionFilter (tags, labels, metric ranges,
// creation time) and metric conditions as people write them ("val_acc>=0.9"), shared by
// ListVersions' filter and promotion rules.
//
// A version's metrics are its annotation metrics (added after commit, e.g. by evaluation) over
// its commit-time metrics (VersionMetadata.metrics, e.g. the trainer's loss): an annotation wins
// where both name a metric.
//
// Example:
//   ASSIGN_OR_RETURN(v1::VersionFilter::MetricRange range, ParseMetricCondition("val_acc>=0.9"));
//   v1::VersionFilter filter;
//   *filter.add_metrics() = range;
//   filter.add_tags("dataset=imagenet");
//   if (MatchesVersionFilter(info, filter)) ...

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"
#include "proto/ckpt/v1/registry.pb.h"

namespace ckpt {

// The version's metrics: annotation metrics over commit-time ones.
std::map<std::string, double> EffectiveMetrics(const v1::VersionInfo& info);

// INVALID_ARGUMENT naming the fault: an empty tag / label / metric name, a range with neither
// bound or min > max, a non-finite bound, created_after >= created_before.
absl::Status ValidateVersionFilter(const v1::VersionFilter& filter);

// Whether `info` satisfies every condition of `filter` (assumed valid).
bool MatchesVersionFilter(const v1::VersionInfo& info, const v1::VersionFilter& filter);

// "NAME>=X", "NAME<=X", "NAME=X" or "NAME=LO..HI": bounds are inclusive, so strict comparisons
// are not offered. INVALID_ARGUMENT listing the accepted forms otherwise.
absl::StatusOr<v1::VersionFilter::MetricRange> ParseMetricCondition(absl::string_view text);

// "val_acc>=0.9" (the form ParseMetricCondition reads back).
std::string FormatMetricCondition(const v1::VersionFilter::MetricRange& range);

// Why `metrics` fails `range`, for people ("val_acc is 0.87, below 0.9"; "no metric
// 'val_acc'"); empty when it passes.
std::string MetricConditionFailure(const std::map<std::string, double>& metrics,
                                   const v1::VersionFilter::MetricRange& range);

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_VERSION_FILTER_H_
