#include "tools/bench/stats.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::bench {

Summary Summarize(std::vector<double> values) {
  Summary summary;
  summary.runs = static_cast<int>(values.size());
  if (values.empty()) return summary;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  summary.median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  summary.min = values.front();
  summary.max = values.back();
  return summary;
}

std::string FormatSummary(const Summary& summary, int digits) {
  if (summary.runs == 0) return "-";
  if (summary.runs == 1) return absl::StrFormat("%.*f", digits, summary.median);
  return absl::StrFormat("%.*f [%.*f, %.*f]", digits, summary.median, digits, summary.min, digits,
                         summary.max);
}

absl::StatusOr<std::vector<double>> PairedRatios(const std::vector<double>& numerators,
                                                 const std::vector<double>& denominators) {
  if (numerators.size() != denominators.size()) {
    return absl::InvalidArgumentError(absl::StrCat("paired ratios need as many numerators (",
                                                   numerators.size(), ") as denominators (",
                                                   denominators.size(), ")"));
  }
  std::vector<double> ratios;
  ratios.reserve(numerators.size());
  for (size_t i = 0; i < numerators.size(); ++i) {
    if (!(denominators[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", i, ": denominator ", denominators[i], " is not positive"));
    }
    ratios.push_back(numerators[i] / denominators[i]);
  }
  return ratios;
}

}  // namespace ckpt::bench
