#ifndef CKPT_TOOLS_BENCH_WORKLOADS_H_
#define CKPT_TOOLS_BENCH_WORKLOADS_H_

// The benchmark's checkpoints, generated deterministically in memory.
//
// Tensor bytes are pseudo-random (splitmix64), never zeros or a repeated pattern: the store
// deduplicates identical 4 MiB chunks, so a constant fill would measure one chunk stored once.
// Values are finite floats in [-0.5, 0.5), so any consumer may also compute on them.
//
// Example:
//   ASSIGN_OR_RETURN(Workload large, MakeLargeWorkload(int64_t{1} << 30));  // ~3 GiB with Adam
//   for (const at::Tensor& tensor : large.tensors) { ... }                  // every byte, once

#include <cstdint>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/tensor/value.h"

namespace ckpt::bench {

struct Workload {
  std::string name;                 // "large", "many-small", ...: also the store's model name.
  CheckpointContents contents;      // what the store saves.
  Value python_root;                // the same tensors as a torch.save object (for Python / files).
  std::vector<at::Tensor> tensors;  // every tensor of `contents` once, model first.
  int64_t bytes = 0;                // sum of the tensors' bytes.
};

// Fills a contiguous float32 CPU tensor with pseudo-random values determined by `seed`.
// INVALID_ARGUMENT for another dtype or a non-contiguous tensor.
absl::Status FillRandom(const at::Tensor& tensor, uint64_t seed);

// About `param_bytes` of float32 parameters (layers of a [4096, 1024] weight and a [4096] bias;
// at least one layer) plus Adam state (step, exp_avg, exp_avg_sq per parameter), as
// torch.optim.Adam's state_dict() holds it: about 3 x param_bytes in all.
absl::StatusOr<Workload> MakeLargeWorkload(int64_t param_bytes);

// `count` float32 tensors of 4 to 64 KiB each (sizes uniform, fixed seed): per-tensor overhead.
absl::StatusOr<Workload> MakeManySmallWorkload(int count);

// `count` float32 tensors of `tensor_bytes` each ([tensor_bytes / 4096, 1024]), model tensors
// only: an export's memory against its largest tensor (M2), which is 1/count of the whole.
absl::StatusOr<Workload> MakeExportWorkload(int count, int64_t tensor_bytes);

// A fine-tune series: every version shares one frozen backbone of about `backbone_bytes`
// ([1024, 1024] float32 layers) and has its own head of about `head_bytes`.
struct FineTuneSeries {
  std::vector<CheckpointContents> versions;
  int64_t backbone_bytes = 0;  // exact, as generated.
  int64_t head_bytes = 0;      // exact, per version.
};
absl::StatusOr<FineTuneSeries> MakeFineTuneSeries(int64_t backbone_bytes, int64_t head_bytes,
                                                  int versions);

// One TCP stream on 127.0.0.1 and no gRPC: a thread writes every byte of `workload`'s tensors,
// the caller's thread reads them into `destinations` (same sizes, in order; faulted in or fresh,
// as the figure needs). Seconds from the first send to the last byte received. What loopback TCP
// itself costs here (two kernel copies, the stack, both vCPUs): the ceiling of the gRPC paths.
absl::StatusOr<double> TimeLoopbackTcp(const Workload& workload,
                                       std::vector<at::Tensor>& destinations);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_WORKLOADS_H_
