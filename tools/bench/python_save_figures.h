#ifndef CKPT_TOOLS_BENCH_PYTHON_SAVE_FIGURES_H_
#define CKPT_TOOLS_BENCH_PYTHON_SAVE_FIGURES_H_

// R11, a Python team's checkpoints: ckpt_client's Client.save of a state dict to a store service
// on 127.0.0.1 against torch.save + fsync of the same state to the same disk, and a training
// loop's stall per Client.save_async against torch.save in the loop
// (tools/bench/python_save_baseline.py is the Python side).

#include "absl/status/status.h"
#include "tools/bench/report.h"

namespace ckpt::bench {

absl::Status FigureR11(const BenchOptions& options, Report& report);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_PYTHON_SAVE_FIGURES_H_
