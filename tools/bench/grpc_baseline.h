#ifndef CKPT_TOOLS_BENCH_GRPC_BASELINE_H_
#define CKPT_TOOLS_BENCH_GRPC_BASELINE_H_

// gRPC alone: one server stream on 127.0.0.1 carrying a workload's bytes, with no store, no
// checksum and no message header of ours. What gRPC itself allows here, between loopback TCP
// (TimeLoopbackTcp) and the store's Download (R4'): it does less work than any one-stream gRPC
// path that places the same bytes, so it is their ceiling in expectation (a single run on a
// noisy machine may still come out below the Download's).
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<GrpcBaseline> grpc, GrpcBaseline::Start());
//   ASSIGN_OR_RETURN(double seconds, grpc->TimeStream(workload, destinations, /*prefault=*/false));

#include <memory>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "tools/bench/workloads.h"

namespace ckpt::bench {

class GrpcBaseline {
 public:
  // A plaintext gRPC server on 127.0.0.1:0 with one generic streaming method, and a channel to
  // it (connected before this returns). The server and the channel use the message-size limits
  // of the store's server and client (libs/rpc), and no other settings.
  static absl::StatusOr<std::unique_ptr<GrpcBaseline>> Start();
  virtual ~GrpcBaseline() = default;

  // One call: the server sends every byte of `workload`'s tensors, in order, as messages of
  // 1 MiB (the Download's largest piece, kMaxTensorDataBytes), each a slice that points into the
  // tensor (no copy before gRPC's own); the caller's thread reads them and copies each into
  // `destinations` (same sizes, in order), as a Download client places its bytes. With
  // `prefault`, every destination is first mapped in one call each (PrefaultForWrite), as
  // LoadCheckpoint does with the fresh tensors it fills; pass it for fresh destinations, so the
  // cold regime's ceiling is not the page-fault path. Seconds from the call's start (prefaulting
  // included) to the end of the stream. Like TimeLoopbackTcp, it leaves out what the store's path
  // adds: reading the store, our message header, checksums. One call at a time per GrpcBaseline.
  virtual absl::StatusOr<double> TimeStream(const Workload& workload,
                                            std::vector<at::Tensor>& destinations,
                                            bool prefault) = 0;
};

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_GRPC_BASELINE_H_
