#include "libs/format/module_state.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

constexpr const char* kModelKeys[] = {"model",  "state_dict", "model_state_dict", "model_state",
                                      "module", "net",        "network",          "weights"};
constexpr const char* kOptimizerKeys[] = {"optimizer", "optim", "optimizer_state_dict",
                                          "optimizer_state", "optimizer_states"};
constexpr const char* kSchedulerKeys[] = {"scheduler", "lr_scheduler", "scheduler_state_dict",
                                          "lr_schedulers"};
constexpr const char* kEpochKeys[] = {"epoch"};
constexpr const char* kStepKeys[] = {"step", "global_step", "iteration"};
// Deepest module nesting walked (a pickle nests at most 512 Values, three per module level).
constexpr int kMaxModuleDepth = 256;
// How far below the root (or a model key) the model may sit.
constexpr int kMaxSearchDepth = 3;

template <size_t N>
bool IsOneOf(const DictKey& key, const char* const (&names)[N]) {
  if (key.is_int()) return false;
  return std::any_of(std::begin(names), std::end(names),
                     [&](const char* name) { return key.string_key() == name; });
}

const Value* ModuleDict(const Value& module) {
  if (!module.is_opaque()) return nullptr;
  const Value& state = module.opaque_state();
  if (state.is_dict()) return &state;
  // A class with __slots__ pickles (dict, slots).
  if (state.is_tuple() && !state.items().empty() && state.items()[0].is_dict()) {
    return &state.items()[0];
  }
  return nullptr;
}

absl::Status WalkModule(const Value& module, const std::string& prefix, int depth, StateDict& out,
                        std::vector<std::string>* warnings) {
  const std::string where =
      prefix.empty() ? "the root module" : absl::StrCat("module '", prefix, "'");
  if (depth > kMaxModuleDepth) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": modules nest too deeply"));
  }
  const Value* attributes = ModuleDict(module);
  if (attributes == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a module object: ", module.DebugString().substr(0, 120)));
  }
  const Value* parameters = attributes->Find("_parameters");
  const Value* buffers = attributes->Find("_buffers");
  const Value* modules = attributes->Find("_modules");
  if (parameters == nullptr || buffers == nullptr || modules == nullptr || !parameters->is_dict() ||
      !buffers->is_dict() || !modules->is_dict()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", module.opaque_class_name(),
                     ") lacks _parameters / _buffers / _modules dicts"));
  }
  absl::flat_hash_set<std::string> non_persistent;
  if (const Value* names = attributes->Find("_non_persistent_buffers_set")) {
    if (names->is_sequence()) {
      for (const Value& name : names->items()) {
        if (name.is_string()) non_persistent.insert(name.string_value());
      }
    }
  }
  if (warnings != nullptr) {
    const Value* hooks = attributes->Find("_state_dict_hooks");
    if (hooks != nullptr && hooks->is_dict() && !hooks->entries().empty()) {
      warnings->push_back(absl::StrCat(where, " (", module.opaque_class_name(), ") has ",
                                       hooks->entries().size(),
                                       " state_dict hook(s), which were not run"));
    }
  }
  auto add = [&](const Value* dict, const char* what, bool skip_non_persistent) -> absl::Status {
    for (const auto& [key, value] : dict->entries()) {
      if (key.is_int()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", what, " key ", key.DebugString(), " is not a str"));
      }
      if (value.is_none()) continue;
      if (skip_non_persistent && non_persistent.contains(key.string_key())) continue;
      const std::string name = prefix + key.string_key();
      if (!value.is_tensor()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " '", name, "' is not a tensor: ", value.DebugString().substr(0, 120)));
      }
      // state_dict() returns detached tensors: same storage, no autograd.
      RETURN_IF_ERROR(out.Insert(name, value.tensor().detach(), value.tensor_original_device()));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(add(parameters, "parameter", false));
  RETURN_IF_ERROR(add(buffers, "buffer", true));
  for (const auto& [key, child] : modules->entries()) {
    if (child.is_none()) continue;
    if (key.is_int()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": submodule key ", key.DebugString(), " is not a str"));
    }
    RETURN_IF_ERROR(
        WalkModule(child, absl::StrCat(prefix, key.string_key(), "."), depth + 1, out, warnings));
  }
  return absl::OkStatus();
}

// Where the model was found: the path of dict keys and the dict holding it.
struct ModelLocation {
  std::vector<DictKey> path;
  const Value* value = nullptr;
  const Value* parent = nullptr;
};

bool IsModel(const Value& value) { return IsTensorDict(value) || IsModuleObject(value); }

// An optimizer's state_dict(): its per-parameter `state` entries are dicts of tensors too, but
// never a model.
bool IsOptimizerState(const Value& value) {
  return value.is_dict() && value.Find("param_groups") != nullptr;
}

std::optional<ModelLocation> FindModel(const Value& value, int depth) {
  if (IsModel(value)) return ModelLocation{{}, &value, nullptr};
  if (!value.is_dict() || depth >= kMaxSearchDepth || IsOptimizerState(value)) {
    return std::nullopt;
  }
  auto descend = [&](const DictKey& key, const Value& child) -> std::optional<ModelLocation> {
    std::optional<ModelLocation> found = FindModel(child, depth + 1);
    if (!found.has_value()) return std::nullopt;
    found->path.insert(found->path.begin(), key);
    if (found->parent == nullptr) found->parent = &value;
    return found;
  };
  for (const char* name : kModelKeys) {
    if (const Value* child = value.Find(name)) {
      if (auto found = descend(name, *child)) return found;
    }
  }
  for (const auto& [key, child] : value.entries()) {
    if (key.is_int() || IsOneOf(key, kModelKeys) || IsOneOf(key, kOptimizerKeys) ||
        IsOneOf(key, kSchedulerKeys)) {
      continue;
    }
    if (!child.is_dict() && !child.is_opaque()) continue;
    if (auto found = descend(key, child)) return found;
  }
  return std::nullopt;
}

// An epoch / step number: an int, an integral float, or a one-element integer tensor.
std::optional<int64_t> AsCount(const Value& value) {
  if (value.is_int()) return value.int_value();
  if (value.is_float() && std::isfinite(value.float_value()) &&
      value.float_value() == std::floor(value.float_value()) &&
      std::abs(value.float_value()) < 9e18) {
    return static_cast<int64_t>(value.float_value());
  }
  if (value.is_tensor() && value.tensor().defined() && value.tensor().numel() == 1 &&
      at::isIntegralType(value.tensor().scalar_type(), /*includeBool=*/false) &&
      !value.tensor().is_quantized()) {
    return value.tensor().item<int64_t>();
  }
  return std::nullopt;
}

// Removes `key` from the dict reached by `path` under `root` (a copy the caller owns).
void RemoveAt(Value& root, const std::vector<DictKey>& path, const DictKey& key) {
  Value* dict = &root;
  for (const DictKey& part : path) {
    dict = dict->is_dict() ? dict->FindMutable(part) : nullptr;
    if (dict == nullptr) return;
  }
  if (!dict->is_dict()) return;
  auto& entries = dict->mutable_entries();
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [&](const Value::Entry& e) { return e.first == key; }),
                entries.end());
}

// Index of `key` among `dict`'s entries (-1 when absent).
int PositionOf(const Value& dict, const DictKey& key) {
  if (!dict.is_dict()) return -1;
  const auto& entries = dict.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) return static_cast<int>(i);
  }
  return -1;
}

void Place(v1::BundleLayout& layout, v1::BundleLayout::Part part, const std::vector<DictKey>& path,
           int position) {
  v1::BundleLayout::Placement* placement = layout.add_placements();
  placement->set_part(part);
  for (const DictKey& key : path) {
    v1::PathKey* step = placement->add_path();
    if (key.is_int()) {
      step->set_int_key(key.int_key());
    } else {
      step->set_string_key(key.string_key());
    }
  }
  placement->set_position(position);
}

std::string JoinPath(const std::vector<DictKey>& path) {
  std::vector<std::string> parts;
  for (const DictKey& key : path) {
    parts.push_back(key.is_int() ? std::to_string(key.int_key()) : key.string_key());
  }
  return absl::StrJoin(parts, "/");
}

}  // namespace

std::string UnstoredTensorKind(const Value& value) {
  if (!value.is_opaque()) return "";
  const std::string& name = value.opaque_class_name();
  // Sparse tensors are rebuilt (libs/tensor/sparse_layout.h); these stay opaque only when a part
  // is of a dtype LibTorch 1.13 lacks.
  if (name == "torch._utils._rebuild_sparse_tensor" ||
      name == "torch._utils._rebuild_sparse_csr_tensor") {
    return "a sparse tensor of a dtype LibTorch 1.13 cannot hold";
  }
  if (name == "torch._utils._rebuild_meta_tensor_no_storage") {
    return "a meta tensor: shape only, no bytes";
  }
  return "";
}

RootDescription DescribeRoot(const Value& root) {
  RootDescription description;
  if (root.is_tensor()) {
    description.kind = "a tensor";
  } else if (root.is_sequence()) {
    description.kind = absl::StrCat("a ", root.is_list() ? "list" : "tuple", " of ",
                                    root.items().size(), " items");
  } else if (root.is_dict()) {
    description.kind = absl::StrCat("a dict of ", root.entries().size(), " entries");
  } else if (std::string unstored = UnstoredTensorKind(root); !unstored.empty()) {
    description.kind = unstored;
    description.unstored.emplace_back("<root>", std::move(unstored));
  } else {
    description.kind = "a plain value";
  }
  const auto note = [&](std::string path, const Value& value) {
    std::string what = UnstoredTensorKind(value);
    if (!what.empty()) description.unstored.emplace_back(std::move(path), std::move(what));
  };
  if (root.is_dict()) {
    for (const auto& [key, value] : root.entries()) {
      note(key.is_int() ? std::to_string(key.int_key()) : key.string_key(), value);
    }
  } else if (root.is_sequence()) {
    for (size_t i = 0; i < root.items().size(); ++i) note(std::to_string(i), root.items()[i]);
  }
  return description;
}

bool IsModuleObject(const Value& value) {
  const Value* attributes = ModuleDict(value);
  return attributes != nullptr && attributes->Find("_parameters") != nullptr &&
         attributes->Find("_buffers") != nullptr && attributes->Find("_modules") != nullptr;
}

bool IsTensorDict(const Value& value) {
  if (!value.is_dict() || value.entries().empty()) return false;
  return std::all_of(value.entries().begin(), value.entries().end(), [](const Value::Entry& e) {
    return !e.first.is_int() && e.second.is_tensor();
  });
}

absl::StatusOr<StateDict> StateDictFromModule(const Value& module,
                                              std::vector<std::string>* warnings) {
  StateDict out;
  RETURN_IF_ERROR(WalkModule(module, "", 0, out, warnings));
  return out;
}

absl::StatusOr<StateDict> StateDictFromTensorDict(const Value& dict) {
  if (!dict.is_dict()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a dict of tensors, found ", dict.DebugString().substr(0, 120)));
  }
  StateDict out;
  for (const auto& [key, value] : dict.entries()) {
    if (key.is_int()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict key ", key.DebugString(), " is not a str"));
    }
    if (!value.is_tensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict entry '", key.string_key(),
                       "' is not a tensor: ", value.DebugString().substr(0, 120)));
    }
    RETURN_IF_ERROR(out.Insert(key.string_key(), value.tensor(), value.tensor_original_device()));
  }
  return out;
}

absl::StatusOr<CheckpointBundle> ExtractCheckpointBundle(const Value& root) {
  std::optional<ModelLocation> location = FindModel(root, 0);
  if (!location.has_value()) {
    bool unstored_layout = false;
    std::string described;
    if (root.is_dict()) {
      std::vector<std::string> keys;
      for (const auto& [key, value] : root.entries()) {
        const std::string kind = UnstoredTensorKind(value);
        unstored_layout |= !kind.empty();
        keys.push_back(kind.empty() ? key.DebugString()
                                    : absl::StrCat(key.DebugString(), " (", kind, ")"));
      }
      described = absl::StrCat("a dict with keys ", absl::StrJoin(keys, ", "));
    } else if (const std::string kind = UnstoredTensorKind(root); !kind.empty()) {
      unstored_layout = true;
      described = kind;
    } else {
      described = root.DebugString().substr(0, 120);
    }
    return absl::NotFoundError(absl::StrCat(
        "no model state dict in the checkpoint (", described,
        "): looked for a dict of tensors or a pickled nn.Module at the root or under 'model', "
        "'state_dict', 'model_state_dict', 'module', 'net', 'weights'",
        unstored_layout
            ? "; ckpt stores tensors with their bytes: give meta tensors real storage before "
              "saving"
            : "",
        root.is_list() || root.is_tuple() || root.is_dict()
            ? "; --key PATH names the state dict inside it (a list's items by index: --key 0)"
            : ""));
  }
  CheckpointBundle bundle;
  if (IsModuleObject(*location->value)) {
    ASSIGN_OR_RETURN(bundle.model, StateDictFromModule(*location->value, &bundle.warnings));
  } else {
    ASSIGN_OR_RETURN(bundle.model, StateDictFromTensorDict(*location->value));
  }
  bundle.model_key_path = JoinPath(location->path);
  bundle.layout.set_model_plain_dict(location->value->is_dict() &&
                                     !location->value->is_ordered_dict());
  if (!root.is_dict() || location->path.empty()) {
    Place(bundle.layout, v1::BundleLayout::PART_MODEL, {}, 0);
    return bundle;
  }

  bundle.extra = root;
  std::vector<DictKey> parent_path(location->path.begin(), location->path.end() - 1);
  Place(bundle.layout, v1::BundleLayout::PART_MODEL, location->path,
        PositionOf(*location->parent, location->path.back()));
  RemoveAt(bundle.extra, parent_path, location->path.back());

  // The dicts the other parts are looked for in: the root, then the model's parent.
  std::vector<std::pair<const Value*, std::vector<DictKey>>> places = {{&root, {}}};
  if (location->parent != nullptr && location->parent != &root) {
    places.push_back({location->parent, parent_path});
  }
  // Takes the first of `names` found out of `extra`, recording where it sat in the layout.
  auto take = [&](const auto& names, v1::BundleLayout::Part part) -> std::optional<Value> {
    for (const auto& [dict, path] : places) {
      for (const char* name : names) {
        if (const Value* found = dict->Find(name)) {
          std::vector<DictKey> full_path = path;
          full_path.push_back(name);
          Place(bundle.layout, part, full_path, PositionOf(*dict, name));
          RemoveAt(bundle.extra, path, name);
          return *found;
        }
      }
    }
    return std::nullopt;
  };
  bundle.optimizer = take(kOptimizerKeys, v1::BundleLayout::PART_OPTIMIZER);
  bundle.scheduler = take(kSchedulerKeys, v1::BundleLayout::PART_SCHEDULER);
  // Epoch and step are read, not taken: they stay in `extra` exactly as saved (an int, a
  // float, a tensor), so that writing the bundle back gives the producer's value and type.
  auto find_count = [&](const auto& names) -> int64_t {
    for (const auto& [dict, path] : places) {
      for (const char* name : names) {
        const Value* found = dict->Find(name);
        if (found == nullptr) continue;
        if (std::optional<int64_t> count = AsCount(*found)) return *count;
      }
    }
    return -1;
  };
  bundle.epoch = find_count(kEpochKeys);
  bundle.step = find_count(kStepKeys);
  return bundle;
}

}  // namespace ckpt
