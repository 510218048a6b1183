// ckpt: the command-line tool for checkpoints. Options are parsed here and passed to libs/ as
// plain structs; each command is a thin call into a library.

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/convert.h"
#include "libs/format/inspect.h"
#include "tools/ckpt/command_line.h"

namespace ckpt {
namespace {

constexpr char kDescription[] =
    "Read, convert and version PyTorch checkpoints from C++: torch.save files (zip and legacy,\n"
    "read without running any pickled code), whole pickled models, safetensors.";

const std::vector<cli::OptionSpec>& GlobalOptions() {
  static const auto* options = new std::vector<cli::OptionSpec>{};
  return *options;
}

const std::vector<cli::CommandSpec>& Commands() {
  static const auto* commands = new std::vector<cli::CommandSpec>{
      {"inspect",
       "FILE",
       "Describe a checkpoint: format, tensors (dtype, shape, original device), wrapper prefix, "
       "optimizer / scheduler structure.",
       1,
       1,
       {{"json", "", "print the report as JSON", ""},
        {"key", "PATH", "where the model state dict is, e.g. model or ckpt/state_dict", "auto"}}},
      {"convert",
       "IN OUT",
       "Write IN's model state dict as a clean CPU file (torch .pt or safetensors).",
       2,
       2,
       {{"format", "torch|safetensors", "output format", "from OUT's extension"},
        {"strip-prefix", "auto|none|PREFIX",
         "auto strips wrapper prefixes (module., _orig_mod., FSDP, checkpointing)", "auto"},
        {"add-prefix", "PREFIX", "prefix added to every key after stripping, e.g. module.", ""},
        {"key", "PATH", "where the model state dict is, e.g. model", "auto"}}},
  };
  return *commands;
}

std::string ModelKey(const cli::ParsedCommandLine& line) {
  return line.Has("key") ? line.Get("key") : "";
}

absl::Status RunInspect(const cli::ParsedCommandLine& line) {
  ReadCheckpointOptions options;
  options.model_key = ModelKey(line);
  absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(line.arguments()[0], options);
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
  const std::string& in = line.arguments()[0];
  const std::string& out = line.arguments()[1];
  absl::StatusOr<ConvertReport> report = ConvertCheckpoint(in, out, options);
  if (!report.ok()) return report.status();
  std::cout << "wrote " << out << " (" << report->format << "): " << report->tensors
            << " tensors, " << HumanBytes(report->tensor_bytes) << " of tensor data, "
            << HumanBytes(report->file_bytes) << " on disk\n";
  if (!report->stripped_prefix.empty()) {
    std::cout << "stripped prefix '" << report->stripped_prefix << "' from every key\n";
  }
  if (!report->left_out.empty()) {
    std::cout << "not converted (model weights only): " << absl::StrJoin(report->left_out, ", ")
              << "\n";
  }
  for (const std::string& warning : report->warnings) std::cerr << "warning: " << warning << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<cli::ParsedCommandLine> line =
      cli::ParseCommandLine(Commands(), GlobalOptions(), args);
  if (!line.ok()) {
    std::cerr << "ckpt: " << line.status().message() << "\n";
    return 2;
  }
  if (line->command().empty()) {
    std::cout << cli::ProgramHelp("ckpt", kDescription, Commands(), GlobalOptions());
    return line->help_requested() ? 0 : 2;
  }
  for (const cli::CommandSpec& command : Commands()) {
    if (command.name == line->command() && line->help_requested()) {
      std::cout << cli::CommandHelp("ckpt", command, GlobalOptions());
      return 0;
    }
  }
  absl::Status status;
  if (line->command() == "inspect") {
    status = RunInspect(*line);
  } else if (line->command() == "convert") {
    status = RunConvert(*line);
  }
  if (!status.ok()) {
    std::cerr << "ckpt " << line->command() << ": " << absl::StatusCodeToString(status.code())
              << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
