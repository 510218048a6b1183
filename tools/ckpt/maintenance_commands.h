#ifndef CKPT_TOOLS_CKPT_MAINTENANCE_COMMANDS_H_
#define CKPT_TOOLS_CKPT_MAINTENANCE_COMMANDS_H_

// Keeping a store healthy and accountable: `ckpt retain`, `gc`, `verify`, `repair` and `audit`,
// each a thin adapter over CheckpointStore (and libs/store's RepairStore).

#include "absl/status/status.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

cli::CommandSpec RetainCommand();
absl::Status RunRetain(const cli::ParsedCommandLine& line);

cli::CommandSpec GcCommand();
absl::Status RunGc(const cli::ParsedCommandLine& line);

cli::CommandSpec VerifyCommand();
// DATA_LOSS when the verification found problems (they are printed first).
absl::Status RunVerify(const cli::ParsedCommandLine& line);

cli::CommandSpec RepairCommand();
// DATA_LOSS when problems remain after the repair (they are printed first).
absl::Status RunRepair(const cli::ParsedCommandLine& line);

cli::CommandSpec AuditCommand();
absl::Status RunAudit(const cli::ParsedCommandLine& line);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_MAINTENANCE_COMMANDS_H_
