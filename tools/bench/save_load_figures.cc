#include "tools/bench/save_load_figures.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/mm.h"
#include "ATen/ops/randn.h"
#include "ATen/ops/zeros.h"
#include "ATen/ops/zeros_like.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/format/torch_writer.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/async_checkpointer.h"
#include "nlohmann/json.hpp"
#include "tools/bench/measurements.h"
#include "tools/bench/run_command.h"
#include "tools/bench/stats.h"
#include "torch/serialize.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// ---- Baselines in other processes / libraries.

struct PythonTimes {
  std::vector<double> save_s;
  std::vector<double> warm_load_s, warm_load_faults_per_mib;
  std::vector<double> cold_load_s, cold_load_faults_per_mib;
  std::string torch_version;
};

// Python's torch.save / torch.load of the same tensors: written once to a .pt by libs/format's
// torch writer (untimed), loaded by Python, then saved `runs` times and loaded `runs` times in
// the warm regime, timed inside Python (tools/bench/torch_baseline.py); then a second Python
// process loads Python's own file `runs` times in the cold regime.
absl::StatusOr<PythonTimes> TimePython(const BenchOptions& options, const Workload& workload) {
  const std::string input = options.work_dir + "/" + workload.name + "-input.pt";
  const std::string output = options.work_dir + "/" + workload.name + "-python.pt";
  RETURN_IF_ERROR(WriteTorchFile(input, workload.python_root).status());
  PythonTimes times;
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    const bool save = regime == Regime::kWarm;
    ASSIGN_OR_RETURN(
        std::string printed,
        RunCommand(absl::StrCat(PythonMallocEnvironment(regime), " ", options.python, " ",
                                options.python_script, " ", input, " ", output, " ", options.runs,
                                " ", RegimeName(regime), save ? " save" : " nosave")));
    const size_t line_start = printed.find_last_of('\n', printed.size() - 2);
    const std::string last_line =
        line_start == std::string::npos ? printed : printed.substr(line_start + 1);
    nlohmann::json json = nlohmann::json::parse(last_line, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.contains("save_s") || !json.contains("load_minflt")) {
      return absl::InternalError("the Python baseline printed no JSON: " + printed);
    }
    if (json["loaded_bytes"].get<int64_t>() != workload.bytes) {
      return absl::InternalError(absl::StrCat("Python loaded ", json["loaded_bytes"].get<int64_t>(),
                                              " tensor bytes, expected ", workload.bytes));
    }
    std::vector<double> faults_per_mib;
    for (const int64_t faults : json["load_minflt"].get<std::vector<int64_t>>()) {
      faults_per_mib.push_back(static_cast<double>(faults) * kMiB / workload.bytes);
    }
    if (save) {
      times.save_s = json["save_s"].get<std::vector<double>>();
      times.warm_load_s = json["load_s"].get<std::vector<double>>();
      times.warm_load_faults_per_mib = std::move(faults_per_mib);
    } else {
      times.cold_load_s = json["load_s"].get<std::vector<double>>();
      times.cold_load_faults_per_mib = std::move(faults_per_mib);
    }
    times.torch_version = json["torch_version"].get<std::string>();
  }
  fs::remove(input);
  fs::remove(output);
  return times;
}

// LibTorch's own torch::save / torch::load of the tensors (as a tensor list; the C++ API has no
// dict of nested optimizer state), plus an fsync of the file for the store's durability.
absl::StatusOr<std::pair<double, double>> TimeLibTorch(const Workload& workload,
                                                       const std::string& path) {
  double save_s = 0;
  double load_s = 0;
  RETURN_IF_ERROR(CatchTorchErrors([&] {
    Clock::time_point start = Clock::now();
    torch::save(workload.tensors, path);
    save_s = SecondsSince(start);
  }));
  Clock::time_point start = Clock::now();
  RETURN_IF_ERROR(FsyncPath(path, O_RDONLY));
  save_s += SecondsSince(start);
  std::vector<at::Tensor> loaded;
  RETURN_IF_ERROR(CatchTorchErrors([&] {
    Clock::time_point load_start = Clock::now();
    torch::load(loaded, path);
    load_s = SecondsSince(load_start);
  }));
  fs::remove(path);
  if (loaded.size() != workload.tensors.size()) {
    return absl::InternalError(absl::StrCat("torch::load gave ", loaded.size(), " tensors, saved ",
                                            workload.tensors.size()));
  }
  return std::make_pair(save_s, load_s);
}

}  // namespace

absl::StatusOr<SaveLoadTimes> MeasureSaveLoad(const BenchOptions& options, const Workload& workload,
                                              Report& report) {
  SaveLoadTimes times;
  for (int run = 0; run < options.runs; ++run) {
    Progress(absl::StrCat(workload.name, ": save run ", run + 1, "/", options.runs));
    ASSIGN_OR_RETURN(double raw, TimeRawWriteFsync(workload, options.work_dir + "/raw.bin"));
    times.raw_s.push_back(raw);
    const std::string db = absl::StrCat(options.work_dir, "/store-", workload.name, "-", run);
    double cpu = ProcessCpuSeconds();
    double machine = MachineBusySeconds();
    ASSIGN_OR_RETURN(double save, TimeStoreSave(workload, db));
    times.store_save_s.push_back(save);
    times.save_cpu_s.push_back(ProcessCpuSeconds() - cpu);
    times.save_machine_s.push_back(MachineBusySeconds() - machine);
    if (!times.kept_store.empty()) fs::remove_all(times.kept_store);
    times.kept_store = db;
    {
      const std::string unhashed = db + "-unhashed";
      StoreKnobs knobs;
      knobs.skip_hashing = true;
      cpu = ProcessCpuSeconds();
      machine = MachineBusySeconds();
      ASSIGN_OR_RETURN(double unhashed_save, TimeStoreSave(workload, unhashed, knobs));
      times.unhashed_save_s.push_back(unhashed_save);
      times.unhashed_cpu_s.push_back(ProcessCpuSeconds() - cpu);
      times.unhashed_machine_s.push_back(MachineBusySeconds() - machine);
      fs::remove_all(unhashed);
    }
    times.hash_s.push_back(TimeStoreHashing(workload));
    ASSIGN_OR_RETURN(double copy, TimeMemcpy(workload));
    times.memcpy_s.push_back(copy);
    ASSIGN_OR_RETURN(auto libtorch, TimeLibTorch(workload, options.work_dir + "/libtorch.pt"));
    times.libtorch_save_s.push_back(libtorch.first);
    times.libtorch_load_s.push_back(libtorch.second);
  }
  Progress(workload.name + ": Python torch.save / torch.load (warm, then cold)");
  ASSIGN_OR_RETURN(PythonTimes python, TimePython(options, workload));
  times.python_save_s = python.save_s;
  times.warm.python_s = python.warm_load_s;
  times.warm.python_faults = python.warm_load_faults_per_mib;
  times.cold.python_s = python.cold_load_s;
  times.cold.python_faults = python.cold_load_faults_per_mib;
  // One store open at a time (RocksDB locks its directory): the mapped loads, then the copied.
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    RegimeLoads& loads = regime == Regime::kWarm ? times.warm : times.cold;
    ScopedMallocRegime malloc_regime(regime);
    for (const bool map_on_load : {true, false}) {
      StoreKnobs knobs;
      knobs.map_on_load = map_on_load;
      ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                       OpenStore(times.kept_store, knobs));
      if (regime == Regime::kWarm) {  // faults the heap in, as Python's untimed first load does.
        RETURN_IF_ERROR(TimeStoreLoad(*store, workload, /*compare=*/true).status());
      }
      for (int run = 0; run < options.runs; ++run) {
        Progress(absl::StrCat(workload.name, ": local load, ", map_on_load ? "mapped" : "copied",
                              ", ", RegimeName(regime), ", run ", run + 1, "/", options.runs));
        RETURN_IF_ERROR(
            TimeWithFaults([&] { return TimeStoreLoad(*store, workload, /*compare=*/run == 0); },
                           workload.bytes, map_on_load ? loads.store_s : loads.copied_s,
                           map_on_load ? loads.store_faults : loads.copied_faults));
      }
    }
  }
  report.AddTiming("raw write + fsync", workload, times.raw_s);
  report.AddTiming("store save (CommitCheckpoint, synced)", workload, times.store_save_s);
  report.AddTiming("store save without hashing (StoreBenchmarkSeams)", workload,
                   times.unhashed_save_s);
  report.AddTiming("SHA-256 + xxh3 per chunk, one thread, alone", workload, times.hash_s);
  report.AddTiming("memcpy (destination already faulted in)", workload, times.memcpy_s);
  report.AddTiming("LibTorch torch::save + fsync", workload, times.libtorch_save_s);
  report.AddTiming("LibTorch torch::load", workload, times.libtorch_load_s);
  report.AddTiming("Python torch.save + fsync (torch " + python.torch_version + ")", workload,
                   times.python_save_s);
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    const RegimeLoads& loads = regime == Regime::kWarm ? times.warm : times.cold;
    report.AddTiming("Python torch.load", workload, loads.python_s, regime);
    report.AddTiming("store local load (LoadCheckpoint; tensors >= 1 MiB mapped)", workload,
                     loads.store_s, regime);
    report.AddTiming("store local load, every tensor copied (map_tensors_on_load=false)", workload,
                     loads.copied_s, regime);
  }
  return times;
}

absl::Status FigureR1(const Workload& workload, const SaveLoadTimes& times, Report& report) {
  FigureRow row{"R1", workload.name, "store save / raw write+fsync (throughput)"};
  ASSIGN_OR_RETURN(row.ratio, ThroughputRatio(times.store_save_s, times.raw_s));
  row.target = 0.8;
  row.detail = absl::StrFormat("%.2f vs %.2f GiB/s", GiBps(workload.bytes, times.store_save_s),
                               GiBps(workload.bytes, times.raw_s));
  report.AddFigure(std::move(row));
  return absl::OkStatus();
}

absl::Status FigureR2(const Workload& workload, const SaveLoadTimes& times, Report& report) {
  FigureRow row{"R2", workload.name, "store save / Python torch.save+fsync (throughput)"};
  ASSIGN_OR_RETURN(row.ratio, ThroughputRatio(times.store_save_s, times.python_save_s));
  row.target = 2;
  row.detail = absl::StrFormat("%.2f vs %.2f GiB/s; LibTorch torch::save %.2f GiB/s",
                               GiBps(workload.bytes, times.store_save_s),
                               GiBps(workload.bytes, times.python_save_s),
                               GiBps(workload.bytes, times.libtorch_save_s));
  report.AddFigure(std::move(row));
  return absl::OkStatus();
}

// Our load (tensors of 1 MiB or more mapped from the pack file, smaller ones read into new
// tensors) against torch.load, both in the same regime; the detail gives the load that copies
// every tensor in that regime too, and the minor faults per MiB of each side.
absl::Status FigureR3(const Workload& workload, const SaveLoadTimes& times, Report& report) {
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    const RegimeLoads& loads = regime == Regime::kWarm ? times.warm : times.cold;
    FigureRow row{"R3", workload.name, "local load / Python torch.load (throughput)"};
    row.regime = regime;
    ASSIGN_OR_RETURN(row.ratio, ThroughputRatio(loads.store_s, loads.python_s));
    row.target = 2;
    row.detail = absl::StrFormat(
        "%.2f vs %.2f GiB/s; every tensor copied %.2f GiB/s (%.3f of Python); faults/MiB %.0f, "
        "copied %.0f, Python %.0f; LibTorch torch::load %.2f GiB/s (regime not set)",
        GiBps(workload.bytes, loads.store_s), GiBps(workload.bytes, loads.python_s),
        GiBps(workload.bytes, loads.copied_s),
        GiBps(workload.bytes, loads.copied_s) / GiBps(workload.bytes, loads.python_s),
        Median(loads.store_faults), Median(loads.copied_faults), Median(loads.python_faults),
        GiBps(workload.bytes, times.libtorch_load_s));
    report.AddFigure(std::move(row));
  }
  return absl::OkStatus();
}

// The save without hashing is the same store code opened through
// StoreBenchmarkSeams::OpenWithoutHashing (serial chunk addresses, no xxh3), run after each save on
// a fresh store: what SHA-256 and xxh3 add to a save once the store overlaps them with its writes.
absl::Status FigureR6(const Workload& workload, const SaveLoadTimes& times, Report& report) {
  FigureRow row{"R6", workload.name, "save / save without hashing (time)"};
  ASSIGN_OR_RETURN(std::vector<double> ratios,
                   PairedRatios(times.store_save_s, times.unhashed_save_s));
  row.ratio = Summarize(ratios);
  row.goal = Goal::kAtMost;
  row.target = 1.05;
  row.detail = absl::StrFormat(
      "%.2f vs %.2f GiB/s; hashing alone on one thread %.2f GiB/s (%.2f s); CPU s (process / "
      "machine of %d cores) in save %.2f / %.2f over %.2f s, without hashing %.2f / %.2f over "
      "%.2f s (medians)",
      GiBps(workload.bytes, times.store_save_s), GiBps(workload.bytes, times.unhashed_save_s),
      GiBps(workload.bytes, times.hash_s), Median(times.hash_s),
      static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)), Median(times.save_cpu_s),
      Median(times.save_machine_s), Median(times.store_save_s), Median(times.unhashed_cpu_s),
      Median(times.unhashed_machine_s), Median(times.unhashed_save_s));
  report.AddFigure(std::move(row));
  return absl::OkStatus();
}

// The trainer's stall per asynchronous checkpoint against the synchronous save of the same
// checkpoint (R1's store save runs, paired), on the trainer's path (libs/train/trainer.cc):
// SubmitOverlapped copies the parameters and optimizer state on the upload thread while the next
// step's forward and backward passes run, and the guard before the optimizer step waits for what
// is left. The stall is what blocks the training thread: SubmitOverlapped plus that guard's wait.
// The forward and backward passes are those of the workload's 2-D weights as linear layers on a
// batch of 32 (three matrix products per layer, gradients written into memory of their own), on
// the training thread; the detail gives their time alone and beside the checkpoint's background
// copy and upload (hashing, commit), which compete with them for cores and memory bandwidth (a
// slowdown the stall does not count; the upload ran beside training before the copy did too). The
// optimizer step negates every tensor in place (exact, so the workload comes back unchanged), and
// the last version is compared with the values at its submission. The previous upload is over by
// the next checkpoint (Wait() stands in for the steps between them), so the figure is the steady
// state; the first checkpoint, which also allocates the host buffers, is reported as its own
// timing.
absl::Status FigureR7(const BenchOptions& options, const Workload& workload,
                      const SaveLoadTimes& times, Report& report) {
  constexpr int64_t kBatch = 32;
  struct Layer {
    at::Tensor weight, input, output, output_grad, input_grad, weight_grad;
  };
  std::vector<Layer> layers;
  for (const StateDict::Entry& entry : workload.contents.model) {
    if (entry.tensor.dim() != 2) continue;
    const at::Tensor& weight = entry.tensor;
    Layer layer{weight,
                at::randn({kBatch, weight.size(1)}),
                at::zeros({kBatch, weight.size(0)}),
                at::randn({kBatch, weight.size(0)}),
                at::zeros({kBatch, weight.size(1)}),
                at::zeros_like(weight)};  // faulted in, as a trainer's .grad is after one step.
    layers.push_back(std::move(layer));
  }
  const auto forward_backward = [&] {
    at::NoGradGuard no_grad;
    for (Layer& layer : layers) {
      at::mm_out(layer.output, layer.input, layer.weight.t());
      at::mm_out(layer.input_grad, layer.output_grad, layer.weight);
      at::mm_out(layer.weight_grad, layer.output_grad.t(), layer.input);
    }
  };
  const auto optimizer_step = [&] {
    at::NoGradGuard no_grad;
    for (const at::Tensor& tensor : workload.tensors) tensor.neg_();
  };
  std::vector<double> first_s, stall_s, guard_s, beside_s, alone_s;
  const std::string db = absl::StrCat(options.work_dir, "/async");
  absl::Status measured = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db));
    train::AsyncCheckpointer checkpointer(store.get(), workload.name);
    for (int run = 0; run <= options.runs; ++run) {
      Progress(absl::StrCat(workload.name, ": async checkpoint ", run + 1, "/", options.runs + 1));
      Clock::time_point start = Clock::now();
      RETURN_IF_ERROR(
          checkpointer.SubmitOverlapped(workload.contents, CommitOptions(), workload.tensors));
      const double submit = SecondsSince(start);
      start = Clock::now();
      forward_backward();
      beside_s.push_back(SecondsSince(start));
      start = Clock::now();
      checkpointer.BeforeOptimizerStep();
      const double guard = SecondsSince(start);
      optimizer_step();
      (run == 0 ? first_s : stall_s).push_back(submit + guard);
      if (run > 0) guard_s.push_back(guard);
      ASSIGN_OR_RETURN(std::optional<CommitResult> committed, checkpointer.Wait());
      if (!committed.has_value() || committed->logical_bytes != workload.bytes) {
        return absl::InternalError("the asynchronous checkpoint did not commit every byte");
      }
      start = Clock::now();
      forward_backward();
      alone_s.push_back(SecondsSince(start));
    }
    // The last version holds the values at its submission: the negation of today's.
    ASSIGN_OR_RETURN(LoadedCheckpoint last,
                     LoadCheckpoint(*store, MakeVersionRef(workload.name, options.runs + 1)));
    for (const StateDict::Entry& entry : workload.contents.model) {
      const at::Tensor* stored = last.contents.model.Find(entry.key);
      if (stored == nullptr || !at::equal(stored->neg(), entry.tensor)) {
        return absl::InternalError(absl::StrCat("the overlapped checkpoint did not store ",
                                                entry.key, " as it was at submission"));
      }
    }
    return absl::OkStatus();
  }();
  if ((options.runs + 1) % 2 == 1) optimizer_step();  // back to the workload's own values.
  fs::remove_all(db);
  RETURN_IF_ERROR(measured);
  report.AddTiming("trainer stall, first overlapped checkpoint (allocates)", workload, first_s,
                   Regime::kCold);
  report.AddTiming("trainer stall, later overlapped checkpoints (submit + pre-step guard)",
                   workload, stall_s, Regime::kWarm);
  // Warm: the checkpointer's host buffers exist from the previous checkpoint; cold: the first
  // checkpoint, which allocates them (one run). The synchronous save reads the same tensors in
  // both and writes fresh pack files, so it is its own baseline in both rows.
  const std::vector<double> first_save(times.store_save_s.begin(),
                                       times.store_save_s.begin() + first_s.size());
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    const bool warm = regime == Regime::kWarm;
    FigureRow row{"R7", workload.name, "stall per async checkpoint / synchronous save (time)"};
    row.regime = regime;
    ASSIGN_OR_RETURN(std::vector<double> ratios, warm ? PairedRatios(stall_s, times.store_save_s)
                                                      : PairedRatios(first_s, first_save));
    row.ratio = Summarize(ratios);
    row.goal = Goal::kAtMost;
    row.target = 0.01;
    row.detail =
        warm ? absl::StrFormat(
                   "stall %.4f s (guard %.4f s) vs save %.3f s (medians); forward+backward "
                   "(%d layers, batch %d) %.3f s alone, %.3f s beside the checkpoint's copy and "
                   "upload",
                   Median(stall_s), Median(guard_s), Median(times.store_save_s), layers.size(),
                   kBatch, Median(alone_s), Median(beside_s))
             : absl::StrFormat(
                   "first checkpoint's stall %.3f s (allocates its host buffers) vs "
                   "save %.3f s (first run)",
                   Median(first_s), Median(first_save));
    report.AddFigure(std::move(row));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::bench
