#ifndef CKPT_LIBS_FORMAT_INSPECT_H_
#define CKPT_LIBS_FORMAT_INSPECT_H_

// What `ckpt inspect FILE` reports: format, every model tensor (key, dtype, shape, bytes,
// original device), the wrapper prefix normalization would strip, the bundle's structure
// (epoch / step, optimizer param groups and state sizes, scheduler fields, other entries),
// total bytes and reader warnings. One report, rendered for people or as JSON for machines.

#include <string>

#include "libs/format/checkpoint_file.h"
#include "nlohmann/json.hpp"

namespace ckpt {

// The report as JSON (stable field names; see inspect_test for the shape).
nlohmann::ordered_json InspectCheckpoint(const CheckpointFile& file);

// The same report as aligned text for a terminal.
std::string RenderInspectText(const nlohmann::ordered_json& report);

// "1.5 MiB", "512 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_INSPECT_H_
