#ifndef CKPT_TOOLS_BENCH_RUN_COMMAND_H_
#define CKPT_TOOLS_BENCH_RUN_COMMAND_H_

// The benchmark's baselines and children run as shell commands (Python, the trainer, this binary
// re-executed): their standard output, or an error that says how they ended.

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

// Runs `command` with /bin/sh and returns what it wrote to stdout (add "2>&1" for stderr too).
// INTERNAL naming the command, its exit status and its output when it exits non-zero.
absl::StatusOr<std::string> RunCommand(const std::string& command);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_RUN_COMMAND_H_
