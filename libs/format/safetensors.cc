#include "libs/format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/io/atomic_file.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
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

}  // namespace ckpt
