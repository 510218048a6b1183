#include "libs/store/manifest_validation.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/bundle.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {
namespace {

std::string ShapeString(const v1::TensorMeta& meta) {
  return absl::StrCat("[", absl::StrJoin(meta.shape(), ", "), "]");
}

// Checks one tensor table; fills `keys` with key -> index.
absl::Status ValidateTensorTable(absl::string_view table,
                                 const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors,
                                 absl::flat_hash_map<std::string, int>& keys) {
  for (int i = 0; i < tensors.size(); ++i) {
    const v1::TensorMeta& meta = tensors[i];
    const std::string where = absl::StrCat(table, "[", i, "]");
    if (meta.key().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has an empty key"));
    }
    const std::string named = absl::StrCat(table, " '", meta.key(), "' (index ", i, ")");
    if (!keys.emplace(meta.key(), i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, ": duplicate key, also at index ", keys[meta.key()]));
    }
    absl::StatusOr<DType> dtype = DTypeFromProto(meta.dtype());
    if (!dtype.ok() || *dtype == DType::kUnspecified) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, ": unknown or unspecified dtype ", static_cast<int>(meta.dtype())));
    }
    // A sparse tensor's bytes are its parts' (libs/tensor/sparse_layout.h), checked there.
    absl::StatusOr<int64_t> expected = StoredByteLength(meta);
    if (!expected.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, ": shape ", ShapeString(meta), ": ", expected.status().message()));
    }
    if (meta.byte_length() != *expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, ": byte_length ", meta.byte_length(), " but ", DTypeName(*dtype), " ",
          meta.has_sparse() ? absl::StrCat(SparseLayoutName(meta), " ") : "", ShapeString(meta),
          " is ", *expected, " bytes"));
    }
    if (meta.chunks_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, ": has ", meta.chunks_size(), " chunk refs; the store computes chunks itself"));
    }
    if (!meta.content_hash().empty() && meta.content_hash().size() != kSha256Bytes) {
      return absl::InvalidArgumentError(absl::StrCat(named, ": content_hash has ",
                                                     meta.content_hash().size(),
                                                     " bytes; a SHA-256 has ", kSha256Bytes));
    }
  }
  return absl::OkStatus();
}

// Walks a value tree: checks kinds and depth, and calls `on_ref` for every TensorRef.
absl::Status WalkValue(
    const v1::Value& value, const std::string& path, int depth,
    const std::function<absl::Status(const std::string& path, const std::string& key)>& on_ref) {
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": value tree nests deeper than ", kMaxValueDepth, " levels"));
  }
  switch (value.kind_case()) {
    case v1::Value::KIND_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(path, ": value has no kind set"));
    case v1::Value::kListValue:
    case v1::Value::kTupleValue: {
      const v1::ValueList& list = value.has_list_value() ? value.list_value() : value.tuple_value();
      for (int i = 0; i < list.items_size(); ++i) {
        RETURN_IF_ERROR(WalkValue(list.items(i), absl::StrCat(path, "/", i), depth + 1, on_ref));
      }
      return absl::OkStatus();
    }
    case v1::Value::kDictValue:
      for (const v1::DictEntry& entry : value.dict_value().entries()) {
        std::string child_path;
        switch (entry.key_case()) {
          case v1::DictEntry::kStringKey:
            child_path = absl::StrCat(path, "/", entry.string_key());
            break;
          case v1::DictEntry::kIntKey:
            child_path = absl::StrCat(path, "/", entry.int_key());
            break;
          default:
            return absl::InvalidArgumentError(absl::StrCat(path, ": dict entry without a key"));
        }
        RETURN_IF_ERROR(WalkValue(entry.value(), child_path, depth + 1, on_ref));
      }
      return absl::OkStatus();
    case v1::Value::kTensorValue:
      return on_ref(path, value.tensor_value().key());
    case v1::Value::kOpaqueValue:
      if (value.opaque_value().has_args()) {
        RETURN_IF_ERROR(WalkValue(value.opaque_value().args(), path + "/args", depth + 1, on_ref));
      }
      if (value.opaque_value().has_state()) {
        RETURN_IF_ERROR(
            WalkValue(value.opaque_value().state(), path + "/state", depth + 1, on_ref));
      }
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

const v1::Value* FindStringKey(const v1::Value& dict, absl::string_view key) {
  if (!dict.has_dict_value()) return nullptr;
  for (const v1::DictEntry& entry : dict.dict_value().entries()) {
    if (entry.key_case() == v1::DictEntry::kStringKey && entry.string_key() == key) {
      return &entry.value();
    }
  }
  return nullptr;
}

absl::string_view KindName(const v1::Value& value) {
  switch (value.kind_case()) {
    case v1::Value::kNoneValue:
      return "None";
    case v1::Value::kBoolValue:
      return "bool";
    case v1::Value::kIntValue:
      return "int";
    case v1::Value::kFloatValue:
      return "float";
    case v1::Value::kStringValue:
      return "str";
    case v1::Value::kBytesValue:
      return "bytes";
    case v1::Value::kListValue:
      return "list";
    case v1::Value::kTupleValue:
      return "tuple";
    case v1::Value::kDictValue:
      return "dict";
    case v1::Value::kTensorValue:
      return "tensor";
    case v1::Value::kOpaqueValue:
      return "opaque object";
    default:
      return "unset";
  }
}

absl::Status ValidateOptimizer(const v1::Manifest& header,
                               const absl::flat_hash_map<std::string, int>& model_keys,
                               const absl::flat_hash_map<std::string, int>& state_keys,
                               std::vector<std::string>& warnings) {
  const v1::Value& optimizer = header.optimizer_state();
  const v1::Value* state = FindStringKey(optimizer, "state");
  const v1::Value* groups = FindStringKey(optimizer, "param_groups");
  if (state == nullptr || groups == nullptr || !state->has_dict_value() ||
      !(groups->has_list_value() || groups->has_tuple_value())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_state must be a PyTorch optimizer state_dict, a dict with 'state' (a dict) and "
        "'param_groups' (a list); found a ",
        KindName(optimizer),
        optimizer.has_dict_value() ? " without them (or of other types)" : ""));
  }

  ASSIGN_OR_RETURN(const std::vector<int64_t> indices, OptimizerParameterIndices(optimizer));
  const std::set<int64_t> params(indices.begin(), indices.end());

  int64_t trainable_typed = 0;
  for (const v1::TensorMeta& meta : header.tensors()) {
    absl::StatusOr<DType> dtype = DTypeFromProto(meta.dtype());
    if (!dtype.ok()) continue;
    const DTypeInfo& info = GetDTypeInfo(*dtype);
    if (info.is_floating_point || info.is_complex) ++trainable_typed;
  }
  if (!params.empty()) {
    const int64_t count = static_cast<int64_t>(params.size());
    const int64_t largest = *params.rbegin();
    if (count > trainable_typed || largest >= trainable_typed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer_state has ", count, " parameters (indices up to ", largest,
          ") but the model has only ", trainable_typed,
          " floating-point tensors that could be parameters; was the optimizer built for "
          "another model?"));
    }
  }

  for (const v1::DictEntry& entry : state->dict_value().entries()) {
    if (entry.key_case() == v1::DictEntry::kIntKey && !params.count(entry.int_key())) {
      warnings.push_back(absl::StrCat("optimizer_state has state for parameter ", entry.int_key(),
                                      ", which no param group lists; PyTorch keeps it unused"));
    }
  }

  absl::flat_hash_map<std::string, int64_t> index_of_name;
  for (const auto& [index, name] : header.optimizer_param_names()) {
    if (!params.count(index)) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer_param_names names parameter ",
                                                     index, " ('", name,
                                                     "'), which no optimizer param group lists"));
    }
    auto model_it = model_keys.find(name);
    if (model_it == model_keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer_param_names maps parameter ", index,
                                                     " to '", name,
                                                     "', which is not a model tensor key"));
    }
    auto [it, inserted] = index_of_name.emplace(name, index);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer_param_names maps parameters ",
                                                     it->second, " and ", index, " both to '", name,
                                                     "'"));
    }
    // Per-parameter state tensors usually have the parameter's shape (exp_avg, momentum_buffer).
    const v1::TensorMeta& param = header.tensors(model_it->second);
    for (const v1::DictEntry& entry : state->dict_value().entries()) {
      if (entry.key_case() != v1::DictEntry::kIntKey || entry.int_key() != index) continue;
      if (!entry.value().has_dict_value()) continue;
      for (const v1::DictEntry& field : entry.value().dict_value().entries()) {
        if (!field.value().has_tensor_value()) continue;
        auto state_it = state_keys.find(field.value().tensor_value().key());
        if (state_it == state_keys.end()) continue;
        const v1::TensorMeta& tensor = header.state_tensors(state_it->second);
        if (tensor.shape_size() == 0) continue;  // scalars such as Adam's step
        if (!std::equal(tensor.shape().begin(), tensor.shape().end(), param.shape().begin(),
                        param.shape().end())) {
          warnings.push_back(absl::StrCat("optimizer state ", index, "/", field.string_key(),
                                          " has shape ", ShapeString(tensor),
                                          " but its parameter '", name, "' has shape ",
                                          ShapeString(param)));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateScheduler(const v1::Value& scheduler, const std::string& path,
                               std::vector<std::string>& warnings) {
  if (scheduler.has_none_value()) return absl::OkStatus();
  if (!scheduler.has_dict_value()) {
    warnings.push_back(absl::StrCat(path, " is a ", KindName(scheduler),
                                    ", not a state dict: stored as is, but load_state_dict "
                                    "cannot restore it"));
    return absl::OkStatus();
  }
  if (const v1::Value* children = FindStringKey(scheduler, "_schedulers")) {
    if (children->has_list_value()) {
      for (int i = 0; i < children->list_value().items_size(); ++i) {
        RETURN_IF_ERROR(ValidateScheduler(children->list_value().items(i),
                                          absl::StrCat(path, "/_schedulers/", i), warnings));
      }
      return absl::OkStatus();
    }
  }
  const v1::Value* last_epoch = FindStringKey(scheduler, "last_epoch");
  if (last_epoch == nullptr || !last_epoch->has_int_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " has no integer 'last_epoch'; an LR scheduler needs it to resume (its "
                     "load_state_dict would silently restart the schedule)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLineage(const v1::Lineage& lineage) {
  if (lineage.parent().empty()) {
    if (!lineage.parent_relation().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lineage names a parent relation ('", lineage.parent_relation(), "') but no parent"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<v1::VersionRef> parent = ParseVersionRef(lineage.parent());
  if (!parent.ok() || parent->ref_case() != v1::VersionRef::kVersion) {
    // An alias moves; lineage must stay true.
    return absl::InvalidArgumentError(absl::StrCat("lineage parent '", lineage.parent(),
                                                   "' is not MODEL@VERSION with a version number"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ValidateManifestHeader(const v1::Manifest& header) {
  std::vector<std::string> warnings;
  absl::flat_hash_map<std::string, int> model_keys;
  absl::flat_hash_map<std::string, int> state_keys;
  RETURN_IF_ERROR(ValidateTensorTable("tensor", header.tensors(), model_keys));
  RETURN_IF_ERROR(ValidateTensorTable("state tensor", header.state_tensors(), state_keys));
  RETURN_IF_ERROR(ValidateLineage(header.metadata().lineage()));

  absl::flat_hash_set<std::string> referenced;
  auto check_trees = [&](const v1::Value& tree, const std::string& name) -> absl::Status {
    return WalkValue(
        tree, name, 0, [&](const std::string& path, const std::string& key) -> absl::Status {
          if (!state_keys.contains(key)) {
            return absl::InvalidArgumentError(absl::StrCat(path, " references tensor '", key,
                                                           "', which is not in state_tensors"));
          }
          referenced.insert(key);
          return absl::OkStatus();
        });
  };
  if (header.has_optimizer_state()) {
    RETURN_IF_ERROR(check_trees(header.optimizer_state(), "optimizer_state"));
  }
  if (header.has_scheduler_state()) {
    RETURN_IF_ERROR(check_trees(header.scheduler_state(), "scheduler_state"));
  }
  if (header.has_extra_state()) {
    RETURN_IF_ERROR(check_trees(header.extra_state(), "extra_state"));
  }
  for (const v1::TensorMeta& meta : header.state_tensors()) {
    if (!referenced.contains(meta.key())) {
      warnings.push_back(
          absl::StrCat("state tensor '", meta.key(), "' is not referenced by any value tree"));
    }
  }

  if (header.has_optimizer_state() && !header.optimizer_state().has_none_value()) {
    RETURN_IF_ERROR(ValidateOptimizer(header, model_keys, state_keys, warnings));
  } else if (!header.optimizer_param_names().empty()) {
    return absl::InvalidArgumentError("optimizer_param_names given without optimizer_state");
  }
  if (header.has_scheduler_state()) {
    RETURN_IF_ERROR(ValidateScheduler(header.scheduler_state(), "scheduler_state", warnings));
  }
  RETURN_IF_ERROR(ValidateBundleLayout(header.bundle_layout()));
  return warnings;
}

absl::StatusOr<std::vector<int64_t>> OptimizerParameterIndices(const v1::Value& optimizer) {
  const v1::Value* groups = FindStringKey(optimizer, "param_groups");
  if (groups == nullptr || !(groups->has_list_value() || groups->has_tuple_value())) {
    return absl::InvalidArgumentError(
        "optimizer_state has no 'param_groups' list: not a PyTorch optimizer state_dict");
  }
  std::vector<int64_t> indices;
  std::set<int64_t> seen;
  const v1::ValueList& group_list =
      groups->has_list_value() ? groups->list_value() : groups->tuple_value();
  for (int g = 0; g < group_list.items_size(); ++g) {
    const v1::Value* group_params = FindStringKey(group_list.items(g), "params");
    if (group_params == nullptr || !group_params->has_list_value()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer_state param_groups[", g,
                                                     "] must be a dict with a 'params' list"));
    }
    for (const v1::Value& index : group_params->list_value().items()) {
      if (!index.has_int_value()) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer_state param_groups[", g,
                                                       "]['params'] holds a ", KindName(index),
                                                       "; expected parameter indices (int)"));
      }
      if (index.int_value() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer_state param_groups[", g,
                                                       "] lists negative parameter index ",
                                                       index.int_value()));
      }
      if (!seen.insert(index.int_value()).second) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer_state lists parameter ",
                                                       index.int_value(),
                                                       " in more than one place in param_groups"));
      }
      indices.push_back(index.int_value());
    }
  }

  return indices;
}

}  // namespace ckpt
