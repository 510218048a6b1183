#include "tools/bench/report.h"

#include <malloc.h>

#include <iostream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::bench {
namespace {

constexpr int kMallocMaxMmapThreshold = 32 << 20;
constexpr int kMallocColdThreshold = 128 << 10;

}  // namespace

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void Progress(const std::string& message) { std::cerr << "[bench] " << message << std::endl; }

std::string RegimeName(Regime regime) {
  switch (regime) {
    case Regime::kWarm:
      return "warm";
    case Regime::kCold:
      return "cold";
    case Regime::kNone:
      break;
  }
  return "n/a";
}

void Report::Print(std::ostream& out, const std::string& setup) const {
  out << "## Figures\n\n" << setup << "\n\n";
  out << "| Figure | Workload | Regime | What | Ratio: median [min, max] | Target | Met | Detail "
         "|\n";
  out << "|---|---|---|---|---|---|---|---|\n";
  for (const FigureRow& row : figures_) {
    std::string target;
    switch (row.goal) {
      case Goal::kAtLeast:
        target = absl::StrFormat(">= %g", row.target);
        break;
      case Goal::kAtMost:
        target = absl::StrFormat("<= %g", row.target);
        break;
      case Goal::kClose:
        target = absl::StrFormat("~ %.4f (expected)", row.target);
        break;
      case Goal::kReference:
        target = "(reference)";
        break;
    }
    bool met = false;
    switch (row.goal) {
      case Goal::kAtLeast:
        met = row.ratio.median >= row.target;
        break;
      case Goal::kAtMost:
        met = row.ratio.median <= row.target;
        break;
      // Within 5% of the ideal: dedup stores each distinct chunk once, plus nothing.
      case Goal::kClose:
        met = row.ratio.median <= row.target * 1.05;
        break;
      case Goal::kReference:
        break;
    }
    out << "| " << row.id << " | " << row.workload << " | " << RegimeName(row.regime) << " | "
        << row.what << " | " << FormatSummary(row.ratio, 3) << " | " << target << " | "
        << (row.goal == Goal::kReference ? "n/a"
            : met                        ? "yes"
                                         : "**no**")
        << " | " << row.detail << " |\n";
  }
  out << "\n## Timings\n\n";
  out << "| Operation | Workload | Regime | Bytes | Tensors | Seconds: median [min, max] | GiB/s "
         "(median) |\n";
  out << "|---|---|---|---|---|---|---|\n";
  for (const TimingRow& row : timings_) {
    out << "| " << row.operation << " | " << row.workload << " | " << RegimeName(row.regime)
        << " | " << row.bytes << " | " << row.tensors << " | " << FormatSummary(row.seconds, 3)
        << " | "
        << absl::StrFormat("%.2f",
                           row.seconds.median > 0 ? row.bytes / kGiB / row.seconds.median : 0.0)
        << " |\n";
  }
}

double GiBps(int64_t bytes, const std::vector<double>& seconds) {
  const Summary s = Summarize(seconds);
  return s.median > 0 ? bytes / kGiB / s.median : 0;
}

double Median(const std::vector<double>& values) { return Summarize(values).median; }

std::string PythonMallocEnvironment(Regime regime) {
  if (regime == Regime::kWarm) {
    return absl::StrCat("MALLOC_MMAP_THRESHOLD_=", kMallocMaxMmapThreshold,
                        " MALLOC_TRIM_THRESHOLD_=", std::numeric_limits<size_t>::max());
  }
  return absl::StrCat("MALLOC_MMAP_THRESHOLD_=", kMallocColdThreshold,
                      " MALLOC_TRIM_THRESHOLD_=", kMallocColdThreshold);
}

ScopedMallocRegime::ScopedMallocRegime(Regime regime) {
  if (regime == Regime::kWarm) {
    ::mallopt(M_MMAP_THRESHOLD, kMallocMaxMmapThreshold);
    ::mallopt(M_TRIM_THRESHOLD, -1);  // glibc reads it as a size_t: never trim.
  } else {
    ::mallopt(M_MMAP_THRESHOLD, kMallocColdThreshold);
    ::mallopt(M_TRIM_THRESHOLD, kMallocColdThreshold);
    ::malloc_trim(0);
  }
}

ScopedMallocRegime::~ScopedMallocRegime() {
  ::mallopt(M_MMAP_THRESHOLD, kMallocMaxMmapThreshold);
  ::mallopt(M_TRIM_THRESHOLD, 2 * kMallocMaxMmapThreshold);
  ::malloc_trim(0);
}

}  // namespace ckpt::bench
