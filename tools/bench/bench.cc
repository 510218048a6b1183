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
// Progress goes to stderr, the tables to stdout (paste into BENCHMARKS.md). --quick uses small
// sizes so it finishes in well under two minutes; CI runs it as a smoke test of the code paths
// and asserts nothing about time. The exit status is non-zero only when a measurement fails
// (an error from the store, a wrong byte count after a round trip), never for a missed target.
//
// Each figure is one function (FigureR1 ... FigureR7, FigureM1, FigureM2 below; the training
// figures R8 and R9 in training_figures.cc, D1 and D1 scoped in dedup_figures.cc, R11 (Python
// saves) in python_save_figures.cc);
// --figures=R5,R8 measures only those (and
// what they need). report.h has the options, the report and the memory regimes they share.
//
// Memory regimes: a ratio whose sides put bytes into memory is printed twice, once *warm* (the
// destination memory was faulted in before the timed run, on both sides) and once *cold* (fresh
// memory on both sides, faulted in during the timed run). This VM faults fresh memory in at
// 0.1-0.3 GiB/s and copies into faulted-in memory at 5-20 GiB/s, so a ratio whose two sides ran
// in different regimes measured the regimes, not the code. Each row's detail gives the minor page
// faults per MiB that each side took (256 per MiB: every 4 KiB page fresh; about 0: none), so
// the regime a row claims can be checked. Ratios where no side allocates (saves, DDP, counting)
// have one row, regime n/a.

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/client/remote_loader.h"
#include "libs/ddp/distributed_data_parallel.h"
#include "libs/ddp/local_launcher.h"
#include "libs/ddp/process_group.h"
#include "libs/format/torch_writer.h"
#include "libs/loader/export.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/benchmark_seams.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/train/async_checkpointer.h"
#include "nlohmann/json.hpp"
#include "services/checkpoint_store/store_service.h"
#include "services/loader/loader_service.h"
#include "tools/bench/dedup_figures.h"
#include "tools/bench/grpc_baseline.h"
#include "tools/bench/python_save_figures.h"
#include "tools/bench/report.h"
#include "tools/bench/run_command.h"
#include "tools/bench/shm_workload.h"
#include "tools/bench/stats.h"
#include "tools/bench/training_figures.h"
#include "tools/bench/workloads.h"
#include "torch/serialize.h"

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
ABSL_FLAG(double, r8_bucket_cap_mib, 25,
          "R8: DataParallelOptions::bucket_cap_bytes in MiB (PyTorch's default: 25).");

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// Ratio of throughputs = inverse ratio of times, run by run.
absl::StatusOr<Summary> ThroughputRatio(const std::vector<double>& operation_s,
                                        const std::vector<double>& baseline_s) {
  ASSIGN_OR_RETURN(std::vector<double> ratios, PairedRatios(baseline_s, operation_s));
  return Summarize(ratios);
}

// CPU seconds (user + system) this process has used, all threads.
double ProcessCpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// CPU seconds every core of the machine has spent busy (not idle, not waiting for I/O), from
// /proc/stat: includes the kernel's writeback and other processes.
double MachineBusySeconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return static_cast<double>(user + nice + system + irq + softirq + steal) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

int64_t MinorFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Times `operation` (which returns its own seconds) and appends them to `seconds`, and the minor
// page faults the process took during it, per MiB of `bytes`, to `faults_per_mib`.
absl::Status TimeWithFaults(const std::function<absl::StatusOr<double>()>& operation, int64_t bytes,
                            std::vector<double>& seconds, std::vector<double>& faults_per_mib) {
  const int64_t before = MinorFaults();
  ASSIGN_OR_RETURN(double taken, operation());
  faults_per_mib.push_back(static_cast<double>(MinorFaults() - before) * kMiB /
                           static_cast<double>(std::max<int64_t>(bytes, 1)));
  seconds.push_back(taken);
  return absl::OkStatus();
}

// ---- Measurements shared by several figures.

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write " + path);
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoError("fsync " + path);
}

// Writes every tensor's bytes to a new file and fsyncs it and its directory: the least any
// durable save of these bytes to this filesystem must do.
absl::StatusOr<double> TimeRawWriteFsync(const Workload& workload, const std::string& path) {
  const Clock::time_point start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + path);
  for (const at::Tensor& tensor : workload.tensors) {
    absl::Status written =
        WriteAll(fd, static_cast<const char*>(tensor.data_ptr()), tensor.nbytes(), path);
    if (!written.ok()) {
      ::close(fd);
      return written;
    }
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return ErrnoError("fsync " + path);
  }
  ::close(fd);
  RETURN_IF_ERROR(FsyncPath(fs::path(path).parent_path().string(), O_RDONLY | O_DIRECTORY));
  const double seconds = SecondsSince(start);
  fs::remove(path);
  return seconds;
}

// Copies every tensor's bytes into destination memory allocated beforehand: the memory-bandwidth
// ceiling of moving these bytes, with no I/O, checks or framing. `prefault`: the destination is
// written once before the timed copy (warm); else it is left untouched, so the copy faults it in
// (cold, when allocated in the cold malloc regime).
absl::StatusOr<double> TimeMemcpy(const Workload& workload, bool prefault = true) {
  std::vector<at::Tensor> copies;
  copies.reserve(workload.tensors.size());
  for (const at::Tensor& tensor : workload.tensors) {
    ASSIGN_OR_RETURN(at::Tensor copy,
                     CatchTorchErrors([&] { return at::empty(tensor.sizes(), tensor.options()); }));
    if (prefault) std::memset(copy.data_ptr(), 0, copy.nbytes());
    copies.push_back(std::move(copy));
  }
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < copies.size(); ++i) {
    std::memcpy(copies[i].data_ptr(), workload.tensors[i].data_ptr(), copies[i].nbytes());
  }
  return SecondsSince(start);
}

// SHA-256 and xxh3 exactly as the store computes them on upload: a SHA-256 of each 4 MiB chunk
// (its address) and an xxh3 of it (its read checksum); the tensor's content_hash is a SHA-256 of
// the chunk digests (ContentHasher) -- see RocksDbUploadSession::StoreChunks. Single-threaded:
// the CPU cost, which the store overlaps with its writes.
double TimeStoreHashing(const Workload& workload) {
  uint64_t sink = 0;
  const Clock::time_point start = Clock::now();
  for (const at::Tensor& tensor : workload.tensors) {
    const absl::string_view bytes(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
    ContentHasher whole;
    for (size_t offset = 0; offset < bytes.size(); offset += kChunkBytes) {
      const ChunkDigest digest = HashChunk(bytes.substr(offset, kChunkBytes));
      sink += digest.xxh3_64;
      whole.AddChunk(digest);
    }
    sink += static_cast<unsigned char>(whole.Finish()[0]);
  }
  const double seconds = SecondsSince(start);
  if (sink == 1) std::cerr << "";  // keeps the digests observable.
  return seconds;
}

struct StoreKnobs {
  bool skip_hashing = false;  // StoreBenchmarkSeams::OpenWithoutHashing (R6's baseline).
  bool map_on_load = true;    // StoreOptions::map_tensors_on_load.
};

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> OpenStore(const std::string& path,
                                                                  StoreKnobs knobs = {}) {
  StoreOptions options;
  options.db_path = path;
  options.map_tensors_on_load = knobs.map_on_load;
  if (knobs.skip_hashing) return StoreBenchmarkSeams::OpenWithoutHashing(options);
  return RocksDbCheckpointStore::Open(options);
}

// Commits `workload` to a new store at `db_path` (so nothing deduplicates against a previous
// run) with the default, synced commit. Returns the seconds of CommitCheckpoint alone.
absl::StatusOr<double> TimeStoreSave(const Workload& workload, const std::string& db_path,
                                     StoreKnobs knobs = {}) {
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db_path, knobs));
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(CommitResult committed,
                   store->CommitCheckpoint(workload.name, workload.contents));
  const double seconds = SecondsSince(start);
  if (committed.logical_bytes != workload.bytes) {
    return absl::InternalError(absl::StrCat("the store reports ", committed.logical_bytes,
                                            " logical bytes for ", workload.name, ", expected ",
                                            workload.bytes));
  }
  return seconds;
}

int64_t LoadedBytes(const LoadedCheckpoint& loaded) {
  int64_t bytes = 0;
  for (const StateDict::Entry& entry : loaded.contents.model) bytes += entry.tensor.nbytes();
  if (loaded.contents.optimizer.has_value()) {
    loaded.contents.optimizer->ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { bytes += tensor.nbytes(); });
  }
  return bytes;
}

// Loads the workload's version from `store` (local or remote): every byte is streamed into a
// fresh tensor and its chunk checksum verified. The first run also compares every model tensor
// with the original, so a fast wrong answer cannot pass for a figure.
absl::StatusOr<double> TimeStoreLoad(CheckpointStore& store, const Workload& workload,
                                     bool compare) {
  const v1::VersionRef ref = MakeVersionRef(workload.name, 1);
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(LoadedCheckpoint loaded, store.LoadCheckpoint(ref));
  const double seconds = SecondsSince(start);
  if (LoadedBytes(loaded) != workload.bytes) {
    return absl::InternalError(absl::StrCat("loaded ", LoadedBytes(loaded), " bytes of ",
                                            workload.name, ", saved ", workload.bytes));
  }
  if (compare) {
    for (const StateDict::Entry& entry : workload.contents.model) {
      const at::Tensor* got = loaded.contents.model.Find(entry.key);
      if (got == nullptr || !at::equal(*got, entry.tensor)) {
        return absl::InternalError(absl::StrCat(entry.key, ": loaded tensor differs from saved"));
      }
    }
  }
  return seconds;
}

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

// ---- The figures.

// Loads of one regime: seconds and minor page faults per MiB of each timed run.
struct RegimeLoads {
  std::vector<double> store_s, store_faults;    // LoadCheckpoint (tensors >= 1 MiB mapped)
  std::vector<double> copied_s, copied_faults;  // map_tensors_on_load=false
  std::vector<double> python_s, python_faults;  // torch.load
};

struct SaveLoadTimes {
  std::vector<double> raw_s, store_save_s, unhashed_save_s, python_save_s, hash_s, memcpy_s,
      libtorch_save_s, libtorch_load_s;
  // CPU seconds during each save and unhashed save: this process's, and the machine's.
  std::vector<double> save_cpu_s, save_machine_s, unhashed_cpu_s, unhashed_machine_s;
  RegimeLoads warm, cold;
  std::string kept_store;  // the last save run's store, holding WORKLOAD@1.
};

// Everything R1, R2, R3, R6 need for one workload, measured in interleaved runs.
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

// Downloads every tensor of the workload's version through one RemoteVersionReader (one Download
// stream) straight into `destinations` (one per model tensor, then state tensor; allocated and
// faulted in beforehand, as a server refreshing its weights in place has them).
absl::StatusOr<double> TimeDownloadInto(CheckpointStore& store, const Workload& workload,
                                        std::vector<at::Tensor>& destinations, bool compare) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader,
                   store.OpenVersion(MakeVersionRef(workload.name, 1)));
  const v1::Manifest& manifest = reader->manifest();
  const int count = manifest.tensors_size() + manifest.state_tensors_size();
  if (destinations.empty()) {
    for (int i = 0; i < count; ++i) {
      const v1::TensorMeta& meta = i < manifest.tensors_size()
                                       ? manifest.tensors(i)
                                       : manifest.state_tensors(i - manifest.tensors_size());
      at::Tensor destination = at::empty({meta.byte_length()}, at::kByte);
      std::memset(destination.data_ptr(), 0, destination.nbytes());
      destinations.push_back(std::move(destination));
    }
    return TimeDownloadInto(store, workload, destinations, compare);
  }
  int64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    const v1::TensorMeta& meta = i < manifest.tensors_size()
                                     ? manifest.tensors(i)
                                     : manifest.state_tensors(i - manifest.tensors_size());
    RETURN_IF_ERROR(reader->ReadTensorInto(meta, static_cast<char*>(destinations[i].data_ptr())));
    bytes += meta.byte_length();
  }
  const double seconds = SecondsSince(start);
  if (bytes != workload.bytes) {
    return absl::InternalError(absl::StrCat("downloaded ", bytes, " bytes of ", workload.name,
                                            ", saved ", workload.bytes));
  }
  if (compare) {
    for (int i = 0; i < manifest.tensors_size(); ++i) {
      const at::Tensor* saved = workload.contents.model.Find(manifest.tensors(i).original_key());
      if (saved == nullptr ||
          std::memcmp(saved->data_ptr(), destinations[i].data_ptr(), saved->nbytes()) != 0) {
        return absl::InternalError(
            absl::StrCat(manifest.tensors(i).key(), ": downloaded bytes differ from saved"));
      }
    }
  }
  return seconds;
}

// One byte tensor per tensor of `workload`, of its size, allocated and never touched: a cold
// destination for the baselines.
absl::StatusOr<std::vector<at::Tensor>> FreshByteTensors(const Workload& workload) {
  std::vector<at::Tensor> fresh;
  for (const at::Tensor& tensor : workload.tensors) {
    ASSIGN_OR_RETURN(at::Tensor destination, CatchTorchErrors([&] {
                       return at::empty({static_cast<int64_t>(tensor.nbytes())}, at::kByte);
                     }));
    fresh.push_back(std::move(destination));
  }
  return fresh;
}

// One Download stream from an in-process StoreService on 127.0.0.1 (the same store as R3), in
// both regimes, against two baselines of the same bytes in the same regime: memcpy (R4: the
// memory-bandwidth ceiling) and one loopback TCP stream without gRPC (R4': what the network
// path itself allows here). Warm: the download reads into client memory faulted in beforehand
// (RemoteVersionReader::ReadTensorInto, as a server refreshing its weights in place), and the
// baselines copy / recv into that same memory. Cold: the download allocates fresh tensors
// (RemoteCheckpointStore::LoadCheckpoint) and the baselines copy / recv into fresh allocations
// nobody touched, all in the cold malloc regime. A third row, R4g, is a reference with no target:
// gRPC alone (grpc_baseline.h, the same bytes with no store and no checksum) against the same TCP
// runs: less work than the Download, so what any one-stream gRPC path can expect here.
absl::Status FigureR4(const BenchOptions& options, const Workload& workload,
                      const SaveLoadTimes& times, Report& report) {
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(times.kept_store));
  ASSIGN_OR_RETURN(std::unique_ptr<StoreService> service,
                   StoreService::Create(store.get(), StoreServiceOptions()));
  ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,
                   GrpcServer::Start(GrpcServerOptions(),
                                     {{service.get(), v1::CheckpointStore::service_full_name()}}));
  struct Side {
    std::vector<double> download_s, download_faults, tcp_s, tcp_faults, memcpy_s, memcpy_faults;
    // gRPC alone (grpc_baseline.h): the same bytes in one gRPC stream without the store.
    std::vector<double> grpc_s, grpc_faults;
    // Process CPU seconds (all threads: the server's, gRPC's, the client's; TCP's sender thread
    // and receiver) per run: what the two paths cost, which the machine's load does not change
    // as much as their wall times.
    std::vector<double> download_cpu_s, tcp_cpu_s, grpc_cpu_s;
  };
  Side warm, cold;
  // `timed` (one TimeWithFaults call) with the process's CPU seconds during it appended to `cpu`.
  const auto with_cpu = [](std::vector<double>& cpu, const std::function<absl::Status()>& timed) {
    const double before = ProcessCpuSeconds();
    absl::Status status = timed();
    cpu.push_back(ProcessCpuSeconds() - before);
    return status;
  };
  absl::Status measured = [&]() -> absl::Status {
    RemoteStoreOptions remote_options;
    remote_options.address = server->address();
    ASSIGN_OR_RETURN(std::unique_ptr<RemoteCheckpointStore> remote,
                     RemoteCheckpointStore::Connect(remote_options));
    ASSIGN_OR_RETURN(std::unique_ptr<GrpcBaseline> grpc_alone, GrpcBaseline::Start());
    // The warm runs first, then the cold ones: leaving the cold regime returns free heap pages
    // to the kernel (malloc_trim), which would make gRPC's own receive buffers fresh memory in a
    // warm run that followed it (perf: recvmsg into them took 28% of all page faults so).
    {
      ScopedMallocRegime warm_malloc(Regime::kWarm);
      // Allocated and written by an untimed first download, which also warms gRPC's buffers.
      std::vector<at::Tensor> destinations;
      RETURN_IF_ERROR(TimeDownloadInto(*remote, workload, destinations, /*compare=*/true).status());
      RETURN_IF_ERROR(grpc_alone->TimeStream(workload, destinations, /*prefault=*/false)
                          .status());  // its buffers too.
      for (int run = 0; run < options.runs; ++run) {
        Progress(absl::StrCat(workload.name, ": gRPC download and TCP, warm, run ", run + 1, "/",
                              options.runs));
        RETURN_IF_ERROR(with_cpu(warm.download_cpu_s, [&] {
          return TimeWithFaults(
              [&] {
                return TimeDownloadInto(*remote, workload, destinations, /*compare=*/run == 0);
              },
              workload.bytes, warm.download_s, warm.download_faults);
        }));
        RETURN_IF_ERROR(with_cpu(warm.tcp_cpu_s, [&] {
          return TimeWithFaults([&] { return TimeLoopbackTcp(workload, destinations); },
                                workload.bytes, warm.tcp_s, warm.tcp_faults);
        }));
        RETURN_IF_ERROR(with_cpu(warm.grpc_cpu_s, [&] {
          return TimeWithFaults(
              [&] { return grpc_alone->TimeStream(workload, destinations, /*prefault=*/false); },
              workload.bytes, warm.grpc_s, warm.grpc_faults);
        }));
      }
    }
    ScopedMallocRegime cold_malloc(Regime::kCold);
    for (int run = 0; run < options.runs; ++run) {
      Progress(absl::StrCat(workload.name, ": gRPC download and TCP, cold, run ", run + 1, "/",
                            options.runs));
      RETURN_IF_ERROR(with_cpu(cold.download_cpu_s, [&] {
        return TimeWithFaults(
            [&] { return TimeStoreLoad(*remote, workload, /*compare=*/run == 0); }, workload.bytes,
            cold.download_s, cold.download_faults);
      }));
      RETURN_IF_ERROR(with_cpu(cold.tcp_cpu_s, [&] {
        return TimeWithFaults(
            [&]() -> absl::StatusOr<double> {
              ASSIGN_OR_RETURN(std::vector<at::Tensor> fresh, FreshByteTensors(workload));
              return TimeLoopbackTcp(workload, fresh);
            },
            workload.bytes, cold.tcp_s, cold.tcp_faults);
      }));
      RETURN_IF_ERROR(with_cpu(cold.grpc_cpu_s, [&] {
        return TimeWithFaults(
            [&]() -> absl::StatusOr<double> {
              ASSIGN_OR_RETURN(std::vector<at::Tensor> fresh, FreshByteTensors(workload));
              return grpc_alone->TimeStream(workload, fresh, /*prefault=*/true);
            },
            workload.bytes, cold.grpc_s, cold.grpc_faults);
      }));
      RETURN_IF_ERROR(TimeWithFaults([&] { return TimeMemcpy(workload, /*prefault=*/false); },
                                     workload.bytes, cold.memcpy_s, cold.memcpy_faults));
    }
    return absl::OkStatus();
  }();
  server->Shutdown(absl::Seconds(5));
  server->Wait();
  RETURN_IF_ERROR(measured);
  warm.memcpy_s = times.memcpy_s;
  report.AddTiming("gRPC download, 1 stream, loopback, into faulted-in memory (ReadTensorInto)",
                   workload, warm.download_s, Regime::kWarm);
  report.AddTiming("TCP alone, 1 stream, loopback, into faulted-in memory (no gRPC)", workload,
                   warm.tcp_s, Regime::kWarm);
  report.AddTiming("gRPC download, 1 stream, loopback, into fresh tensors (LoadCheckpoint)",
                   workload, cold.download_s, Regime::kCold);
  report.AddTiming("TCP alone, 1 stream, loopback, into fresh memory (no gRPC)", workload,
                   cold.tcp_s, Regime::kCold);
  report.AddTiming("memcpy into fresh memory", workload, cold.memcpy_s, Regime::kCold);
  report.AddTiming("gRPC alone, 1 stream, loopback, into faulted-in memory (no store, no checksum)",
                   workload, warm.grpc_s, Regime::kWarm);
  report.AddTiming("gRPC alone, 1 stream, loopback, into fresh memory (no store, no checksum)",
                   workload, cold.grpc_s, Regime::kCold);
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    const Side& side = regime == Regime::kWarm ? warm : cold;
    const double gib = static_cast<double>(workload.bytes) / (1 << 30);
    const std::string faults = absl::StrCat(
        regime == Regime::kWarm
            ? absl::StrFormat("faults/MiB %.0f, TCP %.0f", Median(side.download_faults),
                              Median(side.tcp_faults))
            : absl::StrFormat("faults/MiB %.0f, TCP %.0f, memcpy %.0f",
                              Median(side.download_faults), Median(side.tcp_faults),
                              Median(side.memcpy_faults)),
        absl::StrFormat("; process CPU s/GiB %.2f, TCP %.2f", Median(side.download_cpu_s) / gib,
                        Median(side.tcp_cpu_s) / gib));
    FigureRow row{"R4", workload.name, "one gRPC download stream / memcpy (throughput)"};
    row.regime = regime;
    ASSIGN_OR_RETURN(row.ratio, ThroughputRatio(side.download_s, side.memcpy_s));
    row.target = 0.2;
    row.detail = absl::StrFormat("%.2f vs %.2f GiB/s; %s", GiBps(workload.bytes, side.download_s),
                                 GiBps(workload.bytes, side.memcpy_s), faults);
    report.AddFigure(std::move(row));
    FigureRow tcp{"R4'", workload.name, "one gRPC download stream / loopback TCP (throughput)"};
    tcp.regime = regime;
    ASSIGN_OR_RETURN(tcp.ratio, ThroughputRatio(side.download_s, side.tcp_s));
    tcp.target = 0.8;
    tcp.detail = absl::StrFormat("%.2f vs %.2f GiB/s; %s", GiBps(workload.bytes, side.download_s),
                                 GiBps(workload.bytes, side.tcp_s), faults);
    report.AddFigure(std::move(tcp));
    // What gRPC itself reaches over the same TCP, with nothing of ours on either end. It does
    // less than any Download stream, so it says how much of R4''s gap is gRPC's own (run for run;
    // on this VM single runs of either swing by more than their difference).
    FigureRow alone{"R4g", workload.name,
                    "gRPC alone, one stream (no store, no checksum) / loopback TCP (throughput)"};
    alone.regime = regime;
    alone.goal = Goal::kReference;
    ASSIGN_OR_RETURN(alone.ratio, ThroughputRatio(side.grpc_s, side.tcp_s));
    ASSIGN_OR_RETURN(const Summary download_of_alone,
                     ThroughputRatio(side.download_s, side.grpc_s));
    alone.detail = absl::StrFormat(
        "%.2f vs %.2f GiB/s; faults/MiB %.0f; process CPU s/GiB %.2f; Download / gRPC alone, "
        "paired: %s",
        GiBps(workload.bytes, side.grpc_s), GiBps(workload.bytes, side.tcp_s),
        Median(side.grpc_faults), Median(side.grpc_cpu_s) / gib,
        FormatSummary(download_of_alone, 3));
    report.AddFigure(std::move(alone));
  }
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
                     store->LoadCheckpoint(MakeVersionRef(workload.name, options.runs + 1)));
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

// The loader end to end: an in-process LoaderService on 127.0.0.1 over the store, read by
// RemoteLoader into client tensors (model and optimizer state, dtypes kept, CPU), against the
// local load (LoadCheckpoint) of the same version, in paired runs, in each regime.
// The local load it is paired with copies every tensor into new memory (no mapping), because
// that is the work the client has to do with bytes from the network too; the mapped local load
// (R3) does not compare like with like. Both sides allocate their tensors, so the regime is set
// through malloc (warm: after one untimed load of each kind, freed memory is reused).
absl::Status FigureR5(const BenchOptions& options, const Workload& workload,
                      const std::string& store_path, Report& report) {
  StoreKnobs copy_on_load;
  copy_on_load.map_on_load = false;
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   OpenStore(store_path, copy_on_load));
  ASSIGN_OR_RETURN(std::unique_ptr<LoaderService> service,
                   LoaderService::Create(store.get(), LoaderServiceOptions()));
  ASSIGN_OR_RETURN(
      std::unique_ptr<GrpcServer> server,
      GrpcServer::Start(GrpcServerOptions(), {{service.get(), v1::Loader::service_full_name()}}));
  struct Side {
    std::vector<double> local_s, local_faults, loader_s, loader_faults;
  };
  Side warm, cold;
  absl::Status measured = [&]() -> absl::Status {
    RemoteLoaderOptions loader_options;
    loader_options.address = server->address();
    ASSIGN_OR_RETURN(std::unique_ptr<RemoteLoader> loader, RemoteLoader::Connect(loader_options));
    LoadTarget target;
    target.include_optimizer = true;
    const v1::VersionRef ref = MakeVersionRef(workload.name, 1);
    const auto time_loader = [&]() -> absl::StatusOr<double> {
      const Clock::time_point start = Clock::now();
      ASSIGN_OR_RETURN(LoadedState loaded, loader->Load(ref, target));
      const double seconds = SecondsSince(start);
      int64_t bytes = loaded.model.TotalBytes();
      if (loaded.optimizer.has_value()) {
        loaded.optimizer->ForEachTensor(
            [&](const std::string&, const at::Tensor& tensor) { bytes += tensor.nbytes(); });
      }
      if (bytes != workload.bytes) {
        return absl::InternalError(absl::StrCat("the loader delivered ", bytes, " bytes of ",
                                                workload.name, ", saved ", workload.bytes));
      }
      return seconds;
    };
    for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
      Side& side = regime == Regime::kWarm ? warm : cold;
      ScopedMallocRegime malloc_regime(regime);
      if (regime == Regime::kWarm) {
        RETURN_IF_ERROR(TimeStoreLoad(*store, workload, /*compare=*/false).status());
        RETURN_IF_ERROR(time_loader().status());
      }
      for (int run = 0; run < options.runs; ++run) {
        Progress(absl::StrCat(workload.name, ": loader run, ", RegimeName(regime), ", ", run + 1,
                              "/", options.runs));
        RETURN_IF_ERROR(
            TimeWithFaults([&] { return TimeStoreLoad(*store, workload, /*compare=*/false); },
                           workload.bytes, side.local_s, side.local_faults));
        RETURN_IF_ERROR(
            TimeWithFaults(time_loader, workload.bytes, side.loader_s, side.loader_faults));
      }
    }
    return absl::OkStatus();
  }();
  server->Shutdown(absl::Seconds(5));
  server->Wait();
  RETURN_IF_ERROR(measured);
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    const Side& side = regime == Regime::kWarm ? warm : cold;
    report.AddTiming("store local load, every tensor copied, R5 pairs", workload, side.local_s,
                     regime);
    report.AddTiming("loader end to end (LoaderService -> RemoteLoader)", workload, side.loader_s,
                     regime);
    FigureRow row{"R5", workload.name, "loader end to end / local load, copied (throughput)"};
    row.regime = regime;
    ASSIGN_OR_RETURN(row.ratio, ThroughputRatio(side.loader_s, side.local_s));
    row.target = 0.8;
    row.detail = absl::StrFormat(
        "%.2f vs %.2f GiB/s; faults/MiB %.0f vs %.0f", GiBps(workload.bytes, side.loader_s),
        GiBps(workload.bytes, side.local_s), Median(side.loader_faults), Median(side.local_faults));
    report.AddFigure(std::move(row));
  }
  // R5 via the loader's shared-memory socket (tools/bench/shm_workload.h), against the local load
  // that maps the page cache as that path does: the store reopened with tensors mapped on load.
  server.reset();
  service.reset();
  store.reset();
  ASSIGN_OR_RETURN(store, OpenStore(store_path));
  for (const Regime regime : {Regime::kWarm, Regime::kCold}) {
    ScopedMallocRegime malloc_regime(regime);
    ASSIGN_OR_RETURN(const ShmLoadTimes shm, TimeShmLoads(*store, MakeVersionRef(workload.name, 1),
                                                          workload.bytes, options.runs));
    report.AddTiming("store local load, tensors >= 1 MiB mapped, R5 shm pairs", workload,
                     shm.local_s, regime);
    report.AddTiming("loader end to end via shared memory (ShmLoaderServer -> SharedMemoryLoader)",
                     workload, shm.shm_s, regime);
    FigureRow row{"R5", workload.name,
                  "loader end to end via shared memory / local load, mapped (throughput)"};
    row.regime = regime;
    ASSIGN_OR_RETURN(row.ratio, ThroughputRatio(shm.shm_s, shm.local_s));
    row.target = 0.9;
    row.detail = absl::StrFormat(
        "%.2f vs %.2f GiB/s; per load %.0f MiB mapped from packs, %.0f MiB copied to a memfd",
        GiBps(workload.bytes, shm.shm_s), GiBps(workload.bytes, shm.local_s),
        static_cast<double>(shm.in_place_bytes) / kMiB,
        static_cast<double>(shm.copied_bytes) / kMiB);
    report.AddFigure(std::move(row));
  }
  return absl::OkStatus();
}

// ---- M1: peak RSS, each measured in a fresh child process (this binary re-executed with
// --m1_child) so the parent's heap, page cache of other figures and allocator state do not count.

struct ProcMemory {
  int64_t rss_kib = 0;
  int64_t hwm_kib = 0;
};

absl::StatusOr<ProcMemory> ReadProcMemory() {
  std::ifstream status("/proc/self/status");
  if (!status) return absl::InternalError("cannot read /proc/self/status");
  ProcMemory memory;
  std::string line;
  while (std::getline(status, line)) {
    int64_t value = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &value) == 1) memory.rss_kib = value;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &value) == 1) memory.hwm_kib = value;
  }
  return memory;
}

// Runs in the child. Prints "M1 <baseline KiB> <peak KiB> <checkpoint bytes>".
absl::Status RunM1Child(const BenchOptions& options, const std::string& mode,
                        const std::string& db) {
  // Resets VmHWM to the current RSS, so the peak is this measurement's alone.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  ASSIGN_OR_RETURN(ProcMemory baseline, ReadProcMemory());
  int64_t bytes = 0;
  ProcMemory peak;
  if (mode == "save") {
    ASSIGN_OR_RETURN(Workload workload, MakeLargeWorkload(options.large_param_bytes));
    bytes = workload.bytes;
    ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db));
    RETURN_IF_ERROR(store->CommitCheckpoint(workload.name, workload.contents).status());
    ASSIGN_OR_RETURN(peak, ReadProcMemory());
  } else if (mode == "load") {
    ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db));
    ASSIGN_OR_RETURN(LoadedCheckpoint loaded, store->LoadCheckpoint(MakeVersionRef("large", 1)));
    bytes = LoadedBytes(loaded);
    ASSIGN_OR_RETURN(peak, ReadProcMemory());
  } else {
    return absl::InvalidArgumentError("--m1_child must be 'save' or 'load', got '" + mode + "'");
  }
  std::cout << "M1 " << baseline.rss_kib << " " << peak.hwm_kib << " " << bytes << std::endl;
  return absl::OkStatus();
}

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

// ---- M2: an export's peak memory against the version's largest tensor. Like M1, each export
// runs in a fresh child process (this binary with --m2_child): the store is opened and the
// version's manifest read first, VmHWM is reset to the RSS then (clear_refs 5), and the figure
// is (VmHWM after ExportToFile - that RSS) / largest tensor bytes -- everything the export adds,
// tensors read (mapped store pages count while mapped), casts, pickle and buffers; the page
// cache of the written file is not the process's memory and does not count.

constexpr int kM2Tensors = 8;

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
  { std::ofstream("/proc/self/clear_refs") << "5"; }
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
