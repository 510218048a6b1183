#ifndef CKPT_TOOLS_BENCH_REPORT_H_
#define CKPT_TOOLS_BENCH_REPORT_H_

// What every figure of tools/bench shares: the run's options, the report the figures go into
// (printed as Markdown tables), progress lines, and the memory regimes both sides of a ratio are
// measured in. bench.cc has the file comment on how figures are measured.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

using Clock = std::chrono::steady_clock;

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr int64_t kMiB = int64_t{1} << 20;

double SecondsSince(Clock::time_point start);

// One line on stderr, "[bench] message".
void Progress(const std::string& message);

struct BenchOptions {
  bool quick = false;
  int runs = 3;
  std::string work_dir;  // a fresh directory of this run, removed at the end.
  int64_t large_param_bytes = 0;
  int small_tensors = 0;
  int64_t backbone_bytes = 0;
  int64_t head_bytes = 0;
  std::string python;
  std::string python_script;
  std::string self_exe;
  std::vector<std::string> figures;  // empty: all.
  int r8_steps = 200;
  int64_t r8_bucket_cap_bytes = int64_t{25} << 20;
  int64_t m2_tensor_bytes = int64_t{64} << 20;
  int r9_steps = 30;
  std::string r9_script;                        // scripted_training_baseline.py
  std::string trainer;                          // the //services/trainer binary
  int64_t r11_bytes = int64_t{1} << 30;         // R11's state dict.
  std::string r11_script;                       // python_save_baseline.py
  std::string python_client_dir;                // clients/python (ckpt_client), for PYTHONPATH
  int64_t m3_param_bytes = int64_t{256} << 20;  // M3's parameters (AdamW state: twice this).

  bool Wants(const std::string& figure) const {
    return figures.empty() || std::find(figures.begin(), figures.end(), figure) != figures.end();
  }
};

// ---- The report.

// kReference: no target; a row that says what a baseline itself reaches (a reference to read
// the figures beside it against).
enum class Goal { kAtLeast, kAtMost, kClose, kReference };

// The memory regime a ratio was measured in (see the file comment); kNone: not applicable.
enum class Regime { kNone, kWarm, kCold };

// "warm", "cold", "n/a".
std::string RegimeName(Regime regime);

struct FigureRow {
  std::string id;
  std::string workload;
  std::string what;
  Summary ratio;
  Goal goal = Goal::kAtLeast;
  double target = 0;
  std::string detail;  // measured vs baseline, in words and units.
  Regime regime = Regime::kNone;
};

struct TimingRow {
  std::string operation;
  std::string workload;
  int64_t bytes = 0;
  int64_t tensors = 0;
  Summary seconds;
  Regime regime = Regime::kNone;
};

class Report {
 public:
  void AddTiming(std::string operation, const Workload& workload, const std::vector<double>& s,
                 Regime regime = Regime::kNone) {
    AddTiming(std::move(operation), workload.name, workload.bytes,
              static_cast<int64_t>(workload.tensors.size()), s, regime);
  }
  void AddTiming(std::string operation, std::string workload, int64_t bytes, int64_t tensors,
                 const std::vector<double>& seconds, Regime regime = Regime::kNone) {
    timings_.push_back(
        {std::move(operation), std::move(workload), bytes, tensors, Summarize(seconds), regime});
    const TimingRow& row = timings_.back();
    Progress(absl::StrFormat("  %s (%s, %s): %s s, %.2f GiB/s", row.operation, row.workload,
                             RegimeName(row.regime), FormatSummary(row.seconds, 3),
                             row.seconds.median > 0 ? row.bytes / kGiB / row.seconds.median : 0));
  }
  void AddFigure(FigureRow row) {
    Progress(absl::StrFormat("  %s %s (%s): %s", row.id, row.workload, RegimeName(row.regime),
                             FormatSummary(row.ratio, 3)));
    figures_.push_back(std::move(row));
  }

  // The figures, then the timings, as Markdown tables after `setup` (one paragraph).
  void Print(std::ostream& out, const std::string& setup) const;

 private:
  std::vector<FigureRow> figures_;
  std::vector<TimingRow> timings_;
};

// GiB/s at the median of `seconds`; 0 for no time.
double GiBps(int64_t bytes, const std::vector<double>& seconds);

double Median(const std::vector<double>& values);

// ---- Memory regimes.
//
// glibc's malloc decides whether freed memory stays in the process (the next allocation of that
// size reuses pages already faulted in) or goes back to the kernel (the next one faults fresh
// pages in). By default it adapts: freeing a mapping raises the mmap threshold (up to 32 MiB), so
// whether a load landed in reused or fresh memory depended on what ran before it, and Python's
// second torch.load reused its first one's heap while our loads mapped fresh memory. Each regime
// sets malloc explicitly on both sides, with the same values: this process through mallopt,
// Python through glibc's MALLOC_*_ environment variables.
//   warm: mmap threshold at glibc's maximum (32 MiB) and no trimming, plus one untimed run
//         before the timed ones: freed memory stays and is reused, faulted in.
//   cold: every allocation of 128 KiB or more is a fresh mapping, unmapped when freed, and free
//         heap pages are returned first (malloc_trim): every timed run faults its memory in.
// Allocations over 32 MiB are always fresh mappings in glibc, whatever the regime (the benchmark's
// tensors are at most 16 MiB; the fault counts show it).

// The environment that puts a Python child (or any child process) into `regime` (see above).
std::string PythonMallocEnvironment(Regime regime);

// Sets this process's malloc to `regime` while it lives. On exit, free memory goes back to the
// kernel and malloc keeps the settings its own adaptation reaches after freeing a 32 MiB mapping,
// so the measurements outside any regime run as they did before regimes existed.
class ScopedMallocRegime {
 public:
  explicit ScopedMallocRegime(Regime regime);
  ~ScopedMallocRegime();
  ScopedMallocRegime(const ScopedMallocRegime&) = delete;
  ScopedMallocRegime& operator=(const ScopedMallocRegime&) = delete;
};

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_REPORT_H_
