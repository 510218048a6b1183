// fleet_bench: loader fleet throughput (issues #21 and #22). One version of --mib MiB (float32
// tensors of 4 MiB, model only) in a RocksDB store under --dir; 1, 2 and 3 loader servers over
// it (in this process, each a real gRPC server on 127.0.0.1) and a RemoteLoader with the list of
// their addresses loading it over 1, 2 and 4 streams (RemoteLoaderOptions::streams). Baseline in
// the same run: one loopback TCP stream without gRPC carrying the same bytes into fresh tensors
// (as Load receives into fresh tensors: the same memory regime on both sides). Each cell is the
// median of --reps timed loads after one untimed load that fills the loaders' chunk caches, with
// each run's ratio to the TCP run paired with it.
//
//   bazel run //tools/bench:fleet_bench -- [--mib=256] [--reps=5] [--dir=/tmp/fleet_bench]
//
// Loaders, client and TCP baseline share this machine's cores: on 2 vCPUs more loaders or
// streams mostly add overhead (every loader thread competes with the client's); the figure says
// what a fleet costs here, not what it gains across machines.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/client/remote_loader.h"
#include "libs/io/prefault.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "services/loader/loader_service.h"
#include "tools/bench/stats.h"
#include "tools/bench/workloads.h"

ABSL_FLAG(int, mib, 256, "Size of the version loaded, in MiB (4 MiB tensors).");
ABSL_FLAG(int, reps, 5, "Timed loads per cell.");
ABSL_FLAG(std::string, dir, "/tmp/fleet_bench", "Scratch directory for the store (replaced).");

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Fresh float32 tensors shaped as the workload's, faulted in as Load's are (libs/io/prefault.h).
std::vector<at::Tensor> FreshTensors(const Workload& workload) {
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& tensor : workload.tensors) {
    tensors.push_back(at::empty(tensor.sizes(), tensor.options()));
    PrefaultForWrite(tensors.back().data_ptr(), tensors.back().nbytes());
  }
  return tensors;
}

absl::Status Run() {
  const int mib = absl::GetFlag(FLAGS_mib);
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSIGN_OR_RETURN(Workload workload, MakeExportWorkload(std::max(1, mib / 4), int64_t{4} << 20));
  StoreOptions store_options;
  store_options.db_path = dir + "/store";
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDbCheckpointStore> store,
                   RocksDbCheckpointStore::Open(store_options));
  ASSIGN_OR_RETURN(CommitResult committed, CommitCheckpoint(*store, "fleet", workload.contents));
  const v1::VersionRef ref = committed.version;
  const double gib = static_cast<double>(workload.bytes) / (1 << 30);

  std::vector<std::unique_ptr<LoaderService>> services;
  std::vector<std::unique_ptr<GrpcServer>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    LoaderServiceOptions options;
    options.cache_bytes = workload.bytes + (64 << 20);  // the version stays cached.
    ASSIGN_OR_RETURN(std::unique_ptr<LoaderService> service,
                     LoaderService::Create(store.get(), options));
    ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,
                     GrpcServer::Start({}, {{service.get(), v1::Loader::service_full_name()}}));
    addresses.push_back(server->address());
    services.push_back(std::move(service));
    servers.push_back(std::move(server));
  }

  std::printf("fleet_bench: %.3f GiB in %zu tensors, %d timed loads per cell, %u CPUs\n", gib,
              workload.tensors.size(), reps, std::thread::hardware_concurrency());
  std::printf("%-8s %-8s %-26s %-10s %-26s\n", "loaders", "streams", "load s (median [min, max])",
              "GiB/s", "/ loopback TCP (paired)");
  std::vector<double> tcp_all;
  for (int loaders = 1; loaders <= 3; ++loaders) {
    for (int streams : {1, 2, 4}) {
      RemoteLoaderOptions options;
      options.address = absl::StrJoin(addresses.begin(), addresses.begin() + loaders, ",");
      options.streams = streams;
      ASSIGN_OR_RETURN(std::unique_ptr<RemoteLoader> loader, RemoteLoader::Connect(options));
      // Fills every loader's cache (round-robin: several loads for several loaders).
      for (int i = 0; i < loaders; ++i) RETURN_IF_ERROR(loader->Load(ref, LoadTarget()).status());
      std::vector<double> load_s;
      std::vector<double> tcp_s;
      for (int rep = 0; rep < reps; ++rep) {
        std::vector<at::Tensor> destinations = FreshTensors(workload);
        ASSIGN_OR_RETURN(const double tcp, TimeLoopbackTcp(workload, destinations));
        tcp_s.push_back(tcp);
        const Clock::time_point start = Clock::now();
        ASSIGN_OR_RETURN(LoadedState state, loader->Load(ref, LoadTarget()));
        load_s.push_back(SecondsSince(start));
        if (state.model.size() != workload.tensors.size()) {
          return absl::InternalError("a load returned the wrong number of tensors");
        }
      }
      tcp_all.insert(tcp_all.end(), tcp_s.begin(), tcp_s.end());
      ASSIGN_OR_RETURN(std::vector<double> ratios, PairedRatios(tcp_s, load_s));
      const Summary seconds = Summarize(load_s);
      std::printf("%-8d %-8d %-26s %-10.2f %-26s\n", loaders, streams,
                  FormatSummary(seconds, 3).c_str(), gib / seconds.median,
                  FormatSummary(Summarize(ratios), 2).c_str());
      std::fflush(stdout);
    }
  }
  const Summary tcp = Summarize(tcp_all);
  std::printf("loopback TCP, 1 stream, no gRPC: %s s, %.2f GiB/s\n", FormatSummary(tcp, 3).c_str(),
              gib / tcp.median);
  for (auto& server : servers) {
    server->Shutdown(absl::ZeroDuration());
    server->Wait();
  }
  for (int i = 0; i < 3; ++i) {
    std::printf("loader %d: %lld streams served\n", i,
                static_cast<long long>(services[i]->streams_started()));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Loader fleet throughput: one version of --mib MiB loaded by a RemoteLoader over 1, 2 and 3\n"
      "in-process loader servers on 127.0.0.1 and 1, 2 and 4 streams, each cell the median of\n"
      "--reps timed loads with its ratio to a plain loopback TCP stream of the same bytes.\n"
      "  bazel run //tools/bench:fleet_bench -- --mib=256 --reps=5 [--dir=/tmp/fleet_bench]");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ckpt::bench::Run();
  if (!status.ok()) {
    std::cerr << "fleet_bench: " << status << "\n";
    return 1;
  }
  return 0;
}
