#ifndef CKPT_TOOLS_CKPT_STORE_COMMANDS_H_
#define CKPT_TOOLS_CKPT_STORE_COMMANDS_H_

// The versions of `ckpt`'s store: import, ls, show, tag, untag, rm, diff and stats, each a thin
// adapter over CheckpointStore (and libs/store's ImportCheckpointFile and DiffVersions).

#include "absl/status/status.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

cli::CommandSpec ImportCommand();
absl::Status RunImport(const cli::ParsedCommandLine& line);

cli::CommandSpec ListCommand();
absl::Status RunList(const cli::ParsedCommandLine& line);

cli::CommandSpec ShowCommand();
absl::Status RunShow(const cli::ParsedCommandLine& line);

cli::CommandSpec TagCommand();
absl::Status RunTag(const cli::ParsedCommandLine& line);

cli::CommandSpec UntagCommand();
absl::Status RunUntag(const cli::ParsedCommandLine& line);

cli::CommandSpec RemoveCommand();
absl::Status RunRemove(const cli::ParsedCommandLine& line);

cli::CommandSpec DiffCommand();
absl::Status RunDiff(const cli::ParsedCommandLine& line);

cli::CommandSpec StatsCommand();
cli::CommandSpec WhoAmICommand();
absl::Status RunStats(const cli::ParsedCommandLine& line);
absl::Status RunWhoAmI(const cli::ParsedCommandLine& line);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_STORE_COMMANDS_H_
