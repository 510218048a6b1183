#ifndef CKPT_TOOLS_CKPT_SYNC_COMMAND_H_
#define CKPT_TOOLS_CKPT_SYNC_COMMAND_H_

// `ckpt sync MODEL@ALIAS DIR`: the serving sidecar, a thin adapter over libs/registry's
// ServingSync (serving_sync.h describes the directory layout and guarantees).

#include "absl/status/status.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

cli::CommandSpec SyncCommand();
absl::Status RunSync(const cli::ParsedCommandLine& line);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_SYNC_COMMAND_H_
