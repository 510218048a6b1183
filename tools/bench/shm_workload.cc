#include "tools/bench/shm_workload.h"

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/client/shm_loader.h"
#include "libs/loader/shm_server.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_contents.h"
#include "services/loader/loader_service.h"

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;

int64_t TensorBytes(const LoadedState& state) {
  int64_t bytes = state.model.TotalBytes();
  for (const std::optional<Value>* tree : {&state.optimizer, &state.scheduler}) {
    if (!tree->has_value()) continue;
    (*tree)->ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { bytes += tensor.nbytes(); });
  }
  return bytes;
}

// One load, timed, its tensors counted (outside the time) and dropped.
absl::StatusOr<double> TimeLoad(const Loader& loader, const v1::VersionRef& ref,
                                const LoadTarget& target, int64_t expected_bytes,
                                absl::string_view side) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(LoadedState loaded, loader.Load(ref, target));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (const int64_t bytes = TensorBytes(loaded); bytes != expected_bytes) {
    return absl::InternalError(
        absl::StrCat("the ", side, " load delivered ", bytes, " bytes, expected ", expected_bytes));
  }
  return seconds;
}

// The local side: CheckpointStore::LoadCheckpoint, which maps tensors of 1 MiB or more from
// the packs as the shared-memory path does (LocalLoader goes through a cached reader that copies,
// which would flatter the shared-memory side).
absl::StatusOr<double> TimeLocalLoad(CheckpointStore& store, const v1::VersionRef& ref,
                                     int64_t expected_bytes) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadCheckpoint(store, ref));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t bytes = 0;
  for (const StateDict::Entry& entry : loaded.contents.model) bytes += entry.tensor.nbytes();
  if (loaded.contents.optimizer.has_value()) {
    loaded.contents.optimizer->ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { bytes += tensor.nbytes(); });
  }
  if (bytes != expected_bytes) {
    return absl::InternalError(
        absl::StrCat("the local load delivered ", bytes, " bytes, expected ", expected_bytes));
  }
  return seconds;
}

}  // namespace

absl::StatusOr<ShmLoadTimes> TimeShmLoads(CheckpointStore& store, const v1::VersionRef& ref,
                                          int64_t expected_bytes, int runs) {
  ASSIGN_OR_RETURN(std::unique_ptr<LoaderService> service,
                   LoaderService::Create(&store, LoaderServiceOptions()));
  ASSIGN_OR_RETURN(
      std::unique_ptr<GrpcServer> grpc,
      GrpcServer::Start(GrpcServerOptions(), {{service.get(), v1::Loader::service_full_name()}}));
  char pattern[] = "/tmp/ckpt-bench-shm-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp under /tmp failed");
  const std::string dir = pattern;
  ShmServerOptions shm_options;
  shm_options.socket_path = dir + "/loader.sock";
  ShmLoadTimes times;
  absl::Status measured = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ShmLoaderServer> shm_server,
                     ShmLoaderServer::Start(&store, shm_options));
    LoaderClientOptions client;
    client.address = grpc->address();
    client.shm_socket = shm_options.socket_path;
    ASSIGN_OR_RETURN(std::unique_ptr<Loader> shm, OpenLoaderClient(client));
    const auto* shm_loader = dynamic_cast<const SharedMemoryLoader*>(shm.get());
    if (shm_loader == nullptr) {
      return absl::InternalError("OpenLoaderClient did not take the shared-memory path");
    }
    LoadTarget target;
    target.include_optimizer = true;
    target.include_scheduler = true;
    // The page cache warm for both, and each side's first-call costs out of the timings.
    RETURN_IF_ERROR(TimeLocalLoad(store, ref, expected_bytes).status());
    RETURN_IF_ERROR(TimeLoad(*shm, ref, target, expected_bytes, "shared-memory").status());
    const ShmServerCounters before = shm_server->counters();
    for (int run = 0; run < runs; ++run) {
      ASSIGN_OR_RETURN(const double local_s, TimeLocalLoad(store, ref, expected_bytes));
      ASSIGN_OR_RETURN(const double shm_s,
                       TimeLoad(*shm, ref, target, expected_bytes, "shared-memory"));
      times.local_s.push_back(local_s);
      times.shm_s.push_back(shm_s);
    }
    if (shm_loader->counters().fallback_loads != 0) {
      return absl::InternalError("a shared-memory load fell back to gRPC");
    }
    const ShmServerCounters after = shm_server->counters();
    if (runs > 0) {
      times.in_place_bytes = (after.in_place_bytes - before.in_place_bytes) / runs;
      times.copied_bytes = (after.copied_bytes - before.copied_bytes) / runs;
    }
    shm.reset();
    shm_server->Shutdown();
    return absl::OkStatus();
  }();
  grpc->Shutdown(absl::Seconds(5));
  grpc->Wait();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  RETURN_IF_ERROR(measured);
  return times;
}

}  // namespace ckpt::bench
