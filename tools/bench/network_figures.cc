#include "tools/bench/network_figures.h"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "tools/bench/grpc_baseline.h"
#include "tools/bench/measurements.h"
#include "tools/bench/served_store.h"
#include "tools/bench/stats.h"

namespace ckpt::bench {
namespace {

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

}  // namespace

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
  ASSIGN_OR_RETURN(ServedStore served, ServeStore(*store));
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
    remote_options.address = served.server->address();
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
  served.server->Shutdown(absl::Seconds(5));
  served.server->Wait();
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

}  // namespace ckpt::bench
