#ifndef CKPT_TOOLS_BENCH_ZERO_SAVE_FIGURES_H_
#define CKPT_TOOLS_BENCH_ZERO_SAVE_FIGURES_H_

// M3 of tools/bench: the peak extra memory of a ZeRO-1 rank while it writes its part of a
// parallel checkpoint, against its shard (the bytes it writes: its slices of the parameters and
// of their AdamW state) plus 2 chunks. Two ranks, each this binary re-executed (--m3_rank) by
// ddp::RunLocalRanks, save through the trainer's path (ZeroOptimizer::ShardedStateDict,
// AsyncCheckpointer::SubmitShared) to a store service in the parent process, so that a rank's
// memory is its own and not the store's. Beside it, same run: the same save with the optimizer
// state gathered first (GatherStateDict), what the trainer did before slices were written from
// the shards.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "tools/bench/report.h"

namespace ckpt::bench {

// Runs in a rank process (the torchrun environment set): `mode` "sharded" or "gathered", the
// store at `store_address`, `param_bytes` of float32 parameters in 16 tensors. Writes
// "<baseline RSS KiB> <peak KiB> <part bytes> <snapshot bytes> <optimizer shard bytes>" to
// "<out>.<rank>".
absl::Status RunM3Rank(const std::string& mode, const std::string& store_address,
                       const std::string& out, int64_t param_bytes);

absl::Status FigureM3(const BenchOptions& options, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_ZERO_SAVE_FIGURES_H_
