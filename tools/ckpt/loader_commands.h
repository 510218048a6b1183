#ifndef CKPT_TOOLS_CKPT_LOADER_COMMANDS_H_
#define CKPT_TOOLS_CKPT_LOADER_COMMANDS_H_

// `ckpt export MODEL@REF OUT` and `ckpt check MODEL@REF --against FILE`: a stored version as a
// consumer sees it, through a Loader -- this process over the store, or a loader service
// (--loader) -- each a thin adapter over Loader::Export and Loader::Preflight.

#include "absl/status/status.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

cli::CommandSpec ExportCommand();
absl::Status RunExport(const cli::ParsedCommandLine& line);

cli::CommandSpec CheckCommand();
// FAILED_PRECONDITION when the version does not fit the file (the report is printed first).
absl::Status RunCheck(const cli::ParsedCommandLine& line);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_LOADER_COMMANDS_H_
