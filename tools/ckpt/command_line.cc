#include "tools/ckpt/command_line.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::cli {
namespace {

const OptionSpec* FindOption(const std::vector<OptionSpec>& options, absl::string_view name) {
  for (const OptionSpec& option : options) {
    if (option.name == name) return &option;
  }
  return nullptr;
}

std::string OptionLine(const OptionSpec& option) {
  std::string left = absl::StrCat("  --", option.name);
  if (!option.value_name.empty()) absl::StrAppend(&left, " ", option.value_name);
  std::string line = left;
  line.append(left.size() < 34 ? 34 - left.size() : 1, ' ');
  absl::StrAppend(&line, option.help);
  if (!option.default_value.empty())
    absl::StrAppend(&line, " (default: ", option.default_value, ")");
  if (option.repeatable) absl::StrAppend(&line, " (repeatable)");
  return line + "\n";
}

}  // namespace

bool ParsedCommandLine::Has(absl::string_view name) const {
  return values_.find(name) != values_.end();
}

std::string ParsedCommandLine::Get(absl::string_view name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return "";
}

std::vector<std::string> ParsedCommandLine::GetAll(absl::string_view name) const {
  if (auto it = all_values_.find(name); it != all_values_.end()) return it->second;
  return {};
}

absl::StatusOr<int64_t> ParsedCommandLine::GetInt(absl::string_view name) const {
  const std::string text = Get(name);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " expects an integer, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<CommandSpec>& commands,
                                                   const std::vector<OptionSpec>& global_options,
                                                   const std::vector<std::string>& args) {
  ParsedCommandLine parsed;
  const CommandSpec* command = nullptr;
  for (const OptionSpec& option : global_options) {
    parsed.defaults_[option.name] = option.default_value;
  }
  bool options_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!options_ended && arg == "--") {
      options_ended = true;
      continue;
    }
    if (!options_ended && (arg == "--help" || arg == "-h")) {
      parsed.help_ = true;
      continue;
    }
    if (!options_ended && absl::StartsWith(arg, "--")) {
      std::string name = arg.substr(2);
      std::string value;
      bool has_inline_value = false;
      if (const size_t equals = name.find('='); equals != std::string::npos) {
        value = name.substr(equals + 1);
        name = name.substr(0, equals);
        has_inline_value = true;
      }
      const OptionSpec* option = command != nullptr ? FindOption(command->options, name) : nullptr;
      if (option == nullptr) option = FindOption(global_options, name);
      if (option == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown option --", name,
            command != nullptr ? absl::StrCat(" for '", command->name, "'") : std::string(),
            "; see --help"));
      }
      if (option->value_name.empty()) {
        if (has_inline_value && value != "true" && value != "false") {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " is a switch; it takes no value (got '", value, "')"));
        }
        if (!has_inline_value || value == "true") parsed.values_[name] = "true";
        continue;
      }
      if (!has_inline_value) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value: --", name, " ", option->value_name));
        }
        value = args[++i];
      }
      parsed.values_[name] = value;
      parsed.all_values_[name].push_back(value);
      continue;
    }
    if (command == nullptr) {
      for (const CommandSpec& candidate : commands) {
        if (candidate.name == arg) command = &candidate;
      }
      if (command == nullptr) {
        std::vector<std::string> names;
        for (const CommandSpec& candidate : commands) names.push_back(candidate.name);
        return absl::InvalidArgumentError(
            absl::StrCat("unknown command '", arg, "'; commands: ", absl::StrJoin(names, ", ")));
      }
      parsed.command_ = command->name;
      for (const OptionSpec& option : command->options) {
        parsed.defaults_[option.name] = option.default_value;
      }
      continue;
    }
    parsed.arguments_.push_back(arg);
  }
  if (command != nullptr && !parsed.help_) {
    const int count = static_cast<int>(parsed.arguments_.size());
    if (count < command->min_arguments ||
        (command->max_arguments >= 0 && count > command->max_arguments)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", command->name, "' takes ",
                       command->arguments.empty() ? "no arguments" : command->arguments, ", got ",
                       count, " argument(s); see ckpt ", command->name, " --help"));
    }
  }
  // Options given before the command was known may belong to it: re-check them now.
  for (const auto& [name, value] : parsed.values_) {
    const bool known = FindOption(global_options, name) != nullptr ||
                       (command != nullptr && FindOption(command->options, name) != nullptr);
    if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
  }
  return parsed;
}

std::string ProgramHelp(absl::string_view program, absl::string_view description,
                        const std::vector<CommandSpec>& commands,
                        const std::vector<OptionSpec>& global_options) {
  std::string help = absl::StrCat("Usage: ", program, " COMMAND [ARGS] [OPTIONS]\n\n", description,
                                  "\n\nCommands:\n");
  for (const CommandSpec& command : commands) {
    std::string left = absl::StrCat("  ", command.name, " ", command.arguments);
    left.append(left.size() < 34 ? 34 - left.size() : 1, ' ');
    absl::StrAppend(&help, left, command.summary, "\n");
  }
  if (!global_options.empty()) {
    absl::StrAppend(&help, "\nGlobal options:\n");
    for (const OptionSpec& option : global_options) absl::StrAppend(&help, OptionLine(option));
  }
  absl::StrAppend(&help, "\nRun '", program, " COMMAND --help' for a command's options.\n");
  return help;
}

std::string CommandHelp(absl::string_view program, const CommandSpec& command,
                        const std::vector<OptionSpec>& global_options) {
  std::string help = absl::StrCat("Usage: ", program, " ", command.name, " ", command.arguments,
                                  " [OPTIONS]\n\n", command.summary, "\n");
  if (!command.details.empty()) absl::StrAppend(&help, "\n", command.details);
  if (!command.options.empty()) {
    absl::StrAppend(&help, "\nOptions:\n");
    for (const OptionSpec& option : command.options) absl::StrAppend(&help, OptionLine(option));
  }
  if (!global_options.empty()) {
    absl::StrAppend(&help, "\nGlobal options:\n");
    for (const OptionSpec& option : global_options) absl::StrAppend(&help, OptionLine(option));
  }
  return help;
}

}  // namespace ckpt::cli
