#include "libs/store/version_filter.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// "key=value" must be in `entries` with that value; "key" must be there at all.
bool HasEntry(const google::protobuf::Map<std::string, std::string>& entries,
              absl::string_view condition) {
  const size_t equals = condition.find('=');
  if (equals == absl::string_view::npos) return entries.count(std::string(condition)) > 0;
  auto it = entries.find(std::string(condition.substr(0, equals)));
  return it != entries.end() && it->second == condition.substr(equals + 1);
}

absl::Status ValidateEntryConditions(const google::protobuf::RepeatedPtrField<std::string>& list,
                                     absl::string_view what) {
  for (const std::string& condition : list) {
    if (condition.empty() || condition.front() == '=') {
      return absl::InvalidArgumentError(absl::StrCat(
          "a ", what, " condition needs a name: 'KEY' or 'KEY=VALUE', got '", condition, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ParseBound(absl::string_view text, absl::string_view condition) {
  double value = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric condition '", condition, "': '", text, "' is not a finite number"));
  }
  return value;
}

}  // namespace

std::map<std::string, double> EffectiveMetrics(const v1::VersionInfo& info) {
  std::map<std::string, double> metrics(info.metadata().metrics().begin(),
                                        info.metadata().metrics().end());
  for (const auto& [name, value] : info.annotations().metrics()) metrics[name] = value;
  return metrics;
}

absl::Status ValidateVersionFilter(const v1::VersionFilter& filter) {
  RETURN_IF_ERROR(ValidateEntryConditions(filter.tags(), "tag"));
  RETURN_IF_ERROR(ValidateEntryConditions(filter.labels(), "label"));
  for (const v1::VersionFilter::MetricRange& range : filter.metrics()) {
    if (range.name().empty()) {
      return absl::InvalidArgumentError("a metric range needs the metric's name");
    }
    if (!range.has_min() && !range.has_max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric range on '", range.name(), "' has neither a minimum nor a maximum"));
    }
    if ((range.has_min() && !std::isfinite(range.min())) ||
        (range.has_max() && !std::isfinite(range.max()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric range on '", range.name(), "' has a bound that is not finite"));
    }
    if (range.has_min() && range.has_max() && range.min() > range.max()) {
      return absl::InvalidArgumentError(absl::StrCat("metric range on '", range.name(),
                                                     "' is empty: minimum ", range.min(),
                                                     " > maximum ", range.max()));
    }
  }
  if (filter.created_after_unix_micros() > 0 && filter.created_before_unix_micros() > 0 &&
      filter.created_after_unix_micros() >= filter.created_before_unix_micros()) {
    return absl::InvalidArgumentError(
        "the creation-time range is empty: created_after is not before created_before");
  }
  return absl::OkStatus();
}

bool MatchesVersionFilter(const v1::VersionInfo& info, const v1::VersionFilter& filter) {
  for (const std::string& tag : filter.tags()) {
    if (!HasEntry(info.annotations().tags(), tag)) return false;
  }
  for (const std::string& label : filter.labels()) {
    if (!HasEntry(info.metadata().labels(), label)) return false;
  }
  if (filter.metrics_size() > 0) {
    const std::map<std::string, double> metrics = EffectiveMetrics(info);
    for (const v1::VersionFilter::MetricRange& range : filter.metrics()) {
      if (!MetricConditionFailure(metrics, range).empty()) return false;
    }
  }
  const int64_t created = info.metadata().created_unix_micros();
  if (filter.created_after_unix_micros() > 0 && created < filter.created_after_unix_micros()) {
    return false;
  }
  if (filter.created_before_unix_micros() > 0 && created >= filter.created_before_unix_micros()) {
    return false;
  }
  return true;
}

absl::StatusOr<v1::VersionFilter::MetricRange> ParseMetricCondition(absl::string_view text) {
  const auto invalid = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric condition '", text,
        "' is not one of NAME>=X, NAME<=X, NAME=X or NAME=LO..HI (bounds are inclusive)"));
  };
  v1::VersionFilter::MetricRange range;
  size_t op = text.find_first_of("<>=");
  if (op == absl::string_view::npos || op == 0) return invalid();
  range.set_name(std::string(absl::StripAsciiWhitespace(text.substr(0, op))));
  if (range.name().empty()) return invalid();
  absl::string_view rest = text.substr(op);
  if (absl::ConsumePrefix(&rest, ">=")) {
    ASSIGN_OR_RETURN(double min, ParseBound(rest, text));
    range.set_min(min);
  } else if (absl::ConsumePrefix(&rest, "<=")) {
    ASSIGN_OR_RETURN(double max, ParseBound(rest, text));
    range.set_max(max);
  } else if (absl::ConsumePrefix(&rest, "=")) {
    const size_t dots = rest.find("..");
    ASSIGN_OR_RETURN(double low, ParseBound(rest.substr(0, dots), text));
    double high = low;
    if (dots != absl::string_view::npos) {
      ASSIGN_OR_RETURN(high, ParseBound(rest.substr(dots + 2), text));
    }
    range.set_min(low);
    range.set_max(high);
  } else {
    return invalid();
  }
  v1::VersionFilter check;
  *check.add_metrics() = range;
  RETURN_IF_ERROR(ValidateVersionFilter(check));
  return range;
}

std::string FormatMetricCondition(const v1::VersionFilter::MetricRange& range) {
  if (range.has_min() && range.has_max()) {
    if (range.min() == range.max()) return absl::StrCat(range.name(), "=", range.min());
    return absl::StrCat(range.name(), "=", range.min(), "..", range.max());
  }
  if (range.has_min()) return absl::StrCat(range.name(), ">=", range.min());
  return absl::StrCat(range.name(), "<=", range.max());
}

std::string MetricConditionFailure(const std::map<std::string, double>& metrics,
                                   const v1::VersionFilter::MetricRange& range) {
  auto it = metrics.find(range.name());
  if (it == metrics.end()) return absl::StrCat("it has no metric '", range.name(), "'");
  const double value = it->second;
  if (range.has_min() && !(value >= range.min())) {
    return absl::StrCat(range.name(), " is ", value, ", below ", range.min());
  }
  if (range.has_max() && !(value <= range.max())) {
    return absl::StrCat(range.name(), " is ", value, ", above ", range.max());
  }
  return "";
}

}  // namespace ckpt
