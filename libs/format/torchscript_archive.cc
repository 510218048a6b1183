#include "libs/format/torchscript_archive.h"

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// Module nesting deeper than this is refused rather than recursed into (a ResNet-152 is 4 deep;
// a crafted pickle could be thousands).
constexpr int kMaxModuleDepth = 200;

// `["weight", "bias", ]` -> {weight, bias}.
absl::StatusOr<std::vector<std::string>> ParseNameList(absl::string_view list,
                                                       absl::string_view where) {
  list = absl::StripAsciiWhitespace(list);
  if (!absl::ConsumePrefix(&list, "[") || !absl::ConsumeSuffix(&list, "]")) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a list of names in [...], found '", list, "'"));
  }
  std::vector<std::string> names;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;  // the trailing ", " TorchScript prints
    if (item.size() < 2 || (item.front() != '"' && item.front() != '\'') ||
        item.back() != item.front()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected a quoted name, found '", item, "'"));
    }
    names.emplace_back(item.substr(1, item.size() - 2));
  }
  return names;
}

absl::Status AddEntries(const Value& module, const std::string& prefix,
                        const TorchScriptClasses& classes, int depth,
                        std::vector<Value::Entry>* out) {
  const std::string where =
      prefix.empty() ? std::string("the module")
                     : absl::StrCat("module '", prefix.substr(0, prefix.size() - 1), "'");
  if (depth > kMaxModuleDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": modules nested more than ", kMaxModuleDepth, " deep"));
  }
  if (!module.is_opaque()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not a TorchScript object but ",
                                                   module.DebugString().substr(0, 80)));
  }
  auto found = classes.find(module.opaque_class_name());
  if (found == classes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is of class ", module.opaque_class_name(),
                     ", which the archive's code/ does not declare as a module"));
  }
  const Value& attributes = module.opaque_state();
  if (!attributes.is_dict()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", module.opaque_class_name(), ") has no attribute dict"));
  }
  for (const std::vector<std::string>* names :
       {&found->second.parameters, &found->second.buffers}) {
    for (const std::string& name : *names) {
      const Value* value = attributes.Find(name);
      if (value == nullptr || value->is_none()) continue;  // e.g. bias=False
      if (!value->is_tensor()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": '", name, "' is declared a parameter or buffer but is ",
                         value->DebugString().substr(0, 80)));
      }
      // Detached, as state_dict() gives them (a parameter's requires_grad is not kept).
      out->emplace_back(absl::StrCat(prefix, name),
                        Value::Tensor(value->tensor().detach(), value->tensor_original_device()));
    }
  }
  for (const Value::Entry& entry : attributes.entries()) {
    if (entry.first.is_int() || !entry.second.is_opaque() ||
        classes.count(entry.second.opaque_class_name()) == 0) {
      continue;
    }
    RETURN_IF_ERROR(AddEntries(entry.second, absl::StrCat(prefix, entry.first.string_key(), "."),
                               classes, depth + 1, out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AddTorchScriptClasses(absl::string_view path, absl::string_view text,
                                   TorchScriptClasses* classes) {
  absl::string_view module_path = path;
  if (!absl::ConsumePrefix(&module_path, "code/") || !absl::ConsumeSuffix(&module_path, ".py")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a TorchScript source (code/....py)"));
  }
  const std::string qualifier = absl::StrReplaceAll(module_path, {{"/", "."}});
  std::string current;  // the class whose body the lines are in; empty outside one.
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (absl::ConsumePrefix(&line, "class ")) {
      const size_t end = line.find_first_of("(:");
      current = absl::StrCat(qualifier, ".", absl::StripAsciiWhitespace(line.substr(0, end)));
      continue;
    }
    if (!line.empty() && line.front() != ' ') current.clear();
    if (current.empty()) continue;
    line = absl::StripLeadingAsciiWhitespace(line);
    for (const auto& [field, is_parameters] :
         {std::pair{"__parameters__", true}, std::pair{"__buffers__", false}}) {
      absl::string_view rest = line;
      if (!absl::ConsumePrefix(&rest, field)) continue;
      rest = absl::StripLeadingAsciiWhitespace(rest);
      if (!absl::ConsumePrefix(&rest, "=")) continue;
      ASSIGN_OR_RETURN(std::vector<std::string> names,
                       ParseNameList(rest, absl::StrCat(path, ":", line_number)));
      TorchScriptClass& cls = (*classes)[current];
      (is_parameters ? cls.parameters : cls.buffers) = std::move(names);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> TorchScriptStateDict(const Value& module, const TorchScriptClasses& classes,
                                           const std::vector<std::string>* keys) {
  std::vector<Value::Entry> entries;
  RETURN_IF_ERROR(AddEntries(module, "", classes, 0, &entries));
  if (keys == nullptr) return Value::OrderedDict(std::move(entries));
  const std::set<std::string> wanted(keys->begin(), keys->end());
  std::set<std::string> present;
  std::vector<Value::Entry> kept;
  for (Value::Entry& entry : entries) {
    present.insert(entry.first.string_key());
    if (wanted.count(entry.first.string_key()) != 0) kept.push_back(std::move(entry));
  }
  for (const std::string& key : *keys) {
    if (present.count(key) == 0) {
      return absl::NotFoundError(
          absl::StrCat("state_dict_keys.txt names '", key,
                       "', which the module has no parameter or buffer for"));
    }
  }
  return Value::OrderedDict(std::move(kept));
}

}  // namespace ckpt
