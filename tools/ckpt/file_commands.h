#ifndef CKPT_TOOLS_CKPT_FILE_COMMANDS_H_
#define CKPT_TOOLS_CKPT_FILE_COMMANDS_H_

// `ckpt inspect FILE` and `ckpt convert IN OUT`: checkpoint files on disk, no store; thin
// adapters over libs/format's InspectCheckpoint and ConvertCheckpoint.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

cli::CommandSpec InspectCommand();
absl::Status RunInspect(const cli::ParsedCommandLine& line);

cli::CommandSpec ConvertCommand();
absl::Status RunConvert(const cli::ParsedCommandLine& line);

// --max-expanded-bytes of convert and import: 0 (the default, also when absent) leaves the
// reader's default. INVALID_ARGUMENT for a value that is not a non-negative integer.
absl::StatusOr<int64_t> MaxExpandedBytes(const cli::ParsedCommandLine& line);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_FILE_COMMANDS_H_
