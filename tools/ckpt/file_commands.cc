#include "tools/ckpt/file_commands.h"

#include <filesystem>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/convert.h"
#include "libs/format/inspect.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt/output.h"

namespace ckpt {
namespace {

std::string ModelKey(const cli::ParsedCommandLine& line) {
  return line.Has("key") ? line.Get("key") : "";
}

}  // namespace

cli::CommandSpec InspectCommand() {
  return {
      "inspect",
      "FILE",
      "Describe a checkpoint file: format, tensors (dtype, shape, original device), wrapper "
      "prefix, optimizer / scheduler structure. A stored version: `ckpt show MODEL@REF`.",
      1,
      1,
      {{"json", "", "print the report as JSON", ""},
       {"key", "PATH",
        "where the model state dict is, e.g. model, ckpt/state_dict, or 0 for a list's first item",
        "auto"}}};
}

cli::CommandSpec ConvertCommand() {
  return {"convert",
          "IN OUT",
          "Write IN as a clean CPU file: a training bundle stays a whole bundle (model, optimizer, "
          "scheduler, epoch and every other plain field, as saved) in torch .pt; safetensors and "
          "--model-only write the model's state dict alone.",
          2,
          2,
          {{"format", "torch|safetensors", "output format", "from OUT's extension"},
           {"model-only", "", "write only the model's state dict, even from a bundle", ""},
           {"strip-prefix", "auto|none|PREFIX",
            "auto strips wrapper prefixes (module., _orig_mod., FSDP, checkpointing)", "auto"},
           {"add-prefix", "PREFIX", "prefix added to every key after stripping, e.g. module.", ""},
           {"key", "PATH", "where the model state dict is, e.g. model (0: a list's first item)",
            "auto"},
           {"max-expanded-bytes", "BYTES",
            "refuse a file whose tensors would together take this many bytes more once "
            "materialized than the file stores (broadcast or overlapping views claiming memory "
            "and output it does not hold); 0: 1/8 of this host's available memory",
            "0"}}};
}

absl::StatusOr<int64_t> MaxExpandedBytes(const cli::ParsedCommandLine& line) {
  if (!line.Has("max-expanded-bytes")) return 0;
  ASSIGN_OR_RETURN(const int64_t bytes, line.GetInt("max-expanded-bytes"));
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-expanded-bytes must be >= 0 (0: 1/8 of this host's available memory), got ", bytes));
  }
  return bytes;
}

absl::Status RunInspect(const cli::ParsedCommandLine& line) {
  ReadCheckpointOptions options;
  options.model_key = ModelKey(line);
  options.max_expanded_bytes = -1;  // inspect reports shapes; it never materializes a tensor.
  options.allow_no_model = true;    // any root is described: a bare tensor, a list, values.
  const std::string& path = line.arguments()[0];
  absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(path, options);
  if (absl::IsNotFound(file.status()) && absl::StrContains(path, '@') &&
      ParseVersionRef(path).ok() && !std::filesystem::exists(path)) {
    // MODEL@REF names a stored version, which `show` describes (inspect reads files only).
    return absl::NotFoundError(absl::StrCat(
        "no file '", path, "'; to describe the stored version ", path, " run `ckpt show ", path,
        "` (with --store or --store_dir)"));
  }
  if (!file.ok()) return file.status();
  const nlohmann::ordered_json report = InspectCheckpoint(*file);
  std::cout << (line.Has("json") ? report.dump(2) + "\n" : RenderInspectText(report));
  return absl::OkStatus();
}

absl::Status RunConvert(const cli::ParsedCommandLine& line) {
  ConvertOptions options;
  options.format = line.Has("format") ? line.Get("format") : "";
  options.strip_prefix = line.Get("strip-prefix");
  options.add_prefix = line.Get("add-prefix");
  options.model_key = ModelKey(line);
  options.model_only = line.Has("model-only");
  ASSIGN_OR_RETURN(options.max_expanded_bytes, MaxExpandedBytes(line));
  const std::string& in = line.arguments()[0];
  const std::string& out = line.arguments()[1];
  absl::StatusOr<ConvertReport> report = ConvertCheckpoint(in, out, options);
  if (!report.ok()) return report.status();
  if (!report->plain_root.empty()) {
    // No state dict in IN: its root, as it is.
    std::cout << "wrote " << out << " (" << report->format << "): the root, "
              << report->plain_root << " with no model state dict, as it is: " << report->tensors
              << " tensors, " << HumanBytes(report->tensor_bytes) << ", "
              << HumanBytes(report->file_bytes) << " on disk\n";
  } else {
    std::cout << "wrote " << out << " (" << report->format
              << (report->bundle ? ", whole bundle" : "") << "): " << report->tensors
              << " model tensors, " << HumanBytes(report->tensor_bytes) << " of model tensor data, "
              << HumanBytes(report->file_bytes) << " on disk\n";
  }
  if (!report->stripped_prefix.empty()) {
    std::cout << "stripped prefix '" << report->stripped_prefix << "' from every key\n";
  }
  PrintLeftOut(report->left_out);
  for (const std::string& warning : report->warnings) std::cerr << "warning: " << warning << "\n";
  return absl::OkStatus();
}

}  // namespace ckpt
