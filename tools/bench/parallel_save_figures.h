#ifndef CKPT_TOOLS_BENCH_PARALLEL_SAVE_FIGURES_H_
#define CKPT_TOOLS_BENCH_PARALLEL_SAVE_FIGURES_H_

// R10 of tools/bench: one checkpoint of a replicated state written by two ranks in parallel, each
// its half (CheckpointStore::JoinUpload, as the trainer's --parallel_checkpoints does), against one
// rank writing all of it (CommitCheckpoint), same bytes, same run; and R10 resume: that version
// read back by three readers, each taking a third of its bytes by range (as the ranks of a resumed
// ZeRO run read their slices), against one reader of the same bytes.

#include "absl/status/status.h"
#include "tools/bench/report.h"

namespace ckpt::bench {

absl::Status FigureR10(const BenchOptions& options, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_PARALLEL_SAVE_FIGURES_H_
