// The ckpt benchmark: prints the performance figures of the benchmarks issue as Markdown tables.
//
//   bazel run //tools/bench -- [--quick] [--runs=N] [--work_dir=DIR]
//
// Every figure is a ratio of two things measured in this run on this machine: the operation
// (the store's save, load, download, ...) against a baseline doing the same job on the same bytes
// (memcpy, raw write + fsync to the same filesystem, LibTorch's torch::save / torch::load, Python's
// torch.save / torch.load). Runs are paired (run i of the operation next to run i of its
// baseline) and each figure is the median of the paired ratios, with min and max. Absolute times
// are printed too, for diagnosis, but judged by nothing.
//
// Progress goes to stderr, the tables to stdout (paste into docs/benchmarks/history.md). --quick
// uses small sizes so it finishes in well under two minutes; CI runs it as a smoke test of the code
// paths and asserts nothing about time. The exit status is non-zero only when a measurement fails
// (an error from the store, a wrong byte count after a round trip), never for a missed target.
//
// Each figure is one function in the file of its family: R1, R2, R3, R6 and R7 (saves and loads)
// in save_load_figures.cc, R4 (the network) in network_figures.cc, R5 (the loader) in
// loader_figures.cc, M1 and M2 (memory) in memory_figures.cc, R8 and R9 (training) in
// training_figures.cc, R10 (parallel checkpoints) in parallel_save_figures.cc, M3 (a ZeRO-1
// rank's memory while it saves) in zero_save_figures.cc, D1 and D1 scoped
// in dedup_figures.cc, R11 (Python saves) in
// python_save_figures.cc; measurements.h has what several of them measure alike, and this file
// the flags and the order they run in. --figures=R5,R8 measures only those (and what they need).
// report.h has the options, the report and the memory regimes they share.
//
// Memory regimes: a ratio whose sides put bytes into memory is printed twice, once *warm* (the
// destination memory was faulted in before the timed run, on both sides) and once *cold* (fresh
// memory on both sides, faulted in during the timed run). This VM faults fresh memory in at
// 0.1-0.3 GiB/s and copies into faulted-in memory at 5-20 GiB/s, so a ratio whose two sides ran
// in different regimes measured the regimes, not the code. Each row's detail gives the minor page
// faults per MiB that each side took (256 per MiB: every 4 KiB page fresh; about 0: none), so
// the regime a row claims can be checked. Ratios where no side allocates (saves, DDP, counting)
// have one row, regime n/a.

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libs/status/status_macros.h"
#include "tools/bench/dedup_figures.h"
#include "tools/bench/loader_figures.h"
#include "tools/bench/measurements.h"
#include "tools/bench/memory_figures.h"
#include "tools/bench/network_figures.h"
#include "tools/bench/parallel_save_figures.h"
#include "tools/bench/python_save_figures.h"
#include "tools/bench/report.h"
#include "tools/bench/save_load_figures.h"
#include "tools/bench/training_figures.h"
#include "tools/bench/workloads.h"
#include "tools/bench/zero_save_figures.h"

ABSL_FLAG(bool, quick, false,
          "Small sizes and 2 runs: a smoke run of every code path in well under two minutes.");
ABSL_FLAG(int, runs, 0, "Runs per measurement (0: 3, or 2 with --quick).");
ABSL_FLAG(std::string, work_dir, "",
          "Directory for stores and files (needs ~4x the large workload free; default "
          "$TEST_TMPDIR or /tmp). Raw write+fsync baselines write here too, so they use the "
          "store's filesystem.");
ABSL_FLAG(int64_t, large_param_mib, 0,
          "Large workload: MiB of float32 parameters; Adam state triples it (0: 1024, or 32 "
          "with --quick).");
ABSL_FLAG(int, small_tensors, 0,
          "Many-small workload: tensor count (0: 10000, or 1000 with --quick).");
ABSL_FLAG(int64_t, backbone_mib, 0,
          "Fine-tune series: MiB of frozen backbone (0: 256, or 16 with --quick).");
ABSL_FLAG(int64_t, head_mib, 0,
          "Fine-tune series: MiB of head per version (0: 4, or 1 with --quick).");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "Python with torch, for the Python baselines.");
ABSL_FLAG(std::string, m1_child, "",
          "Internal: 'save' or 'load' runs one M1 measurement in this (child) process.");
ABSL_FLAG(std::string, m1_db, "", "Internal: the M1 child's store directory.");
ABSL_FLAG(int64_t, m2_tensor_mib, 0,
          "M2: MiB per tensor of the export workload, 8 float32 tensors (0: 64, or 4 with "
          "--quick).");
ABSL_FLAG(std::string, m2_child, "",
          "Internal: 'torch' or 'safetensors' runs one M2 export in this (child) process.");
ABSL_FLAG(std::string, m2_db, "", "Internal: the M2 child's store directory.");
ABSL_FLAG(std::string, m2_out, "", "Internal: the file the M2 child exports to.");
ABSL_FLAG(std::string, figures, "",
          "Comma-separated figures to measure (e.g. R5,R8); empty: all of them.");
ABSL_FLAG(std::string, r8_rank, "",
          "Internal: 'ddp' or 'single' runs one R8 training rank in this (child) process.");
ABSL_FLAG(std::string, r8_out, "", "Internal: file prefix an R8 rank writes its samples/s to.");
ABSL_FLAG(int, r8_steps, 0, "R8: timed training steps per rank (0: 200, or 20 with --quick).");
ABSL_FLAG(int, r9_steps, 0,
          "R9: timed training steps per side (0: 30, or 6 with --quick), after 5 (3) warm-up "
          "steps; batch 32 (16) per rank.");
ABSL_FLAG(int64_t, r11_mib, 0,
          "R11: MiB of the Python state dict saved (0: 1024, or 64 with --quick).");
ABSL_FLAG(std::string, m3_rank, "",
          "Internal: 'sharded' or 'gathered' runs one M3 rank in this (child) process.");
ABSL_FLAG(std::string, m3_store, "", "Internal: the store service an M3 rank saves to.");
ABSL_FLAG(std::string, m3_out, "", "Internal: file prefix an M3 rank writes its measurement to.");
ABSL_FLAG(int64_t, m3_param_mib, 0,
          "M3: MiB of float32 parameters a ZeRO-1 pair saves, with AdamW state twice that (0: "
          "256, or 16 with --quick).");
ABSL_FLAG(double, r8_bucket_cap_mib, 25,
          "R8: DataParallelOptions::bucket_cap_bytes in MiB (PyTorch's default: 25).");

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// ---- The run.

std::string MachineSummary(const BenchOptions& options) {
  std::string memory = "?";
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      memory = std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(9)));
    }
  }
  return absl::StrCat("nproc ", ::sysconf(_SC_NPROCESSORS_ONLN), ", MemTotal ", memory,
                      ", work dir ", options.work_dir);
}

absl::Status Run(const BenchOptions& options) {
  Report report;
  const Clock::time_point start = Clock::now();

  const auto wants_any = [&](std::initializer_list<const char*> ids) {
    for (const char* id : ids) {
      if (options.Wants(id)) return true;
    }
    return false;
  };

  if (wants_any({"R1", "R2", "R3", "R4", "R5", "R6", "R7", "M1"})) {
    ASSIGN_OR_RETURN(Workload large, MakeLargeWorkload(options.large_param_bytes));
    Progress(absl::StrFormat("large workload: %d tensors, %.2f GiB", large.tensors.size(),
                             large.bytes / kGiB));
    SaveLoadTimes times;
    if (wants_any({"R1", "R2", "R3", "R6", "R7"})) {
      ASSIGN_OR_RETURN(times, MeasureSaveLoad(options, large, report));
    } else {
      // R4 / R5 / M1 alone only need the version stored once (and R4 its memcpy baseline).
      times.kept_store = options.work_dir + "/store-large";
      RETURN_IF_ERROR(TimeStoreSave(large, times.kept_store).status());
      for (int run = 0; run < options.runs && options.Wants("R4"); ++run) {
        ASSIGN_OR_RETURN(double copy, TimeMemcpy(large));
        times.memcpy_s.push_back(copy);
      }
    }
    if (options.Wants("R1")) RETURN_IF_ERROR(FigureR1(large, times, report));
    if (options.Wants("R2")) RETURN_IF_ERROR(FigureR2(large, times, report));
    if (options.Wants("R3")) RETURN_IF_ERROR(FigureR3(large, times, report));
    if (options.Wants("R4")) RETURN_IF_ERROR(FigureR4(options, large, times, report));
    if (options.Wants("R5")) RETURN_IF_ERROR(FigureR5(options, large, times.kept_store, report));
    if (options.Wants("R6")) RETURN_IF_ERROR(FigureR6(large, times, report));
    if (options.Wants("R7")) RETURN_IF_ERROR(FigureR7(options, large, times, report));
    if (options.Wants("M1")) RETURN_IF_ERROR(FigureM1(options, times.kept_store, report));
    fs::remove_all(times.kept_store);
  }
  if (options.Wants("R8")) RETURN_IF_ERROR(FigureR8(options, report));
  if (options.Wants("R9")) RETURN_IF_ERROR(FigureR9(options, report));
  if (options.Wants("R10")) RETURN_IF_ERROR(FigureR10(options, report));
  if (options.Wants("M3")) RETURN_IF_ERROR(FigureM3(options, report));
  if (options.Wants("R11")) RETURN_IF_ERROR(FigureR11(options, report));

  if (wants_any({"R1", "R2", "R3", "R6"})) {
    ASSIGN_OR_RETURN(Workload small, MakeManySmallWorkload(options.small_tensors));
    Progress(absl::StrFormat("many-small workload: %d tensors, %.2f GiB", small.tensors.size(),
                             small.bytes / kGiB));
    ASSIGN_OR_RETURN(SaveLoadTimes times, MeasureSaveLoad(options, small, report));
    if (options.Wants("R1")) RETURN_IF_ERROR(FigureR1(small, times, report));
    if (options.Wants("R2")) RETURN_IF_ERROR(FigureR2(small, times, report));
    if (options.Wants("R3")) RETURN_IF_ERROR(FigureR3(small, times, report));
    if (options.Wants("R6")) RETURN_IF_ERROR(FigureR6(small, times, report));
    fs::remove_all(times.kept_store);
  }

  if (options.Wants("D1")) RETURN_IF_ERROR(FigureD1(options, report));
  if (options.Wants("M2")) RETURN_IF_ERROR(FigureM2(options, report));

  const std::string setup = absl::StrFormat(
      "%s run, %d runs per measurement; large = %d MiB fp32 parameters + Adam state; many-small "
      "= %d tensors of 4-64 KiB; fine-tune = %d MiB backbone + %d MiB head x 10. %s. Finished in "
      "%.0f s.",
      options.quick ? "Quick" : "Full", options.runs, options.large_param_bytes / kMiB,
      options.small_tensors, options.backbone_bytes / kMiB, options.head_bytes / kMiB,
      MachineSummary(options), SecondsSince(start));
  report.Print(std::cout, setup);
  return absl::OkStatus();
}

// `relative` (e.g. "tools/bench/torch_baseline.py") in this binary's runfiles, or as given.
std::string FindRunfile(const char* argv0, const std::string& relative) {
  std::vector<std::string> candidates;
  if (const char* runfiles = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(runfiles, "/ckpt/", relative));
  }
  candidates.push_back(absl::StrCat(argv0, ".runfiles/ckpt/", relative));
  candidates.push_back(relative);
  for (const std::string& candidate : candidates) {
    if (fs::exists(candidate)) return fs::absolute(candidate).string();
  }
  return relative;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints the ckpt performance figures (ratios against same-run baselines) as Markdown.\n"
      "  bench [--quick] [--runs=N] [--work_dir=DIR]");
  absl::ParseCommandLine(argc, argv);
  using ckpt::bench::BenchOptions;
  namespace fs = std::filesystem;

  BenchOptions options;
  options.quick = absl::GetFlag(FLAGS_quick);
  options.runs =
      absl::GetFlag(FLAGS_runs) > 0 ? absl::GetFlag(FLAGS_runs) : (options.quick ? 2 : 3);
  auto or_default = [&](int64_t value, int64_t full, int64_t quick) {
    return value > 0 ? value : (options.quick ? quick : full);
  };
  options.large_param_bytes = or_default(absl::GetFlag(FLAGS_large_param_mib), 1024, 32) << 20;
  options.small_tensors =
      static_cast<int>(or_default(absl::GetFlag(FLAGS_small_tensors), 10000, 1000));
  options.backbone_bytes = or_default(absl::GetFlag(FLAGS_backbone_mib), 256, 16) << 20;
  options.head_bytes = or_default(absl::GetFlag(FLAGS_head_mib), 4, 1) << 20;
  options.python = absl::GetFlag(FLAGS_python);
  options.python_script = ckpt::bench::FindRunfile(argv[0], "tools/bench/torch_baseline.py");
  options.r9_script =
      ckpt::bench::FindRunfile(argv[0], "tools/bench/scripted_training_baseline.py");
  options.trainer = ckpt::bench::FindRunfile(argv[0], "services/trainer/trainer");
  options.r11_script = ckpt::bench::FindRunfile(argv[0], "tools/bench/python_save_baseline.py");
  options.python_client_dir =
      fs::path(ckpt::bench::FindRunfile(argv[0], "clients/python/ckpt_client/__init__.py"))
          .parent_path()
          .parent_path()
          .string();
  options.r11_bytes = or_default(absl::GetFlag(FLAGS_r11_mib), 1024, 64) << 20;
  options.r9_steps = static_cast<int>(or_default(absl::GetFlag(FLAGS_r9_steps), 30, 6));
  std::error_code error;
  options.self_exe = fs::read_symlink("/proc/self/exe", error).string();

  for (absl::string_view figure :
       absl::StrSplit(absl::GetFlag(FLAGS_figures), ',', absl::SkipEmpty())) {
    options.figures.emplace_back(figure);
  }
  options.r8_steps = static_cast<int>(or_default(absl::GetFlag(FLAGS_r8_steps), 200, 20));
  options.r8_bucket_cap_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_r8_bucket_cap_mib) *
                                                     static_cast<double>(ckpt::bench::kMiB));

  const std::string r8_rank = absl::GetFlag(FLAGS_r8_rank);
  if (!r8_rank.empty()) {
    const absl::Status status = ckpt::bench::RunR8Rank(
        r8_rank, absl::GetFlag(FLAGS_r8_out), options.r8_steps, options.r8_bucket_cap_bytes);
    if (!status.ok()) {
      std::cerr << "bench R8 rank: " << status << std::endl;
      return 1;
    }
    return 0;
  }

  options.m3_param_bytes = or_default(absl::GetFlag(FLAGS_m3_param_mib), 256, 16) << 20;
  const std::string m3_rank = absl::GetFlag(FLAGS_m3_rank);
  if (!m3_rank.empty()) {
    const absl::Status status =
        ckpt::bench::RunM3Rank(m3_rank, absl::GetFlag(FLAGS_m3_store), absl::GetFlag(FLAGS_m3_out),
                               options.m3_param_bytes);
    if (!status.ok()) {
      std::cerr << "bench M3 rank: " << status << std::endl;
      return 1;
    }
    return 0;
  }

  options.m2_tensor_bytes = or_default(absl::GetFlag(FLAGS_m2_tensor_mib), 64, 4) << 20;
  const std::string m2_child = absl::GetFlag(FLAGS_m2_child);
  if (!m2_child.empty()) {
    const absl::Status status =
        ckpt::bench::RunM2Child(m2_child, absl::GetFlag(FLAGS_m2_db), absl::GetFlag(FLAGS_m2_out));
    if (!status.ok()) {
      std::cerr << "bench M2 child: " << status << std::endl;
      return 1;
    }
    return 0;
  }

  const std::string m1_child = absl::GetFlag(FLAGS_m1_child);
  if (!m1_child.empty()) {
    const absl::Status status =
        ckpt::bench::RunM1Child(options, m1_child, absl::GetFlag(FLAGS_m1_db));
    if (!status.ok()) {
      std::cerr << "bench M1 child: " << status << std::endl;
      return 1;
    }
    return 0;
  }

  std::string base = absl::GetFlag(FLAGS_work_dir);
  if (base.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string pattern = base + "/ckpt-bench-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::cerr << "bench: cannot create a directory under " << base << ": " << std::strerror(errno)
              << std::endl;
    return 1;
  }
  options.work_dir = pattern;
  const absl::Status status = ckpt::bench::Run(options);
  fs::remove_all(options.work_dir, error);
  if (!status.ok()) {
    std::cerr << "bench: " << status << std::endl;
    return 1;
  }
  return 0;
}
