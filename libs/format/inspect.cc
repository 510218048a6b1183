#include "libs/format/inspect.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/format/module_state.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/key_normalization.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {
namespace {

using Json = nlohmann::ordered_json;

std::string DTypeOf(const at::Tensor& tensor) {
  absl::StatusOr<DType> dtype = FromScalarType(tensor.scalar_type());
  return dtype.ok() ? std::string(DTypeName(*dtype))
                    : std::string(c10::toString(tensor.scalar_type()));
}

std::string ShapeOf(const at::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.sizes(), ", "), "]");
}

// A tensor's JSON entry fields: dtype, shape, bytes (for a sparse tensor its parts' bytes, as
// stored) and, for a sparse tensor only, its layout.
void DescribeInto(const at::Tensor& tensor, Json& entry) {
  entry["dtype"] = DTypeOf(tensor);
  entry["shape"] = tensor.sizes().vec();
  entry["bytes"] = StoredByteCount(tensor);
  if (!IsSparseTensor(tensor)) return;
  absl::StatusOr<SparseParts> sparse = SparsePartsOf(tensor);
  entry["layout"] = sparse.ok() ? sparse->layout_name : "sparse";
}

// The SHAPE column of the text: "[3, 4]", or "[3, 4] sparse_coo".
std::string ShapeColumn(const Json& entry) {
  std::string shape =
      absl::StrCat("[", absl::StrJoin(entry["shape"].get<std::vector<int64_t>>(), ", "), "]");
  if (entry.contains("layout")) absl::StrAppend(&shape, " ", entry["layout"].get<std::string>());
  return shape;
}

// Scalars as JSON values, tensors as "tensor(float32[3, 4])", containers recursively (long ones
// cut to their first items).
Json Summarize(const Value& value, int depth = 0) {
  constexpr size_t kMaxItems = 16;
  switch (value.kind()) {
    case Value::Kind::kNone:
      return nullptr;
    case Value::Kind::kBool:
      return value.bool_value();
    case Value::Kind::kInt:
      return value.int_value();
    case Value::Kind::kFloat:
      return value.float_value();
    case Value::Kind::kString:
      return value.string_value();
    case Value::Kind::kBytes:
      return absl::StrCat("<", value.string_value().size(), " bytes>");
    case Value::Kind::kTensor:
      return absl::StrCat("tensor(", DTypeOf(value.tensor()), ShapeOf(value.tensor()), ")");
    case Value::Kind::kOpaque:
      return absl::StrCat("<object ", value.opaque_class_name(), ">");
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (depth > 4) return "[...]";
      Json items = Json::array();
      for (size_t i = 0; i < value.items().size() && i < kMaxItems; ++i) {
        items.push_back(Summarize(value.items()[i], depth + 1));
      }
      if (value.items().size() > kMaxItems) {
        items.push_back(absl::StrCat("... ", value.items().size() - kMaxItems, " more"));
      }
      return items;
    }
    case Value::Kind::kDict: {
      if (depth > 4) return "{...}";
      Json object = Json::object();
      size_t shown = 0;
      for (const auto& [key, child] : value.entries()) {
        if (shown++ == kMaxItems) {
          object["..."] = absl::StrCat(value.entries().size() - kMaxItems, " more");
          break;
        }
        object[key.is_int() ? std::to_string(key.int_key()) : key.string_key()] =
            Summarize(child, depth + 1);
      }
      return object;
    }
  }
  return nullptr;
}

Json InspectOptimizer(const Value& optimizer) {
  Json report = Json::object();
  const Value* state = optimizer.is_dict() ? optimizer.Find("state") : nullptr;
  const Value* groups = optimizer.is_dict() ? optimizer.Find("param_groups") : nullptr;
  if (state == nullptr || groups == nullptr || !state->is_dict() || !groups->is_sequence()) {
    report["unrecognized"] = Summarize(optimizer);
    return report;
  }
  int64_t state_bytes = 0;
  std::set<std::string> fields;
  for (const auto& [index, param_state] : state->entries()) {
    if (!param_state.is_dict()) continue;
    for (const auto& [field, value] : param_state.entries()) {
      if (!field.is_int()) fields.insert(field.string_key());
    }
  }
  optimizer.ForEachTensor(
      [&](const std::string&, const at::Tensor& tensor) { state_bytes += StoredByteCount(tensor); });
  Json group_reports = Json::array();
  for (const Value& group : groups->items()) {
    Json group_report = Json::object();
    if (group.is_dict()) {
      for (const auto& [key, value] : group.entries()) {
        if (key.is_int()) continue;
        if (key.string_key() == "params" && value.is_sequence()) {
          group_report["params"] = value.items().size();
        } else {
          group_report[key.string_key()] = Summarize(value);
        }
      }
    }
    group_reports.push_back(std::move(group_report));
  }
  report["param_groups"] = std::move(group_reports);
  report["state_entries"] = state->entries().size();
  report["state_fields"] = fields;
  report["state_tensor_bytes"] = state_bytes;
  return report;
}

std::string ScalarText(const Json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, units[unit]);
}

// A root that holds no model state dict: what it is, every tensor in it by path, and what it
// holds that ckpt does not store (meta tensors).
Json InspectRoot(const Value& root) {
  const RootDescription description = DescribeRoot(root);
  Json report = Json::object();
  report["kind"] = description.kind;
  Json tensors = Json::array();
  root.ForEachTensor([&](const std::string& path, const at::Tensor& tensor) {
    Json entry = {{"path", path.empty() ? "<root>" : path}};
    DescribeInto(tensor, entry);
    tensors.push_back(std::move(entry));
  });
  report["tensors"] = std::move(tensors);
  Json unstored = Json::array();
  for (const auto& [path, kind] : description.unstored) {
    unstored.push_back({{"path", path}, {"kind", kind}});
  }
  report["unstored"] = std::move(unstored);
  report["summary"] = Summarize(root);
  return report;
}

Json InspectCheckpoint(const CheckpointFile& file) {
  Json report = Json::object();
  report["file"] = file.path;
  report["format"] = std::string(CheckpointFormatName(file.format));
  report["file_bytes"] = file.file_bytes;
  if (!file.has_model) {
    report["model"] = nullptr;
    report["root"] = InspectRoot(file.root);
    report["warnings"] = file.warnings;
    return report;
  }

  const StateDict& model = file.bundle.model;
  Json model_report = Json::object();
  model_report["key_path"] = file.bundle.model_key_path;
  model_report["tensors"] = model.size();
  model_report["bytes"] = model.TotalBytes();
  absl::StatusOr<NormalizedKeys> normalized = NormalizeKeys(model.keys());
  if (normalized.ok()) {
    model_report["wrapper_prefix"] = normalized->normalization.stripped_prefix;
    model_report["wrappers"] = normalized->normalization.wrappers;
    model_report["inner_wrapper_keys"] = normalized->normalization.inner_renames.size();
  } else {
    model_report["normalization_error"] = std::string(normalized.status().message());
  }
  std::map<std::string, int64_t> devices, dtypes;
  Json entries = Json::array();
  for (const StateDict::Entry& entry : model) {
    const std::string device = entry.original_device.empty() ? "unknown" : entry.original_device;
    ++devices[device];
    ++dtypes[DTypeOf(entry.tensor)];
    Json described = {{"key", entry.key}};
    DescribeInto(entry.tensor, described);
    described["original_device"] = device;
    entries.push_back(std::move(described));
  }
  model_report["original_devices"] = devices;
  model_report["dtypes"] = dtypes;
  model_report["entries"] = std::move(entries);
  report["model"] = std::move(model_report);

  report["epoch"] = file.bundle.epoch >= 0 ? Json(file.bundle.epoch) : Json(nullptr);
  report["step"] = file.bundle.step >= 0 ? Json(file.bundle.step) : Json(nullptr);
  report["optimizer"] =
      file.bundle.optimizer.has_value() ? InspectOptimizer(*file.bundle.optimizer) : Json(nullptr);
  report["scheduler"] =
      file.bundle.scheduler.has_value() ? Summarize(*file.bundle.scheduler) : Json(nullptr);
  Json extra = Json::object();
  if (file.bundle.extra.is_dict()) {
    for (const auto& [key, value] : file.bundle.extra.entries()) {
      extra[key.is_int() ? std::to_string(key.int_key()) : key.string_key()] = Summarize(value);
    }
  }
  report["other_entries"] = std::move(extra);
  report["metadata"] = file.metadata;
  report["warnings"] = file.warnings;
  const Expansion expansion = MeasureExpansion(file.root);
  Json expansion_report;
  expansion_report["views"] = expansion.views;
  expansion_report["bytes"] = expansion.bytes;
  expansion_report["widest"] = expansion.widest;
  report["expansion"] = std::move(expansion_report);
  return report;
}

std::string RenderInspectText(const Json& report) {
  std::string out =
      absl::StrCat(report["file"].get<std::string>(), ": ", report["format"].get<std::string>(),
                   ", ", HumanBytes(report["file_bytes"].get<uint64_t>()), "\n");
  if (report["model"].is_null()) {
    const Json& root = report["root"];
    absl::StrAppend(&out, "no model state dict: the root is ", root["kind"].get<std::string>(),
                    " (`ckpt convert` writes it as it is; `ckpt import` needs a state dict: "
                    "--key PATH names one inside it)\n");
    size_t path_width = 4;
    for (const Json& tensor : root["tensors"]) {
      path_width = std::max(path_width, tensor["path"].get<std::string>().size());
    }
    if (!root["tensors"].empty()) {
      absl::StrAppend(&out, absl::StrFormat("  %-*s  %-9s  %-18s  %10s\n", path_width, "PATH",
                                            "DTYPE", "SHAPE", "BYTES"));
    }
    for (const Json& tensor : root["tensors"]) {
      absl::StrAppend(&out, absl::StrFormat("  %-*s  %-9s  %-18s  %10s\n", path_width,
                                            tensor["path"].get<std::string>(),
                                            tensor["dtype"].get<std::string>(), ShapeColumn(tensor),
                                            HumanBytes(tensor["bytes"].get<uint64_t>())));
    }
    for (const Json& unstored : root["unstored"]) {
      absl::StrAppend(&out, "  ", unstored["path"].get<std::string>(), ": ",
                      unstored["kind"].get<std::string>(),
                      " (ckpt stores dense tensors only: to_dense() it, or give it storage)\n");
    }
    if (root["tensors"].empty() && root["unstored"].empty()) {
      absl::StrAppend(&out, "  values: ", root["summary"].dump(), "\n");
    }
    for (const Json& warning : report["warnings"]) {
      absl::StrAppend(&out, "warning: ", warning.get<std::string>(), "\n");
    }
    return out;
  }
  if (const Json& expansion = report["expansion"]; expansion["views"].get<int>() > 0) {
    absl::StrAppend(&out, "expands: ", expansion["views"].get<int>(),
                    " tensors wider than their storage would take ",
                    HumanBytes(expansion["bytes"].get<uint64_t>()),
                    " more once materialized (convert and import refuse more than "
                    "--max-expanded-bytes); the widest, ",
                    expansion["widest"].get<std::string>(), " bytes\n");
  }
  const Json& model = report["model"];
  std::vector<std::string> devices;
  for (const auto& [device, count] : model["original_devices"].items()) {
    devices.push_back(absl::StrCat(device, " (", count.get<int64_t>(), ")"));
  }
  const std::string key_path = model["key_path"].get<std::string>();
  absl::StrAppend(
      &out, "model state dict", key_path.empty() ? "" : absl::StrCat(" at '", key_path, "'"), ": ",
      model["tensors"].get<int64_t>(), " tensors, ", HumanBytes(model["bytes"].get<uint64_t>()),
      "; original devices: ", absl::StrJoin(devices, ", "), "\n");
  if (model.contains("wrapper_prefix")) {
    const std::string prefix = model["wrapper_prefix"].get<std::string>();
    const auto wrappers = model["wrappers"].get<std::vector<std::string>>();
    absl::StrAppend(&out, "wrapper prefix: ",
                    prefix.empty() ? std::string("none") : absl::StrCat("'", prefix, "'"),
                    wrappers.empty() ? "" : absl::StrCat(" (", absl::StrJoin(wrappers, ", "), ")"),
                    model["inner_wrapper_keys"].get<int64_t>() > 0
                        ? absl::StrCat("; ", model["inner_wrapper_keys"].get<int64_t>(),
                                       " keys with inner wrapper segments")
                        : "",
                    "\n");
  }
  size_t key_width = 3;
  for (const Json& entry : model["entries"]) {
    key_width = std::max(key_width, entry["key"].get<std::string>().size());
  }
  absl::StrAppend(&out, absl::StrFormat("  %-*s  %-9s  %-18s  %10s  %s\n", key_width, "KEY",
                                        "DTYPE", "SHAPE", "BYTES", "ORIGINAL DEVICE"));
  for (const Json& entry : model["entries"]) {
    absl::StrAppend(
        &out, absl::StrFormat("  %-*s  %-9s  %-18s  %10s  %s\n", key_width,
                              entry["key"].get<std::string>(), entry["dtype"].get<std::string>(),
                              ShapeColumn(entry), HumanBytes(entry["bytes"].get<uint64_t>()),
                              entry["original_device"].get<std::string>()));
  }
  absl::StrAppend(&out, "epoch: ", report["epoch"].is_null() ? "-" : report["epoch"].dump(),
                  ", step: ", report["step"].is_null() ? "-" : report["step"].dump(), "\n");
  const Json& optimizer = report["optimizer"];
  if (optimizer.is_null()) {
    absl::StrAppend(&out, "optimizer: none\n");
  } else if (optimizer.contains("param_groups")) {
    absl::StrAppend(&out, "optimizer: ", optimizer["param_groups"].size(), " param group(s), ",
                    optimizer["state_entries"].get<int64_t>(), " parameter states (",
                    absl::StrJoin(optimizer["state_fields"].get<std::vector<std::string>>(), ", "),
                    "), ", HumanBytes(optimizer["state_tensor_bytes"].get<uint64_t>()),
                    " of state tensors\n");
    int index = 0;
    for (const Json& group : optimizer["param_groups"]) {
      std::vector<std::string> fields;
      for (const auto& [key, value] : group.items()) {
        fields.push_back(absl::StrCat(key, "=", ScalarText(value)));
      }
      absl::StrAppend(&out, "  group ", index++, ": ", absl::StrJoin(fields, " "), "\n");
    }
  } else {
    absl::StrAppend(&out, "optimizer (unrecognized): ", optimizer.dump(), "\n");
  }
  const Json& scheduler = report["scheduler"];
  if (scheduler.is_null()) {
    absl::StrAppend(&out, "scheduler: none\n");
  } else if (scheduler.is_object()) {
    std::vector<std::string> fields;
    for (const auto& [key, value] : scheduler.items()) {
      fields.push_back(absl::StrCat(key, "=", ScalarText(value)));
    }
    absl::StrAppend(&out, "scheduler: ", absl::StrJoin(fields, " "), "\n");
  } else {
    absl::StrAppend(&out, "scheduler: ", scheduler.dump(), "\n");
  }
  if (!report["other_entries"].empty()) {
    std::vector<std::string> fields;
    for (const auto& [key, value] : report["other_entries"].items()) {
      fields.push_back(absl::StrCat(key, "=", ScalarText(value)));
    }
    absl::StrAppend(&out, "other entries: ", absl::StrJoin(fields, " "), "\n");
  }
  for (const auto& [key, value] : report["metadata"].items()) {
    absl::StrAppend(&out, "metadata ", key, ": ", value.get<std::string>(), "\n");
  }
  for (const Json& warning : report["warnings"]) {
    absl::StrAppend(&out, "warning: ", warning.get<std::string>(), "\n");
  }
  return out;
}

}  // namespace ckpt
