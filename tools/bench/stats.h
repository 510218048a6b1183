#ifndef CKPT_TOOLS_BENCH_STATS_H_
#define CKPT_TOOLS_BENCH_STATS_H_

// Summaries of repeated measurements, as the benchmark tables print them: the median of several
// runs with their min and max. Figures are ratios of paired runs (run i of the measured operation
// against run i of its baseline, taken back to back), so slow drift of a busy machine hits both
// sides of each ratio alike.
//
// Example:
//   Summary seconds = Summarize({1.2, 1.0, 1.1});     // median 1.1, min 1.0, max 1.2
//   std::string cell = FormatSummary(seconds, 3);      // "1.100 [1.000, 1.200]"
//   absl::StatusOr<std::vector<double>> ratios = PairedRatios(baseline_s, store_s);

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct Summary {
  double median = 0;
  double min = 0;
  double max = 0;
  int runs = 0;
};

// Median (mean of the middle two for an even count), min and max. An empty input gives runs = 0
// and zeros.
Summary Summarize(std::vector<double> values);

// "MEDIAN [MIN, MAX]" with `digits` decimals; "MEDIAN" alone for one run; "-" for none.
std::string FormatSummary(const Summary& summary, int digits);

// numerators[i] / denominators[i] for each i. INVALID_ARGUMENT when the sizes differ or a
// denominator is not positive (a ratio over a zero time is a measuring error, not a figure).
absl::StatusOr<std::vector<double>> PairedRatios(const std::vector<double>& numerators,
                                                 const std::vector<double>& denominators);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_STATS_H_
