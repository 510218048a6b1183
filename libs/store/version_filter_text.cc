#include "libs/store/version_filter_text.h"

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_filter.h"

namespace ckpt {

absl::StatusOr<absl::Time> ParseTimeSpec(absl::string_view what, absl::string_view text,
                                         absl::Time now) {
  int64_t days = 0;
  if (absl::EndsWith(text, "d") && absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) &&
      days >= 0) {
    return now - absl::Hours(24 * days);
  }
  absl::Duration duration;
  if (absl::ParseDuration(text, &duration) && duration >= absl::ZeroDuration()) {
    return now - duration;
  }
  absl::Time time;
  std::string error;
  if (absl::ParseTime(absl::RFC3339_full, std::string(text), &time, &error)) return time;
  return absl::InvalidArgumentError(absl::StrCat(
      what, " '", text,
      "' is neither a duration (30m, 24h, 7d) nor an RFC 3339 time (2024-05-01T12:00:00Z)"));
}

absl::StatusOr<v1::VersionFilter> VersionFilterFromText(const VersionFilterText& text,
                                                        absl::Time now) {
  v1::VersionFilter filter;
  for (const std::string& tag : text.tags) filter.add_tags(tag);
  for (const std::string& label : text.labels) filter.add_labels(label);
  for (const std::string& condition : text.where) {
    ASSIGN_OR_RETURN(*filter.add_metrics(), ParseMetricCondition(condition));
  }
  if (!text.since.empty()) {
    ASSIGN_OR_RETURN(const absl::Time since, ParseTimeSpec("--since", text.since, now));
    filter.set_created_after_unix_micros(absl::ToUnixMicros(since));
  }
  if (!text.until.empty()) {
    ASSIGN_OR_RETURN(const absl::Time until, ParseTimeSpec("--until", text.until, now));
    filter.set_created_before_unix_micros(absl::ToUnixMicros(until));
  }
  RETURN_IF_ERROR(ValidateVersionFilter(filter));
  return filter;
}

}  // namespace ckpt
