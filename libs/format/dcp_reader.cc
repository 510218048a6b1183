#include "libs/format/dcp_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/byte_source.h"
#include "libs/format/pickle_reader.h"
#include "libs/format/torch_reader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/dtype.h"

namespace ckpt {
namespace {

constexpr char kMetadataFile[] = ".metadata";
// How many keys at fault an error lists before "and N more".
constexpr size_t kMaxListedProblems = 8;

// Where one item's bytes are: a _StorageInfo.
struct StorageInfo {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// One entry of state_dict_metadata.
struct ItemMetadata {
  std::string key;
  bool is_tensor = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
};

// The class's name without its module ("Metadata" of "torch.distributed.checkpoint.metadata.
// Metadata"), for an Opaque object; empty otherwise.
std::string ClassOf(const Value& value) {
  if (!value.is_opaque()) return "";
  const std::string& name = value.opaque_class_name();
  return name.substr(name.rfind('.') + 1);
}

// The named field of a dataclass object (its BUILD state, a dict); nullptr when absent.
const Value* Field(const Value& object, absl::string_view name) {
  if (!object.is_opaque() || !object.opaque_state().is_dict()) return nullptr;
  return object.opaque_state().Find(std::string(name));
}

// A torch.Size: the pickle machine, without torch's hooks, keeps torch.Size((4, 3)) as
// Opaque("torch.Size", ((4, 3),), None); a plain tuple of ints is taken too.
std::optional<std::vector<int64_t>> Dims(const Value& value) {
  const Value* tuple = &value;
  if (value.is_opaque() && value.opaque_class_name() == "torch.Size") {
    const Value& args = value.opaque_args();
    if (!args.is_tuple() || args.items().size() != 1) return std::nullopt;
    tuple = &args.items()[0];
  }
  if (!tuple->is_sequence()) return std::nullopt;
  std::vector<int64_t> dims;
  for (const Value& item : tuple->items()) {
    if (!item.is_int() || item.int_value() < 0) return std::nullopt;
    dims.push_back(item.int_value());
  }
  return dims;
}

std::string DimsText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// TensorProperties pickles its state as a tuple (dtype, layout, requires_grad, memory_format,
// pin_memory) through __getstate__; a dict with "dtype" is taken too.
absl::StatusOr<c10::ScalarType> DtypeOf(const Value& properties, const std::string& where) {
  const Value* dtype = nullptr;
  const Value& state = properties.is_opaque() ? properties.opaque_state() : properties;
  if (state.is_tuple() && !state.items().empty()) {
    dtype = &state.items()[0];
  } else if (state.is_dict()) {
    dtype = state.Find("dtype");
  }
  if (dtype == nullptr || !dtype->is_opaque()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": its properties name no dtype"));
  }
  ASSIGN_OR_RETURN(const DType parsed, ParseDType(dtype->opaque_class_name()));
  return ToScalarType(parsed);
}

absl::StatusOr<ItemMetadata> ReadItemMetadata(const std::string& key, const Value& value,
                                              const std::string& dir) {
  const std::string where = absl::StrCat(dir, ": '", key, "'");
  ItemMetadata item;
  item.key = key;
  const std::string kind = ClassOf(value);
  if (kind == "BytesStorageMetadata") return item;
  if (kind != "TensorStorageMetadata") {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is described by ", value.is_opaque() ? value.opaque_class_name() : "no object",
        ", not TensorStorageMetadata or BytesStorageMetadata"));
  }
  item.is_tensor = true;
  const Value* properties = Field(value, "properties");
  const Value* size = Field(value, "size");
  const Value* chunks = Field(value, "chunks");
  if (properties == nullptr || size == nullptr || chunks == nullptr || !chunks->is_list()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": TensorStorageMetadata without properties, size and chunks"));
  }
  ASSIGN_OR_RETURN(item.dtype, DtypeOf(*properties, where));
  std::optional<std::vector<int64_t>> dims = Dims(*size);
  if (!dims.has_value()) return absl::InvalidArgumentError(absl::StrCat(where, ": bad size"));
  item.size = *std::move(dims);
  for (const Value& chunk : chunks->items()) {
    const Value* offsets = Field(chunk, "offsets");
    const Value* sizes = Field(chunk, "sizes");
    std::optional<std::vector<int64_t>> o, s;
    if (offsets != nullptr) o = Dims(*offsets);
    if (sizes != nullptr) s = Dims(*sizes);
    if (ClassOf(chunk) != "ChunkStorageMetadata" || !o.has_value() || !s.has_value() ||
        o->size() != item.size.size() || s->size() != item.size.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a chunk is not a ChunkStorageMetadata with offsets and sizes of rank ",
          item.size.size()));
    }
    item.chunks.push_back({*std::move(o), *std::move(s)});
  }
  return item;
}

// a * b, or nullopt past INT64_MAX (both non-negative).
std::optional<int64_t> Multiply(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// The elements of a tensor of `dims`; nullopt past INT64_MAX.
std::optional<int64_t> Elements(const std::vector<int64_t>& dims) {
  int64_t numel = 1;
  for (int64_t d : dims) {
    std::optional<int64_t> next = Multiply(numel, d);
    if (!next.has_value()) return std::nullopt;
    numel = *next;
  }
  return numel;
}

// Whether `chunks` tile a tensor of `size` exactly; otherwise why not. In bounds, pairwise
// disjoint and together as many elements as the tensor: an exact tiling.
std::optional<std::string> TilingProblem(const ItemMetadata& item) {
  const std::optional<int64_t> numel = Elements(item.size);
  if (!numel.has_value()) return std::string("its shape has more elements than int64 counts");
  int64_t covered = 0;
  for (const Chunk& chunk : item.chunks) {
    for (size_t d = 0; d < item.size.size(); ++d) {
      if (chunk.sizes[d] > item.size[d] || chunk.offsets[d] > item.size[d] - chunk.sizes[d]) {
        return absl::StrCat("the chunk at ", DimsText(chunk.offsets), " of size ",
                            DimsText(chunk.sizes), " reaches outside its shape ",
                            DimsText(item.size));
      }
    }
    // In bounds, so each chunk has at most numel elements and the sum cannot wrap before it
    // passes numel.
    covered += *Elements(chunk.sizes);
    if (covered > *numel) break;
  }
  // Disjoint: swept along the dimension where the chunks' offsets differ most (the sharded one),
  // each chunk compared only with those still open there, so row- or column-sharded tensors of
  // thousands of shards take a pass, not every pair.
  const size_t rank = item.size.size();
  size_t sweep = 0;
  size_t most = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> offsets;
    for (const Chunk& chunk : item.chunks) offsets.push_back(chunk.offsets[d]);
    std::sort(offsets.begin(), offsets.end());
    const size_t distinct =
        static_cast<size_t>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
    if (distinct > most) most = distinct, sweep = d;
  }
  std::vector<const Chunk*> order;
  for (const Chunk& chunk : item.chunks) {
    if (std::all_of(chunk.sizes.begin(), chunk.sizes.end(), [](int64_t n) { return n > 0; })) {
      order.push_back(&chunk);  // an empty chunk (an uneven shard's) overlaps nothing
    }
  }
  std::sort(order.begin(), order.end(), [sweep](const Chunk* a, const Chunk* b) {
    return a->offsets[sweep] < b->offsets[sweep];
  });
  std::vector<const Chunk*> open;
  for (const Chunk* y : order) {
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](const Chunk* x) {
                                return x->offsets[sweep] + x->sizes[sweep] <= y->offsets[sweep];
                              }),
               open.end());
    for (const Chunk* x : open) {
      bool overlap = true;
      for (size_t d = 0; d < rank && overlap; ++d) {
        overlap = x->offsets[d] < y->offsets[d] + y->sizes[d] &&
                  y->offsets[d] < x->offsets[d] + x->sizes[d];
      }
      if (overlap) {
        return absl::StrCat("its chunks at ", DimsText(x->offsets), " (size ", DimsText(x->sizes),
                            ") and ", DimsText(y->offsets), " (size ", DimsText(y->sizes),
                            ") overlap");
      }
    }
    open.push_back(y);
  }
  if (covered != *numel) {
    return absl::StrCat("its chunks cover ", covered, " of its ", *numel,
                        " elements: a shard is missing");
  }
  return std::nullopt;
}

// The key of storage_data for a chunk: fqn and the chunk's offsets (MetadataIndex compares
// those; its `index` is only a hint). Items without offsets (bytes) have none.
using StorageKey = std::pair<std::string, std::optional<std::vector<int64_t>>>;

absl::StatusOr<std::map<StorageKey, StorageInfo>> ReadStorageData(const Value& storage_data,
                                                                  const std::string& dir) {
  // A dict keyed by objects: the machine keeps it as Opaque("builtins.dict", ([(k, v), ...],)).
  std::vector<std::pair<const Value*, const Value*>> pairs;
  if (storage_data.is_opaque() && storage_data.opaque_class_name() == "builtins.dict" &&
      storage_data.opaque_args().is_tuple() && storage_data.opaque_args().items().size() == 1 &&
      storage_data.opaque_args().items()[0].is_list()) {
    for (const Value& pair : storage_data.opaque_args().items()[0].items()) {
      if (!pair.is_tuple() || pair.items().size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": storage_data is malformed"));
      }
      pairs.emplace_back(&pair.items()[0], &pair.items()[1]);
    }
  } else if (!(storage_data.is_dict() && storage_data.entries().empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": storage_data is not a dict of MetadataIndex to _StorageInfo"));
  }
  std::map<StorageKey, StorageInfo> storage;
  for (const auto& [index, info] : pairs) {
    const Value* fqn = Field(*index, "fqn");
    const Value* offset = Field(*index, "offset");
    const Value* path = Field(*info, "relative_path");
    const Value* start = Field(*info, "offset");
    const Value* length = Field(*info, "length");
    if (ClassOf(*index) != "MetadataIndex" || fqn == nullptr || !fqn->is_string() ||
        path == nullptr || !path->is_string() || start == nullptr || !start->is_int() ||
        length == nullptr || !length->is_int() || start->int_value() < 0 ||
        length->int_value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir,
                       ": a storage_data entry is not MetadataIndex(fqn, offset) -> "
                       "_StorageInfo(relative_path, offset, length)"));
    }
    StorageKey key{fqn->string_value(), std::nullopt};
    if (offset != nullptr && !offset->is_none()) {
      key.second = Dims(*offset);
      if (!key.second.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": storage of '", fqn->string_value(), "' has bad offsets"));
      }
    }
    // Newer writers can compress or re-encode items (_extensions): those are not torch.save'd.
    const Value* transforms = Field(*info, "transform_descriptors");
    if (transforms != nullptr && !transforms->is_none() &&
        !(transforms->is_sequence() && transforms->items().empty())) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": the storage of '", fqn->string_value(), "' is transformed (",
          transforms->DebugString().substr(0, 80),
          "): a DCP written with extensions such as compression, which ckpt does not read yet"));
    }
    // The files are the directory's own: no absolute path, no way out of it.
    const std::filesystem::path relative(path->string_value());
    if (relative.empty() || relative.is_absolute() ||
        path->string_value().find('\0') != std::string::npos ||
        std::any_of(relative.begin(), relative.end(),
                    [](const std::filesystem::path& part) { return part == ".."; })) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": storage of '", fqn->string_value(),
                                                     "' names '", path->string_value(),
                                                     "', which is not a file of the directory"));
    }
    if (!storage
             .emplace(key,
                      StorageInfo{path->string_value(), static_cast<uint64_t>(start->int_value()),
                                  static_cast<uint64_t>(length->int_value())})
             .second) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": storage_data names the storage of '", fqn->string_value(), "' at ",
                       key.second.has_value() ? DimsText(*key.second) : "its offset", " twice"));
    }
  }
  return storage;
}

// Opens each .distcp file once.
class StorageFiles {
 public:
  explicit StorageFiles(std::string dir) : dir_(std::move(dir)) {}

  // What torch.load gives for the item at `info`.
  absl::StatusOr<Value> Read(const StorageInfo& info, std::vector<std::string>& warnings) {
    auto it = files_.find(info.relative_path);
    if (it == files_.end()) {
      ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source,
                       OpenFileSource(absl::StrCat(dir_, "/", info.relative_path)));
      it = files_.emplace(info.relative_path, std::move(source)).first;
    }
    // Placed inside its file before anything was read; ReadString checks again (DATA_LOSS) in
    // case the file shrank since.
    const ByteSource& source = *it->second;
    ASSIGN_OR_RETURN(const std::string bytes, source.ReadString(info.offset, info.length));
    ASSIGN_OR_RETURN(TorchFile item,
                     ReadTorchBytes(bytes, absl::StrCat(source.name(), "@", info.offset)));
    for (std::string& warning : item.warnings) warnings.push_back(std::move(warning));
    return std::move(item.root);
  }

 private:
  const std::string dir_;
  std::map<std::string, std::unique_ptr<ByteSource>> files_;
};

// The deepest nesting planner_data may describe (torch's state dicts nest a few levels).
constexpr size_t kMaxNesting = 64;
// The longest list a path's index may make.
constexpr int64_t kMaxListIndex = 1 << 20;

// Puts `value` at `path` (planner_data's tuple for a flattened key) under `root`. A string is a
// dict key and an int a list position: torch's traversal writes every dict key as a string, so
// an int is always a list index, and the list is padded with None up to it as torch pads it.
// Refuses a path that leads through a value of the other kind, or to a place already taken.
absl::Status Nest(Value& root, const std::vector<Value>& path, Value value,
                  const std::string& where) {
  if (path.size() > kMaxNesting) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": planner_data nests it ", path.size(),
                                                   " levels deep, more than ", kMaxNesting));
  }
  Value* node = &root;
  for (size_t i = 0; i < path.size(); ++i) {
    const Value& part = path[i];
    const bool last = i + 1 == path.size();
    const auto new_child = [&] { return path[i + 1].is_int() ? Value::List() : Value::Dict(); };
    Value* child = nullptr;
    if (part.is_string() && node->is_dict()) {
      child = node->FindMutable(part.string_value());
      if (child == nullptr) {
        node->Set(part.string_value(), last ? Value::None() : new_child());
        child = node->FindMutable(part.string_value());
      } else if (last) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": planner_data puts it where another value already is"));
      }
    } else if (part.is_int() && node->is_list() && part.int_value() >= 0 &&
               part.int_value() < kMaxListIndex) {
      std::vector<Value>& items = node->mutable_items();
      if (items.size() <= static_cast<size_t>(part.int_value())) {
        items.resize(static_cast<size_t>(part.int_value()) + 1);
      }
      child = &items[static_cast<size_t>(part.int_value())];
      if (child->is_none() && !last) {
        *child = new_child();
      } else if (!child->is_none() && last) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": planner_data puts it where another value already is"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": planner_data's path element ", part.DebugString(), " does not fit a ",
          node->is_list() ? "list" : (node->is_dict() ? "dict" : "value"), " at level ", i));
    }
    if (last) {
      *child = std::move(value);
      return absl::OkStatus();
    }
    node = child;
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": planner_data gives an empty path"));
}

}  // namespace

bool IsDcpDirectory(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_directory(path, error) &&
         std::filesystem::is_regular_file(std::filesystem::path(path) / kMetadataFile, error);
}

absl::StatusOr<DcpCheckpoint> ReadDcpDirectory(const std::string& dir) {
  DcpCheckpoint checkpoint;
  const std::string metadata_path = absl::StrCat(dir, "/", kMetadataFile);
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> metadata_source, OpenFileSource(metadata_path));
  PickleOptions options;
  options.name = metadata_path;
  ASSIGN_OR_RETURN(PickleResult pickle,
                   ReadPickle(*metadata_source, 0, options, /*hooks=*/nullptr));
  const Value& metadata = pickle.value;
  if (ClassOf(metadata) != "Metadata" ||
      !absl::StrContains(metadata.opaque_class_name(), "checkpoint.metadata.")) {
    return absl::InvalidArgumentError(
        absl::StrCat(metadata_path, ": not a torch.distributed.checkpoint Metadata object (found ",
                     metadata.DebugString().substr(0, 80), ")"));
  }
  const Value* items = Field(metadata, "state_dict_metadata");
  const Value* storage_data = Field(metadata, "storage_data");
  const Value* planner_data = Field(metadata, "planner_data");
  if (items == nullptr || !items->is_dict() || storage_data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(metadata_path, ": Metadata without state_dict_metadata and storage_data"));
  }
  ASSIGN_OR_RETURN(const auto storage, ReadStorageData(*storage_data, dir));

  // Every key's metadata and tiling first, so one error names every key at fault.
  std::vector<ItemMetadata> described;
  std::vector<std::string> problems;
  for (const auto& [key, value] : items->entries()) {
    if (key.is_int()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": a state_dict_metadata key is an int"));
    }
    ASSIGN_OR_RETURN(ItemMetadata item, ReadItemMetadata(key.string_key(), value, dir));
    if (item.is_tensor) {
      if (std::optional<std::string> problem = TilingProblem(item)) {
        problems.push_back(
            absl::StrCat("'", item.key, "' of shape ", DimsText(item.size), ": ", *problem));
      }
      for (const Chunk& chunk : item.chunks) {
        if (storage.count({item.key, chunk.offsets}) == 0) {
          problems.push_back(absl::StrCat("'", item.key, "': the chunk at ",
                                          DimsText(chunk.offsets), " has no storage"));
        }
      }
    } else if (storage.count({item.key, std::nullopt}) == 0) {
      problems.push_back(absl::StrCat("'", item.key, "' has no storage"));
    }
    described.push_back(std::move(item));
  }
  if (!problems.empty()) {
    const size_t more =
        problems.size() > kMaxListedProblems ? problems.size() - kMaxListedProblems : 0;
    problems.resize(std::min(problems.size(), kMaxListedProblems));
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the checkpoint's shards do not make up its tensors: ",
        absl::StrJoin(problems, "; "), more > 0 ? absl::StrCat("; and ", more, " more") : ""));
  }
  // Before anything is allocated: every item lies inside its file, holds at least its chunk's
  // bytes (a torch.save'd chunk stores them all), and no two items share bytes. So what is
  // allocated is bounded by the files' sizes, however large the metadata claims a tensor is.
  checkpoint.file_bytes = metadata_source->size();
  struct Span {
    std::pair<uint64_t, uint64_t> file;  // st_dev, st_ino: one file however it is spelled
    uint64_t offset, length;
    std::string key;
  };
  std::vector<Span> spans;
  std::map<std::pair<uint64_t, uint64_t>, bool> counted;
  const auto place = [&](const std::string& key, const StorageInfo& info,
                         uint64_t needed) -> absl::Status {
    const std::string path = absl::StrCat(dir, "/", info.relative_path);
    struct stat file;
    if (::stat(path.c_str(), &file) != 0 || !S_ISREG(file.st_mode)) {
      return absl::NotFoundError(
          absl::StrCat(path, ": the storage of '", key, "' is not a readable file"));
    }
    const uint64_t size = static_cast<uint64_t>(file.st_size);
    if (info.offset > size || info.length > size - info.offset) {
      return absl::DataLossError(absl::StrCat(path, ": the storage of '", key, "' (", info.length,
                                              " bytes at ", info.offset, ") runs past its end (",
                                              size, " bytes)"));
    }
    if (info.length < needed) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the storage of '", key, "' holds ",
                                                     info.length, " bytes, fewer than the ", needed,
                                                     " its chunk needs"));
    }
    const std::pair<uint64_t, uint64_t> identity{file.st_dev, file.st_ino};
    if (!counted[identity]) {
      counted[identity] = true;
      checkpoint.file_bytes += size;
    }
    spans.push_back({identity, info.offset, info.length, key});
    return absl::OkStatus();
  };
  for (const ItemMetadata& item : described) {
    if (!item.is_tensor) {
      RETURN_IF_ERROR(place(item.key, storage.at({item.key, std::nullopt}), 0));
      continue;
    }
    for (const Chunk& chunk : item.chunks) {
      // In bounds of a shape TilingProblem accepted, so this cannot overflow.
      const uint64_t needed =
          static_cast<uint64_t>(*Elements(chunk.sizes)) * c10::elementSize(item.dtype);
      RETURN_IF_ERROR(place(item.key, storage.at({item.key, chunk.offsets}), needed));
    }
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span& a = spans[i - 1];
    const Span& b = spans[i];
    if (a.file == b.file && a.length > 0 && b.length > 0 && b.offset < a.offset + a.length) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": the storage of '", a.key, "' and of '",
                                                     b.key, "' share bytes of one file"));
    }
  }

  StorageFiles files(dir);
  std::vector<Value::Entry> entries;
  for (const ItemMetadata& item : described) {
    if (!item.is_tensor) {
      ASSIGN_OR_RETURN(Value value,
                       files.Read(storage.at({item.key, std::nullopt}), checkpoint.warnings));
      entries.emplace_back(DictKey(item.key), std::move(value));
      continue;
    }
    ASSIGN_OR_RETURN(
        at::Tensor full,
        CatchTorchErrors(
            [&] { return at::empty(item.size, at::TensorOptions().dtype(item.dtype)); },
            absl::StatusCode::kResourceExhausted));
    for (const Chunk& chunk : item.chunks) {
      ASSIGN_OR_RETURN(const Value piece,
                       files.Read(storage.at({item.key, chunk.offsets}), checkpoint.warnings));
      const std::string where =
          absl::StrCat(dir, ": '", item.key, "' chunk at ", DimsText(chunk.offsets));
      if (!piece.is_tensor()) {
        return absl::InvalidArgumentError(absl::StrCat(where, " holds no tensor"));
      }
      const at::Tensor& tensor = piece.tensor();
      if (tensor.scalar_type() != item.dtype ||
          std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()) != chunk.sizes) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " holds ", c10::toString(tensor.scalar_type()), " ",
            DimsText({tensor.sizes().begin(), tensor.sizes().end()}), " where the metadata says ",
            c10::toString(item.dtype), " ", DimsText(chunk.sizes)));
      }
      RETURN_IF_ERROR(CatchTorchErrors([&] {
        at::Tensor region = full;
        for (size_t d = 0; d < chunk.sizes.size(); ++d) {
          region = region.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
        }
        region.copy_(tensor);
      }));
    }
    entries.emplace_back(DictKey(item.key), Value::Tensor(std::move(full)));
  }

  // A 2.x planner flattens nested state dicts ("model.fc.weight") and says how in planner_data.
  checkpoint.root = Value::Dict();
  for (Value::Entry& entry : entries) {
    const Value* path = planner_data != nullptr && planner_data->is_dict()
                            ? planner_data->Find(entry.first)
                            : nullptr;
    if (path != nullptr && path->is_sequence() && !path->items().empty()) {
      RETURN_IF_ERROR(Nest(checkpoint.root, path->items(), std::move(entry.second),
                           absl::StrCat(dir, ": '", entry.first.string_key(), "'")));
    } else if (checkpoint.root.Find(entry.first) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": '", entry.first.string_key(),
                                                     "' is also where planner_data nests others"));
    } else {
      checkpoint.root.Set(std::move(entry.first), std::move(entry.second));
    }
  }
  // pickle.warnings name the metadata's own classes (kept as data, as they should be) and the
  // pieces of it this reader does not use (layout, memory format): nothing a user must hear.
  return checkpoint;
}

}  // namespace ckpt
