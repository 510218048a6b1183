#include "tools/bench/python_save_figures.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/status/status_macros.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "nlohmann/json.hpp"
#include "tools/bench/run_command.h"
#include "tools/bench/served_store.h"
#include "tools/bench/stats.h"

namespace ckpt::bench {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::vector<double>> Seconds(const nlohmann::json& result, const char* name) {
  if (!result.contains(name) || !result[name].is_array() || result[name].empty()) {
    return absl::InternalError(absl::StrCat("R11: the Python side reported no '", name, "'"));
  }
  return result[name].get<std::vector<double>>();
}

}  // namespace

// The store runs in this process (a StoreService over RocksDB in the run's work directory, the
// same disk torch.save writes to), so both sides share the 2 cores as they would on a training
// host; Python runs in the warm malloc regime (report.h), as the store's side does here.
absl::Status FigureR11(const BenchOptions& options, Report& report) {
  const std::string dir = options.work_dir + "/r11";
  fs::create_directories(dir);
  StoreOptions store_options;
  store_options.db_path = dir + "/store";
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(store_options));
  ASSIGN_OR_RETURN(const ServedStore served, ServeStore(*store));
  const int64_t bytes = options.r11_bytes;
  // The upload must fit between two saves, or save_async waits for it (and counts the wait):
  // 1 GiB took 3-7 s here beside the loop's matrix products on 2 cores.
  const double step_seconds = options.quick ? 0.1 : 1.0;
  const int steps_between_saves = options.quick ? 4 : 10;
  Progress(
      absl::StrFormat("R11: Client.save of %.2f GiB against torch.save + fsync, %d runs; "
                      "then a loop's stall per save_async against torch.save",
                      bytes / kGiB, options.runs));
  ASSIGN_OR_RETURN(
      const std::string output,
      RunCommand(absl::StrCat(
          "PYTHONPATH=", options.python_client_dir, " ", PythonMallocEnvironment(Regime::kWarm),
          " ", options.python, " ", options.r11_script, " 127.0.0.1:", served.port(), " ", dir, " ",
          bytes, " ", options.runs, " ", step_seconds, " ", steps_between_saves)));
  const nlohmann::json result = nlohmann::json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded()) {
    return absl::InternalError("R11: the Python side printed no JSON:\n" + output);
  }
  ASSIGN_OR_RETURN(std::vector<double> torch_save_s, Seconds(result, "torch_save_s"));
  ASSIGN_OR_RETURN(std::vector<double> client_save_s, Seconds(result, "client_save_s"));
  ASSIGN_OR_RETURN(std::vector<double> sync_stall_s, Seconds(result, "sync_stall_s"));
  ASSIGN_OR_RETURN(std::vector<double> async_stall_s, Seconds(result, "async_stall_s"));
  ASSIGN_OR_RETURN(std::vector<double> overlap_stall_s, Seconds(result, "overlap_stall_s"));
  const std::string torch_version = result.value("torch", "?");
  const std::string workload = absl::StrFormat("%.2f GiB, 16 fp32 tensors", bytes / kGiB);

  FigureRow save{"R11", workload, "Python Client.save throughput / torch.save + fsync"};
  save.regime = Regime::kWarm;
  ASSIGN_OR_RETURN(std::vector<double> save_ratios, PairedRatios(torch_save_s, client_save_s));
  save.ratio = Summarize(save_ratios);
  save.target = 0.8;
  save.detail = absl::StrFormat(
      "%.2f vs %.2f GiB/s (medians); every save of new bytes (each tensor changed first), so no "
      "chunk deduplicates; Client.save hashes, asks FindMissingChunks and uploads to a store "
      "service on 127.0.0.1 that stores and syncs; torch %s",
      GiBps(bytes, client_save_s), GiBps(bytes, torch_save_s), torch_version);
  report.AddFigure(std::move(save));

  FigureRow stall{"R11 stall", workload,
                  "loop blocked per save_async(overlap_snapshot) / per torch.save in the loop"};
  stall.regime = Regime::kWarm;
  stall.goal = Goal::kAtMost;
  ASSIGN_OR_RETURN(std::vector<double> stall_ratios, PairedRatios(overlap_stall_s, sync_stall_s));
  ASSIGN_OR_RETURN(std::vector<double> in_call_ratios, PairedRatios(async_stall_s, sync_stall_s));
  stall.ratio = Summarize(stall_ratios);
  stall.target = 0.05;
  stall.detail = absl::StrFormat(
      "stall %.3f s vs %.3f s (medians): the call, then wait_snapshot() after the next step "
      "(the copy ran beside it); a save every %d steps of %.1f s of matrix products. With the "
      "copy in the call (save_async's default): %.3f s, ratio %.3f. Copies go into the host "
      "buffers of the previous snapshot; the first call (allocating them) took %.3f s",
      Median(overlap_stall_s), Median(sync_stall_s), steps_between_saves, step_seconds,
      Median(async_stall_s), Median(in_call_ratios), result.value("async_first_s", 0.0));
  report.AddFigure(std::move(stall));

  report.AddTiming("Python Client.save (store service on 127.0.0.1)", workload, bytes, 16,
                   client_save_s, Regime::kWarm);
  report.AddTiming("Python torch.save + fsync (torch " + torch_version + ")", workload, bytes, 16,
                   torch_save_s, Regime::kWarm);
  fs::remove_all(dir);
  return absl::OkStatus();
}

}  // namespace ckpt::bench
