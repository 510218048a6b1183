#include "libs/format/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/io/atomic_file.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/sparse_layout.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using Json = nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors bytes are little-endian; this reader copies them as they are");

constexpr absl::string_view kMetadataKey = "__metadata__";

absl::Status Invalid(const ByteSource& source, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source.name(), ": not a valid safetensors file: ", what));
}

// A JSON number that is a non-negative integer.
bool AsUnsigned(const Json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

absl::StatusOr<SafetensorsTensorInfo> ParseTensorInfo(const ByteSource& source,
                                                      const std::string& name, const Json& info) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (name.empty()) return Invalid(source, "a tensor has an empty name");
  if (!info.is_object()) return Invalid(source, absl::StrCat(where, " is not a JSON object"));
  SafetensorsTensorInfo tensor;
  tensor.name = name;

  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) {
    return Invalid(source, absl::StrCat(where, " has no \"dtype\" string"));
  }
  absl::StatusOr<DType> parsed_dtype = DTypeFromSafetensorsName(dtype->get<std::string>());
  if (!parsed_dtype.ok()) {
    return Invalid(source, absl::StrCat(where, ": ", parsed_dtype.status().message()));
  }
  tensor.dtype = *parsed_dtype;

  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) {
    return Invalid(source, absl::StrCat(where, " has no \"shape\" array"));
  }
  for (const Json& dim : *shape) {
    uint64_t value = 0;
    if (!AsUnsigned(dim, &value) || value > (uint64_t{1} << 62)) {
      return Invalid(source, absl::StrCat(where,
                                          " has a shape entry that is not a non-negative "
                                          "integer: ",
                                          dim.dump()));
    }
    tensor.shape.push_back(static_cast<int64_t>(value));
  }

  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !AsUnsigned((*offsets)[0], &tensor.begin) || !AsUnsigned((*offsets)[1], &tensor.end)) {
    return Invalid(source, absl::StrCat(where,
                                        " needs \"data_offsets\": [BEGIN, END] with "
                                        "non-negative integers"));
  }
  if (tensor.end < tensor.begin) {
    return Invalid(source, absl::StrCat(where, " has data_offsets [", tensor.begin, ", ",
                                        tensor.end, "] that end before they begin"));
  }
  absl::StatusOr<int64_t> expected = ByteLengthOf(tensor.dtype, tensor.shape);
  if (!expected.ok())
    return Invalid(source, absl::StrCat(where, ": ", expected.status().message()));
  if (static_cast<uint64_t>(*expected) != tensor.end - tensor.begin) {
    return Invalid(source,
                   absl::StrCat(where, ": ", DTypeName(tensor.dtype), " [",
                                absl::StrJoin(tensor.shape, ", "), "] needs ", *expected,
                                " bytes but data_offsets span ", tensor.end - tensor.begin));
  }
  return tensor;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const ByteSource& source) {
  if (source.size() < 8) {
    return Invalid(source, absl::StrCat("it is ", source.size(),
                                        " bytes; the format starts with an 8-byte header length"));
  }
  char length_bytes[8];
  RETURN_IF_ERROR(source.ReadAt(0, absl::MakeSpan(length_bytes, 8)));
  uint64_t header_length = 0;
  std::memcpy(&header_length, length_bytes, 8);
  if (header_length > kSafetensorsMaxHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_length, " exceeds the limit of ",
                                        kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (header_length > source.size() - 8) {
    return Invalid(source, absl::StrCat("header length ", header_length,
                                        " runs past the end of "
                                        "the file (",
                                        source.size() - 8, " bytes follow it)"));
  }
  ASSIGN_OR_RETURN(std::string text, source.ReadString(8, header_length));
  if (text.empty() || text[0] != '{') {
    return Invalid(source, "the JSON header does not start with '{'");
  }

  // nlohmann keeps the last of duplicate keys; safetensors must not silently drop a tensor.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto reject_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(text, reject_duplicates);
  } catch (const Json::exception& error) {
    return Invalid(source, absl::StrCat("the JSON header does not parse: ", error.what()));
  }
  if (!duplicate.empty()) {
    return Invalid(source, absl::StrCat("the header has the key '", duplicate, "' twice"));
  }
  if (!json.is_object()) return Invalid(source, "the JSON header is not an object");

  SafetensorsHeader header;
  header.data_start = 8 + header_length;
  for (const auto& [key, value] : json.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return Invalid(source, "__metadata__ is not an object");
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          return Invalid(source,
                         absl::StrCat("__metadata__ value of '", meta_key, "' is not a string"));
        }
        header.metadata.emplace(meta_key, meta_value.get<std::string>());
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsTensorInfo tensor, ParseTensorInfo(source, key, value));
    header.tensors.push_back(std::move(tensor));
  }

  // The tensors must tile the data buffer exactly, in offset order.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected_begin = 0;
  for (const SafetensorsTensorInfo& tensor : header.tensors) {
    if (tensor.begin != expected_begin) {
      return Invalid(source,
                     absl::StrCat("tensor '", tensor.name, "' starts at data offset ", tensor.begin,
                                  " but the previous tensor ends at ", expected_begin,
                                  " (offsets must not overlap or leave "
                                  "gaps)"));
    }
    expected_begin = tensor.end;
  }
  const uint64_t data_bytes = source.size() - header.data_start;
  if (expected_begin != data_bytes) {
    return Invalid(source, absl::StrCat("the tensors cover ", expected_begin,
                                        " data bytes but the file holds ", data_bytes,
                                        expected_begin > data_bytes ? " (truncated?)" : ""));
  }
  return header;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const ByteSource& source) {
  SafetensorsFile file;
  ASSIGN_OR_RETURN(file.header, ReadSafetensorsHeader(source));
  for (const SafetensorsTensorInfo& info : file.header.tensors) {
    absl::StatusOr<c10::ScalarType> scalar_type = ToScalarType(info.dtype);
    if (!scalar_type.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(source.name(), ": tensor '", info.name,
                                                        "': ", scalar_type.status().message()));
    }
    ASSIGN_OR_RETURN(at::Tensor tensor, CatchTorchErrors([&] {
                       return at::empty(info.shape, at::TensorOptions().dtype(*scalar_type));
                     }));
    if (info.end > info.begin) {
      RETURN_IF_ERROR(source.ReadAt(
          file.header.data_start + info.begin,
          absl::MakeSpan(static_cast<char*>(tensor.data_ptr()), info.end - info.begin)));
    }
    RETURN_IF_ERROR(file.tensors.Insert(info.name, std::move(tensor), "cpu"));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensorsFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, OpenFileSource(path));
  return ReadSafetensors(*source);
}

absl::StatusOr<SafetensorsLayout> PlanSafetensors(
    const std::vector<SafetensorsTensorSpec>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsTensorSpec*> order;
  std::set<absl::string_view> names;
  for (const SafetensorsTensorSpec& spec : tensors) {
    if (spec.name.empty()) return absl::InvalidArgumentError("safetensors: empty tensor name");
    if (spec.name == kMetadataKey) {
      return absl::InvalidArgumentError("safetensors: a tensor cannot be named __metadata__");
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name '", spec.name, "' appears twice"));
    }
    if (GetDTypeInfo(spec.dtype).safetensors_name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors has no dtype for tensor '", spec.name, "' of ",
                       DTypeName(spec.dtype), "; cast it (e.g. --dtype) or export as torch"));
    }
    order.push_back(&spec);
  }
  // Largest elements first keeps every tensor aligned to its element size; then by name.
  std::stable_sort(order.begin(), order.end(),
                   [](const SafetensorsTensorSpec* a, const SafetensorsTensorSpec* b) {
                     const int size_a = ElementSize(a->dtype), size_b = ElementSize(b->dtype);
                     return size_a != size_b ? size_a > size_b : a->name < b->name;
                   });

  SafetensorsLayout layout;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json[std::string(kMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensorSpec* spec : order) {
    ASSIGN_OR_RETURN(int64_t bytes, ByteLengthOf(spec->dtype, spec->shape));
    SafetensorsTensorInfo info{spec->name, spec->dtype, spec->shape, offset,
                               offset + static_cast<uint64_t>(bytes)};
    json[spec->name] = {{"dtype", std::string(GetDTypeInfo(spec->dtype).safetensors_name)},
                        {"shape", spec->shape},
                        {"data_offsets", {info.begin, info.end}}};
    offset = info.end;
    layout.tensors.push_back(std::move(info));
  }
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_length = text.size();
  layout.header_bytes.resize(8);
  std::memcpy(layout.header_bytes.data(), &header_length, 8);
  layout.header_bytes += text;
  layout.total_bytes = layout.header_bytes.size() + offset;
  return layout;
}

absl::Status WriteSafetensorsFile(const std::string& path, const StateDict& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const StateDict::Entry& entry : tensors) {
    if (IsSparseTensor(entry.tensor)) {
      ASSIGN_OR_RETURN(const SparseParts sparse, SparsePartsOf(entry.tensor));
      return DenseOnlyFormatError("safetensors", entry.key, sparse.layout_name);
    }
    ASSIGN_OR_RETURN(DType dtype, FromScalarType(entry.tensor.scalar_type()));
    specs.push_back({entry.key, dtype, entry.tensor.sizes().vec()});
  }
  ASSIGN_OR_RETURN(SafetensorsLayout layout, PlanSafetensors(specs, metadata));
  ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(out.Append(layout.header_bytes));
  for (const SafetensorsTensorInfo& info : layout.tensors) {
    const at::Tensor& tensor = *tensors.Find(info.name);
    // One tensor at a time: at most one contiguous CPU copy exists beyond the inputs.
    ASSIGN_OR_RETURN(at::Tensor bytes,
                     CatchTorchErrors([&] { return tensor.to(at::kCPU).contiguous(); }));
    RETURN_IF_ERROR(
        out.Append(absl::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes())));
  }
  return out.Commit();
}

std::string SafetensorsShardName(int index, int count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index, count);
}

std::vector<std::vector<size_t>> PlanSafetensorsShards(const std::vector<uint64_t>& tensor_bytes,
                                                       uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const uint64_t bytes = tensor_bytes[i];
    if (max_shard_bytes > 0 && bytes > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (max_shard_bytes > 0 && !current.empty() && current_bytes + bytes > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string SafetensorsIndexJson(uint64_t total_size,
                                 const std::map<std::string, std::string>& weight_map) {
  Json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

namespace {

// 0 when `path` does not exist; else S_IFDIR, S_IFREG, ...
absl::StatusOr<mode_t> FileType(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0) return info.st_mode & S_IFMT;
  if (errno == ENOENT || errno == ENOTDIR) return 0;
  return absl::UnavailableError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
}

std::string Directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<HuggingFaceLayout> LocateHuggingFaceLayout(const std::string& path) {
  HuggingFaceLayout layout;
  ASSIGN_OR_RETURN(const mode_t type, FileType(path));
  if (type == S_IFDIR) {
    const std::string index = absl::StrCat(path, "/", kSafetensorsIndexName);
    const std::string single = absl::StrCat(path, "/", kSafetensorsSingleName);
    ASSIGN_OR_RETURN(const mode_t index_type, FileType(index));
    if (index_type != 0) {
      layout.index = index;
      return layout;
    }
    ASSIGN_OR_RETURN(const mode_t single_type, FileType(single));
    if (single_type != 0) {
      layout.file = single;
      return layout;
    }
    return absl::NotFoundError(absl::StrCat(path, " is a directory holding neither ",
                                            kSafetensorsIndexName, " (sharded safetensors) nor ",
                                            kSafetensorsSingleName));
  }
  if (absl::EndsWith(path, ".json")) layout.index = path;
  return layout;
}

absl::StatusOr<ShardedSafetensors> ReadShardedSafetensors(const std::string& index_path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> index_source, OpenFileSource(index_path));
  // An index lists every tensor once; far larger than the biggest real ones (a few MB).
  if (index_source->size() > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", index_source->size(),
                                                   " bytes is too large for a safetensors index"));
  }
  ASSIGN_OR_RETURN(std::string text, index_source->ReadString(0, index_source->size()));
  const auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": not a sharded safetensors index: ", what));
  };
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::exception& error) {
    return invalid(absl::StrCat("the JSON does not parse: ", error.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return invalid("it has no \"weight_map\" object");
  }
  // Shard file name -> the keys the index puts there, in index order.
  std::map<std::string, std::set<std::string>> keys_of_shard;
  absl::flat_hash_map<std::string, std::string> shard_of_key;
  for (const auto& [key, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      return invalid(absl::StrCat("the shard of '", key, "' is not a string"));
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return invalid(absl::StrCat("the shard of '", key, "' is '", name,
                                  "', not a file name beside the index"));
    }
    keys_of_shard[name].insert(key);
    shard_of_key.emplace(key, name);
  }
  const std::string directory = Directory(index_path);

  // Every header first: a broken set fails before any tensor is allocated.
  ShardedSafetensors result;
  result.file_bytes = index_source->size();
  std::vector<std::unique_ptr<ByteSource>> sources;
  std::map<std::string, std::string> holder;  // Tensor -> the shard holding it.
  uint64_t tensor_bytes = 0;
  for (const auto& [name, keys] : keys_of_shard) {
    const std::string path = absl::StrCat(directory, "/", name);
    absl::StatusOr<std::unique_ptr<ByteSource>> source = OpenFileSource(path);
    if (!source.ok()) {
      if (absl::IsNotFound(source.status())) {
        return absl::NotFoundError(absl::StrCat(index_path, " maps ", keys.size(),
                                                " tensor(s) (e.g. '", *keys.begin(),
                                                "') to the shard ", path, ", which is missing"));
      }
      return source.status();
    }
    ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(**source));
    std::set<std::string> found;
    for (const SafetensorsTensorInfo& tensor : header.tensors) {
      if (auto [it, fresh] = holder.emplace(tensor.name, name); !fresh) {
        return invalid(absl::StrCat("tensor '", tensor.name, "' is in two shards, ", it->second,
                                    " and ", name));
      }
      auto mapped = shard_of_key.find(tensor.name);
      if (mapped == shard_of_key.end()) {
        return invalid(absl::StrCat("shard ", name, " holds tensor '", tensor.name,
                                    "', which the weight_map does not list"));
      }
      if (mapped->second != name) {
        return invalid(absl::StrCat("shard ", name, " holds tensor '", tensor.name,
                                    "', which the weight_map puts in ", mapped->second));
      }
      found.insert(tensor.name);
      tensor_bytes += tensor.end - tensor.begin;
    }
    for (const std::string& key : keys) {
      if (found.count(key) == 0) {
        return invalid(
            absl::StrCat("the weight_map puts tensor '", key, "' in ", name, ", which lacks it"));
      }
    }
    for (const auto& [key, value] : header.metadata) result.metadata.emplace(key, value);
    result.file_bytes += (*source)->size();
    result.shard_paths.push_back(path);
    sources.push_back(*std::move(source));
  }
  if (index.contains("metadata") && index["metadata"].is_object() &&
      index["metadata"].contains("total_size")) {
    uint64_t total_size = 0;
    if (!AsUnsigned(index["metadata"]["total_size"], &total_size) || total_size != tensor_bytes) {
      result.warnings.push_back(absl::StrCat(
          index_path, ": metadata.total_size is ", index["metadata"]["total_size"].dump(),
          " but the shards hold ", tensor_bytes, " bytes of tensors"));
    }
  }
  for (const std::unique_ptr<ByteSource>& source : sources) {
    ASSIGN_OR_RETURN(SafetensorsFile shard, ReadSafetensors(*source));
    for (const StateDict::Entry& entry : shard.tensors) {
      RETURN_IF_ERROR(result.tensors.Insert(entry.key, entry.tensor, entry.original_device));
    }
  }
  return result;
}

}  // namespace ckpt
