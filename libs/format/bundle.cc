#include "libs/format/bundle.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

std::string KeyText(const DictKey& key) {
  return key.is_int() ? std::to_string(key.int_key()) : key.string_key();
}

std::string Join(const std::string& path, const std::string& part) {
  return path.empty() ? part : absl::StrCat(path, "/", part);
}

constexpr absl::string_view kNotCode = " (never written back as code)";

std::string Object(const Value& opaque) {
  return absl::StrCat("a ", opaque.opaque_class_name(), " object");
}

// Strips opaque objects inside the dicts of `sequence`; returns the path and object of the first
// opaque item found in `sequence` itself (or in a sequence nested in it), which the enclosing
// dict entry must then go for, since dropping an item would shift every index after it.
std::optional<std::pair<std::string, const Value*>> StripSequence(
    Value& sequence, const std::string& path, std::vector<std::string>& left_out);

void StripDict(Value& dict, const std::string& path, std::vector<std::string>& left_out) {
  auto& entries = dict.mutable_entries();
  std::vector<Value::Entry> kept;
  kept.reserve(entries.size());
  for (Value::Entry& entry : entries) {
    const std::string entry_path = Join(path, KeyText(entry.first));
    Value& value = entry.second;
    if (value.is_opaque() && PlainObjectKind(value) == PlainObject::kNone) {
      left_out.push_back(absl::StrCat(entry_path, ": ", Object(value), kNotCode));
      continue;
    }
    if (value.is_dict()) {
      StripDict(value, entry_path, left_out);
    } else if (value.is_sequence()) {
      if (auto found = StripSequence(value, entry_path, left_out)) {
        left_out.push_back(absl::StrCat(entry_path, ": holds ", Object(*found->second), " at ",
                                        found->first, kNotCode));
        continue;
      }
    }
    kept.push_back(std::move(entry));
  }
  entries = std::move(kept);
}

std::optional<std::pair<std::string, const Value*>> StripSequence(
    Value& sequence, const std::string& path, std::vector<std::string>& left_out) {
  std::vector<Value>& items = sequence.mutable_items();
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string item_path = Join(path, std::to_string(i));
    Value& item = items[i];
    if (item.is_opaque() && PlainObjectKind(item) == PlainObject::kNone) {
      return std::make_pair(item_path, &item);
    }
    if (item.is_dict()) StripDict(item, item_path, left_out);
    if (item.is_sequence()) {
      if (auto found = StripSequence(item, item_path, left_out)) return found;
    }
  }
  return std::nullopt;
}

DictKey ToDictKey(const v1::PathKey& key) {
  if (key.key_case() == v1::PathKey::kIntKey) return DictKey(key.int_key());
  return DictKey(key.string_key());
}

std::string PathText(const v1::BundleLayout::Placement& placement) {
  std::string text;
  for (const v1::PathKey& key : placement.path()) text = Join(text, KeyText(ToDictKey(key)));
  return text;
}

}  // namespace

bool IsBundleLayout(const v1::BundleLayout& layout) {
  return std::any_of(layout.placements().begin(), layout.placements().end(),
                     [](const v1::BundleLayout::Placement& p) { return p.path_size() > 0; });
}

absl::Status ValidateBundleLayout(const v1::BundleLayout& layout) {
  if (layout.placements().empty()) return absl::OkStatus();
  bool seen[v1::BundleLayout::PART_SCHEDULER + 1] = {};
  for (const v1::BundleLayout::Placement& placement : layout.placements()) {
    const int part = placement.part();
    if (part < v1::BundleLayout::PART_MODEL || part > v1::BundleLayout::PART_SCHEDULER) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle layout: unknown part ", part, " at '", PathText(placement), "'"));
    }
    const std::string& name = v1::BundleLayout::Part_Name(placement.part());
    if (seen[part]) {
      return absl::InvalidArgumentError(absl::StrCat("bundle layout: ", name, " placed twice"));
    }
    seen[part] = true;
    if (placement.position() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle layout: ", name, " at negative position ", placement.position()));
    }
    for (const v1::PathKey& key : placement.path()) {
      if (key.key_case() == v1::PathKey::KEY_NOT_SET) {
        return absl::InvalidArgumentError(
            absl::StrCat("bundle layout: ", name, " path has a step without a key"));
      }
    }
    if (placement.path().empty() &&
        (part != v1::BundleLayout::PART_MODEL || layout.placements_size() > 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle layout: ", name, " at the root is allowed only for a model placed alone"));
    }
  }
  if (!seen[v1::BundleLayout::PART_MODEL]) {
    return absl::InvalidArgumentError("bundle layout: places no model");
  }
  return absl::OkStatus();
}

absl::StatusOr<AssembledBundle> AssembleBundle(const v1::BundleLayout& layout, BundleParts parts) {
  RETURN_IF_ERROR(ValidateBundleLayout(layout));
  if (layout.placements().empty()) {
    return absl::InvalidArgumentError("bundle layout: places no model");
  }
  AssembledBundle result;
  if (parts.model.is_dict()) {
    parts.model = layout.model_plain_dict()
                      ? Value::Dict(std::move(parts.model.mutable_entries()))
                      : Value::OrderedDict(std::move(parts.model.mutable_entries()));
  }
  if (!IsBundleLayout(layout)) {  // the saved object was the state dict itself.
    result.root = std::move(parts.model);
    return result;
  }
  // Placements of the present parts, in position order within their dicts.
  std::vector<const v1::BundleLayout::Placement*> placements;
  for (const v1::BundleLayout::Placement& placement : layout.placements()) {
    if (placement.part() == v1::BundleLayout::PART_OPTIMIZER && !parts.optimizer) continue;
    if (placement.part() == v1::BundleLayout::PART_SCHEDULER && !parts.scheduler) continue;
    placements.push_back(&placement);
  }
  std::stable_sort(placements.begin(), placements.end(),
                   [](const auto* a, const auto* b) { return a->position() < b->position(); });

  result.root = parts.extra.is_none() ? Value::Dict() : std::move(parts.extra);
  if (!result.root.is_dict()) {
    return absl::InvalidArgumentError(
        "bundle layout: the saved object's other fields are not a dict");
  }
  for (const v1::BundleLayout::Placement* placement : placements) {
    Value* dict = &result.root;
    for (int i = 0; i + 1 < placement->path_size(); ++i) {
      dict = dict->FindMutable(ToDictKey(placement->path(i)));
      if (dict == nullptr || !dict->is_dict()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bundle layout: ", v1::BundleLayout::Part_Name(placement->part()), " belongs at '",
            PathText(*placement), "', but the saved object has no dict on that path"));
      }
    }
    Value part;
    const std::string name = PathText(*placement);
    switch (placement->part()) {
      case v1::BundleLayout::PART_MODEL:
        part = std::move(parts.model);
        break;
      case v1::BundleLayout::PART_OPTIMIZER:
        part = std::move(*parts.optimizer);
        break;
      default:
        part = std::move(*parts.scheduler);
        break;
    }
    const DictKey key = ToDictKey(placement->path(placement->path_size() - 1));
    if (dict->Find(key) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle layout: ", name, " is both a part and another field"));
    }
    auto& entries = dict->mutable_entries();
    const size_t at =
        std::min(entries.size(), static_cast<size_t>(std::max(0, placement->position())));
    entries.insert(entries.begin() + static_cast<std::ptrdiff_t>(at),
                   Value::Entry(key, std::move(part)));
  }
  // Opaque objects go last, so that the positions above count them as the producer did, and
  // each is named by where it sits in the saved object.
  StripDict(result.root, "", result.left_out);
  return result;
}

}  // namespace ckpt
