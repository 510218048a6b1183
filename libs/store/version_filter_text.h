#ifndef CKPT_LIBS_STORE_VERSION_FILTER_TEXT_H_
#define CKPT_LIBS_STORE_VERSION_FILTER_TEXT_H_

// A version filter as people write it: `ckpt ls --tag/--label/--where/--since/--until` and the
// console's ?tag=&label=&where=&since=&until= read it here, so both accept the same text and
// refuse it with the same words.
//
// Example:
//   VersionFilterText text;
//   text.where = {"val_acc>=0.9"};
//   text.since = "7d";
//   ASSIGN_OR_RETURN(v1::VersionFilter filter, VersionFilterFromText(text));

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

struct VersionFilterText {
  std::vector<std::string> tags;    // "KEY=VALUE" or "KEY"
  std::vector<std::string> labels;  // "KEY=VALUE" or "KEY"
  std::vector<std::string> where;   // metric conditions, ParseMetricCondition's forms
  std::string since;                // ParseTimeSpec's forms; empty: no bound
  std::string until;

  bool empty() const {
    return tags.empty() && labels.empty() && where.empty() && since.empty() && until.empty();
  }
};

// A time as people give one: a duration ago ("30m", "24h", "7d") from `now`, or an RFC 3339 time
// ("2024-05-01T12:00:00Z"). INVALID_ARGUMENT naming `what` (e.g. "--since") otherwise.
absl::StatusOr<absl::Time> ParseTimeSpec(absl::string_view what, absl::string_view text,
                                         absl::Time now = absl::Now());

// The filter `text` describes, validated (ValidateVersionFilter). INVALID_ARGUMENT naming the
// option ("--where 'x'", "--since ...") that cannot be read.
absl::StatusOr<v1::VersionFilter> VersionFilterFromText(const VersionFilterText& text,
                                                        absl::Time now = absl::Now());

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_VERSION_FILTER_TEXT_H_
