#include "tools/bench/memory_figures.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/loader/export.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "tools/bench/measurements.h"
#include "tools/bench/run_command.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// ---- M1: peak RSS, each measured in a fresh child process (this binary re-executed with
// --m1_child) so the parent's heap, page cache of other figures and allocator state do not count.

absl::StatusOr<double> MeasureM1(const BenchOptions& options, const std::string& mode,
                                 const std::string& db, std::string& detail) {
  ASSIGN_OR_RETURN(
      std::string printed,
      RunCommand(absl::StrCat(options.self_exe, " --m1_child=", mode, " --m1_db=", db,
                              " --large_param_mib=", options.large_param_bytes / kMiB)));
  int64_t baseline_kib = 0, peak_kib = 0, bytes = 0;
  const size_t at = printed.rfind("M1 ");
  if (at == std::string::npos ||
      std::sscanf(printed.c_str() + at, "M1 %ld %ld %ld", &baseline_kib, &peak_kib, &bytes) != 3 ||
      bytes <= 0) {
    return absl::InternalError("the M1 child printed no measurement: " + printed);
  }
  const double extra_mib = ((peak_kib - baseline_kib) * 1024.0 - bytes) / kMiB;
  detail = absl::StrFormat("%s: peak - baseline %.0f MiB for %.0f MiB (%+.0f MiB)", mode,
                           (peak_kib - baseline_kib) / 1024.0, bytes / double(kMiB), extra_mib);
  return (peak_kib - baseline_kib) * 1024.0 / bytes;
}

// ---- M2: an export's peak memory against the version's largest tensor. Like M1, each export
// runs in a fresh child process (this binary with --m2_child): the store is opened and the
// version's manifest read first, VmHWM is reset to the RSS then (clear_refs 5), and the figure
// is (VmHWM after ExportToFile - that RSS) / largest tensor bytes -- everything the export adds,
// tensors read (mapped store pages count while mapped), casts, pickle and buffers; the page
// cache of the written file is not the process's memory and does not count.

constexpr int kM2Tensors = 8;

}  // namespace

// Runs in the child. Prints "M1 <baseline KiB> <peak KiB> <checkpoint bytes>".
absl::Status RunM1Child(const BenchOptions& options, const std::string& mode,
                        const std::string& db) {
  ResetPeakMemory();  // the peak is this measurement's alone.
  ASSIGN_OR_RETURN(ProcMemory baseline, ReadProcMemory());
  int64_t bytes = 0;
  ProcMemory peak;
  if (mode == "save") {
    ASSIGN_OR_RETURN(Workload workload, MakeLargeWorkload(options.large_param_bytes));
    bytes = workload.bytes;
    ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db));
    RETURN_IF_ERROR(CommitCheckpoint(*store, workload.name, workload.contents).status());
    ASSIGN_OR_RETURN(peak, ReadProcMemory());
  } else if (mode == "load") {
    ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db));
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(*store, MakeVersionRef("large", 1)));
    bytes = LoadedBytes(loaded);
    ASSIGN_OR_RETURN(peak, ReadProcMemory());
  } else {
    return absl::InvalidArgumentError("--m1_child must be 'save' or 'load', got '" + mode + "'");
  }
  std::cout << "M1 " << baseline.rss_kib << " " << peak.hwm_kib << " " << bytes << std::endl;
  return absl::OkStatus();
}

absl::Status FigureM1(const BenchOptions& options, const std::string& saved_store, Report& report) {
  for (const std::string mode : {"save", "load"}) {
    std::vector<double> ratios;
    std::string detail;
    for (int run = 0; run < options.runs; ++run) {
      Progress(absl::StrCat("M1 ", mode, " run ", run + 1, "/", options.runs));
      const std::string db =
          mode == "save" ? absl::StrCat(options.work_dir, "/m1-save-", run) : saved_store;
      ASSIGN_OR_RETURN(double ratio, MeasureM1(options, mode, db, detail));
      ratios.push_back(ratio);
      if (mode == "save") fs::remove_all(db);
    }
    FigureRow row{"M1", "large", "peak RSS of " + mode + " / checkpoint bytes"};
    row.ratio = Summarize(ratios);
    row.goal = Goal::kAtMost;
    row.target = 1.1;
    row.detail = detail + " (last run); the target allows a small constant on top";
    report.AddFigure(std::move(row));
  }
  return absl::OkStatus();
}

// Runs in the child. Prints "M2 <baseline KiB> <peak KiB> <largest tensor bytes> <file bytes>".
absl::Status RunM2Child(const std::string& format_name, const std::string& db,
                        const std::string& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db));
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader,
                   store->OpenVersion(MakeVersionRef("export", 1)));
  int64_t largest = 0, version_bytes = 0;
  for (const v1::TensorMeta& meta : reader->manifest().tensors()) {
    largest = std::max(largest, meta.byte_length());
    version_bytes += meta.byte_length();
  }
  ExportOptions options;
  ASSIGN_OR_RETURN(options.format, ParseExportFormat(format_name));
  ResetPeakMemory();
  ASSIGN_OR_RETURN(ProcMemory baseline, ReadProcMemory());
  ASSIGN_OR_RETURN(ExportResult result, ExportToFile(*reader, options, out));
  ASSIGN_OR_RETURN(ProcMemory peak, ReadProcMemory());
  std::error_code error;
  const uintmax_t on_disk = fs::file_size(out, error);
  if (error || on_disk != result.file_bytes ||
      static_cast<int64_t>(result.file_bytes) <= version_bytes) {
    return absl::InternalError(absl::StrCat("the ", format_name, " export wrote ", on_disk,
                                            " bytes (reported ", result.file_bytes,
                                            ") for a version of ", version_bytes, " bytes"));
  }
  std::cout << "M2 " << baseline.rss_kib << " " << peak.hwm_kib << " " << largest << " "
            << result.file_bytes << std::endl;
  return absl::OkStatus();
}

absl::Status FigureM2(const BenchOptions& options, Report& report) {
  const std::string db = options.work_dir + "/store-export";
  int64_t version_bytes = 0;
  {
    ASSIGN_OR_RETURN(Workload workload, MakeExportWorkload(kM2Tensors, options.m2_tensor_bytes));
    Progress(absl::StrFormat("export workload: %d tensors, %.2f GiB", workload.tensors.size(),
                             workload.bytes / kGiB));
    RETURN_IF_ERROR(TimeStoreSave(workload, db).status());
    version_bytes = workload.bytes;
  }  // The workload's memory goes before the children run.
  for (const std::string format : {"torch", "safetensors"}) {
    std::vector<double> ratios;
    std::string detail;
    for (int run = 0; run < options.runs; ++run) {
      Progress(absl::StrCat("M2 ", format, " run ", run + 1, "/", options.runs));
      const std::string out = absl::StrCat(options.work_dir, "/m2-export.", format);
      ASSIGN_OR_RETURN(std::string printed,
                       RunCommand(absl::StrCat(options.self_exe, " --m2_child=", format,
                                               " --m2_db=", db, " --m2_out=", out)));
      fs::remove(out);
      int64_t baseline_kib = 0, peak_kib = 0, largest = 0, file_bytes = 0;
      const size_t at = printed.rfind("M2 ");
      if (at == std::string::npos ||
          std::sscanf(printed.c_str() + at, "M2 %ld %ld %ld %ld", &baseline_kib, &peak_kib,
                      &largest, &file_bytes) != 4 ||
          largest <= 0) {
        return absl::InternalError("the M2 child printed no measurement: " + printed);
      }
      ratios.push_back((peak_kib - baseline_kib) * 1024.0 / largest);
      detail = absl::StrFormat(
          "peak RSS - RSS before the export %.0f MiB; largest tensor %.0f MiB of a %.0f MiB "
          "version (%d tensors); file %.0f MiB",
          (peak_kib - baseline_kib) / 1024.0, largest / double(kMiB), version_bytes / double(kMiB),
          kM2Tensors, file_bytes / double(kMiB));
    }
    FigureRow row{"M2", "export",
                  absl::StrCat("peak RSS growth of a ", format,
                               " export (ExportToFile, fresh child) / largest tensor")};
    row.ratio = Summarize(ratios);
    row.goal = Goal::kAtMost;
    row.target = 2;
    row.detail = detail + " (last run)";
    report.AddFigure(std::move(row));
  }
  fs::remove_all(db);
  return absl::OkStatus();
}

}  // namespace ckpt::bench
