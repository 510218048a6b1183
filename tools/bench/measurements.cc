#include "tools/bench/measurements.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/equal.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/benchmark_seams.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/version_ref.h"
#include "tools/bench/report.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

int64_t MinorFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

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

}  // namespace

absl::StatusOr<Summary> ThroughputRatio(const std::vector<double>& operation_s,
                                        const std::vector<double>& baseline_s) {
  ASSIGN_OR_RETURN(std::vector<double> ratios, PairedRatios(baseline_s, operation_s));
  return Summarize(ratios);
}

double ProcessCpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double MachineBusySeconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return static_cast<double>(user + nice + system + irq + softirq + steal) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

absl::Status TimeWithFaults(const std::function<absl::StatusOr<double>()>& operation, int64_t bytes,
                            std::vector<double>& seconds, std::vector<double>& faults_per_mib) {
  const int64_t before = MinorFaults();
  ASSIGN_OR_RETURN(double taken, operation());
  faults_per_mib.push_back(static_cast<double>(MinorFaults() - before) * kMiB /
                           static_cast<double>(std::max<int64_t>(bytes, 1)));
  seconds.push_back(taken);
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoError("fsync " + path);
}

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

absl::StatusOr<double> TimeMemcpy(const Workload& workload, bool prefault) {
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

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> OpenStore(const std::string& path,
                                                                  StoreKnobs knobs) {
  StoreOptions options;
  options.db_path = path;
  options.map_tensors_on_load = knobs.map_on_load;
  if (knobs.skip_hashing) return StoreBenchmarkSeams::OpenWithoutHashing(options);
  return RocksDbCheckpointStore::Open(options);
}

absl::StatusOr<double> TimeStoreSave(const Workload& workload, const std::string& db_path,
                                     StoreKnobs knobs) {
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store, OpenStore(db_path, knobs));
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(CommitResult committed,
                   CommitCheckpoint(*store, workload.name, workload.contents));
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

absl::StatusOr<double> TimeStoreLoad(CheckpointStore& store, const Workload& workload,
                                     bool compare) {
  const v1::VersionRef ref = MakeVersionRef(workload.name, 1);
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(store, ref));
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

void ResetPeakMemory() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace ckpt::bench
