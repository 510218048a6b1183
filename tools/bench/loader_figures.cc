#include "tools/bench/loader_figures.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "libs/client/remote_loader.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_macros.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"
#include "services/loader/loader_service.h"
#include "tools/bench/measurements.h"
#include "tools/bench/shm_workload.h"
#include "tools/bench/stats.h"

namespace ckpt::bench {

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

}  // namespace ckpt::bench
