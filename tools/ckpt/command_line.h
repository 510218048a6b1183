#ifndef CKPT_TOOLS_CKPT_COMMAND_LINE_H_
#define CKPT_TOOLS_CKPT_COMMAND_LINE_H_

// A small declarative parser for `ckpt COMMAND [ARGS] [--options]`: git-style subcommands with
// GNU-style long options (`--strip-prefix auto`, `--strip-prefix=auto`, `--json`), global options
// accepted before or after the command, `--` ending options, and generated help text.
// Abseil flags cannot name options with hyphens or scope them per command, hence this.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::cli {

struct OptionSpec {
  std::string name;        // "strip-prefix": used as --strip-prefix.
  std::string value_name;  // "auto|none|PREFIX"; empty for a boolean switch.
  std::string help;        // One line: meaning, unit, default.
  std::string default_value;
  // May be given more than once (`--tag a=1 --tag b=2`); GetAll returns every value. Other
  // options keep the last value given.
  bool repeatable = false;
};

struct CommandSpec {
  std::string name;       // "convert".
  std::string arguments;  // "IN OUT", for the usage line.
  std::string summary;    // One line.
  int min_arguments = 0;
  int max_arguments = 0;  // -1: any number.
  std::vector<OptionSpec> options;
  // Lines that `COMMAND --help` prints after the summary (what the summary cannot say in one
  // line: when the command does less than it seems to); empty for most commands.
  std::string details;
};

class ParsedCommandLine {
 public:
  const std::string& command() const { return command_; }
  const std::vector<std::string>& arguments() const { return arguments_; }
  bool help_requested() const { return help_; }

  // Whether the option was given (or is a switch that was set).
  bool Has(absl::string_view name) const;
  // The given value, else the spec's default.
  std::string Get(absl::string_view name) const;
  // Every value given, in order (a repeatable option); empty when none was.
  std::vector<std::string> GetAll(absl::string_view name) const;
  // INVALID_ARGUMENT naming the option when the value is not an integer.
  absl::StatusOr<int64_t> GetInt(absl::string_view name) const;

 private:
  friend absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<CommandSpec>&,
                                                            const std::vector<OptionSpec>&,
                                                            const std::vector<std::string>&);
  std::string command_;
  std::vector<std::string> arguments_;
  std::map<std::string, std::string, std::less<>> values_;
  std::map<std::string, std::vector<std::string>, std::less<>> all_values_;
  std::map<std::string, std::string, std::less<>> defaults_;
  bool help_ = false;
};

// Parses `args` (argv without the program name). INVALID_ARGUMENT with a helpful message for an
// unknown command or option, a missing option value, or a wrong number of arguments. `--help`
// or `-h` anywhere sets help_requested() and skips the argument-count check; with no command,
// command() is empty.
absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<CommandSpec>& commands,
                                                   const std::vector<OptionSpec>& global_options,
                                                   const std::vector<std::string>& args);

// `ckpt --help`: every command with its summary, and the global options.
std::string ProgramHelp(absl::string_view program, absl::string_view description,
                        const std::vector<CommandSpec>& commands,
                        const std::vector<OptionSpec>& global_options);

// `ckpt COMMAND --help`: usage line, summary, the command's options, the global options.
std::string CommandHelp(absl::string_view program, const CommandSpec& command,
                        const std::vector<OptionSpec>& global_options);

}  // namespace ckpt::cli

#endif  // CKPT_TOOLS_CKPT_COMMAND_LINE_H_
