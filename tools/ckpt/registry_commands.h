#ifndef CKPT_TOOLS_CKPT_REGISTRY_COMMANDS_H_
#define CKPT_TOOLS_CKPT_REGISTRY_COMMANDS_H_

// The model registry's commands of `ckpt` (model, annotate, history, promote, rollback), and the
// registry options other commands gain (ls filters, import lineage and metrics, --reason): each
// a thin adapter over CheckpointStore and libs/registry.

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/store/checkpoint_import.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/registry.pb.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {

// model, annotate, history, promote, rollback.
const std::vector<cli::CommandSpec>& RegistryCommands();
// Runs one of RegistryCommands(); `line.command()` must name one.
absl::Status RunRegistryCommand(const cli::ParsedCommandLine& line);

// The options `ckpt ls MODEL` filters versions with (--tag, --label, --where, --since, --until).
std::vector<cli::OptionSpec> VersionFilterOptions();
// Whether any of them was given.
bool HasVersionFilter(const cli::ParsedCommandLine& line);
// The filter they describe. INVALID_ARGUMENT for a malformed condition, KEY=VALUE or time.
absl::StatusOr<v1::VersionFilter> VersionFilterFromOptions(const cli::ParsedCommandLine& line);

// The options `ckpt import` records with the version (--label, --metric, --run-id, --parent,
// --parent-relation, --code-revision, --dataset).
std::vector<cli::OptionSpec> ImportRecordOptions();
// Fills `options`' labels, metrics and lineage from them. INVALID_ARGUMENT for a malformed
// KEY=VALUE, a metric that is not a finite number, or a --parent that is not MODEL@VERSION;
// NOT_FOUND when the parent version is not in `store`.
absl::Status ApplyImportRecordOptions(const cli::ParsedCommandLine& line, CheckpointStore& store,
                                      ImportOptions& options);

// The --reason option, and the attribution it gives (the identity is the store's business).
cli::OptionSpec ReasonOption();
ChangeAttribution AttributionFromOptions(const cli::ParsedCommandLine& line);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_REGISTRY_COMMANDS_H_
