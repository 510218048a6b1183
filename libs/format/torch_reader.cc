// ReadTorchFile and the two torch.save formats: torch_zip (a zip archive of data.pkl and one
// record per storage) and torch_legacy (a stream of pickles followed by the storages' bytes).
// What both share (Value accessors, storages, the tensor-rebuilding hooks) is in
// internal/torch_hooks.h.

#include "libs/format/torch_reader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "c10/core/Storage.h"
#include "libs/format/internal/torch_hooks.h"
#include "libs/format/pickle_reader.h"
#include "libs/format/torchscript_archive.h"
#include "libs/format/zip_reader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/tensor/dtype.h"

namespace ckpt {
namespace {

using torch_reader_internal::AllocateStorage;
using torch_reader_internal::AsInt;
using torch_reader_internal::AsText;
using torch_reader_internal::ByteSwap;
using torch_reader_internal::GlobalName;
using torch_reader_internal::StorageBytes;
using torch_reader_internal::StorageDType;
using torch_reader_internal::StorageValue;
using torch_reader_internal::TorchHooks;

// Storage bytes are copied as they are where the file is little-endian (legacy files always, zip
// files unless their byteorder record says "big").
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ckpt reads torch files on "
              "little-endian hosts only");

// The first pickle of a legacy file: torch.serialization.MAGIC_NUMBER.
constexpr absl::string_view kLegacyMagic = "119547037146038801333356";
constexpr int64_t kLegacyProtocolVersion = 1001;
// data.pkl is read whole; a bigger one is not a checkpoint this reader should trust.
constexpr uint64_t kMaxPickleBytes = uint64_t{4} << 30;
// One TorchScript source file (code/...py) or extra file; a ResNet-50's largest is ~20 KB.
constexpr uint64_t kMaxTorchScriptSourceBytes = uint64_t{64} << 20;
// Newest "version" record this reader was written against (PyTorch 1.13 writes 3).
constexpr int64_t kNewestKnownZipVersion = 3;

// --- torch_zip --------------------------------------------------------------------------------

class ZipHooks : public TorchHooks {
 public:
  ZipHooks(const ZipReader& zip, std::string prefix, bool big_endian)
      : zip_(zip), prefix_(std::move(prefix)), big_endian_(big_endian) {}

  // ('storage', storage_type, key, location, numel)
  absl::StatusOr<PersistentObject> PersistentLoad(const Value& pid) override {
    if (!pid.is_tuple() || pid.items().size() < 5) {
      return absl::InvalidArgumentError("expected ('storage', type, key, location, numel)");
    }
    const std::vector<Value>& a = pid.items();
    ASSIGN_OR_RETURN(std::string kind, AsText(a[0], "persistent id kind"));
    if (kind != "storage") {
      return absl::InvalidArgumentError(absl::StrCat("unknown persistent id kind '", kind, "'"));
    }
    ASSIGN_OR_RETURN(DType dtype, StorageDType(a[1]));
    ASSIGN_OR_RETURN(std::string key, AsText(a[2], "storage key"));
    ASSIGN_OR_RETURN(std::string location, AsText(a[3], "storage location"));
    ASSIGN_OR_RETURN(int64_t numel, AsInt(a[4], "storage size"));
    auto it = storages_.find(key);
    if (it != storages_.end()) {
      if ((it->second.dtype != dtype || it->second.numel != numel) && numel == 0 &&
          it->second.numel == 0) {
        // torch lets an empty storage be viewed as any dtype (there is no byte to disagree
        // on): each view gets an empty storage of its own dtype.
        ASSIGN_OR_RETURN(c10::Storage empty, AllocateStorage(0));
        PersistentObject object;
        ASSIGN_OR_RETURN(object.value, StorageValue(empty, dtype, 0, location, warnings()));
        return object;
      }
      if (it->second.dtype != dtype || it->second.numel != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("storage '", key, "' is referenced as ", numel, " x ", DTypeName(dtype),
                         " and earlier as ", it->second.numel, " x ", DTypeName(it->second.dtype)));
      }
      PersistentObject object;
      object.value = it->second.value;
      return object;
    }
    ASSIGN_OR_RETURN(int64_t nbytes, ByteLengthOf(dtype, {numel}));
    const std::string record_name = absl::StrCat(prefix_, "data/", key);
    const ZipEntry* record = zip_.Find(record_name);
    if (record == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage record '", record_name, "' is missing from the archive"));
    }
    if (record->uncompressed_size != static_cast<uint64_t>(nbytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "record '", record_name, "' holds ", record->uncompressed_size,
          " bytes but the pickle expects ", numel, " x ", DTypeName(dtype), " = ", nbytes));
    }
    // Checks the record lies inside the file before allocating its size.
    RETURN_IF_ERROR(zip_.DataOffset(*record).status());
    ASSIGN_OR_RETURN(c10::Storage storage, AllocateStorage(nbytes));
    if (nbytes > 0) {
      RETURN_IF_ERROR(zip_.Read(*record, absl::MakeSpan(StorageBytes(storage), nbytes)));
      if (big_endian_) ByteSwap(StorageBytes(storage), nbytes, dtype);
    } else {
      RETURN_IF_ERROR(zip_.Read(*record, absl::Span<char>()));
    }
    ASSIGN_OR_RETURN(Value value, StorageValue(storage, dtype, numel, location, warnings()));
    storages_.emplace(key, Stored{dtype, numel, value});
    PersistentObject object;
    object.value = std::move(value);
    return object;
  }

 private:
  struct Stored {
    DType dtype;
    int64_t numel;
    Value value;
  };
  const ZipReader& zip_;
  const std::string prefix_;
  const bool big_endian_;
  absl::flat_hash_map<std::string, Stored> storages_;
};

// The state dict of the TorchScript module `module` read from the archive `zip` (entries under
// `prefix`): its classes' parameter and buffer lists come from the code/ sources, and the
// optional extra/state_dict_keys.txt selects the persistent keys.
absl::StatusOr<Value> TorchScriptWeights(const ZipReader& zip, const std::string& prefix,
                                         const std::string& name, const Value& module) {
  TorchScriptClasses classes;
  for (const ZipEntry& entry : zip.entries()) {
    absl::string_view path = entry.name;
    if (!absl::ConsumePrefix(&path, prefix) || !absl::StartsWith(path, "code/") ||
        !absl::EndsWith(path, ".py")) {
      continue;
    }
    ASSIGN_OR_RETURN(std::string text, zip.ReadToString(entry, kMaxTorchScriptSourceBytes));
    if (absl::Status added = AddTorchScriptClasses(path, text, &classes); !added.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", added.message()));
    }
  }
  std::optional<std::vector<std::string>> keys;
  if (const ZipEntry* listed = zip.Find(prefix + "extra/state_dict_keys.txt")) {
    ASSIGN_OR_RETURN(std::string text, zip.ReadToString(*listed, kMaxTorchScriptSourceBytes));
    keys.emplace();
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
      keys->emplace_back(absl::StripAsciiWhitespace(line));
    }
  }
  absl::StatusOr<Value> state_dict = TorchScriptStateDict(module, classes, keys ? &*keys : nullptr);
  if (!state_dict.ok()) {
    return absl::Status(
        state_dict.status().code(),
        absl::StrCat(name, ": TorchScript archive: ", state_dict.status().message()));
  }
  return state_dict;
}

absl::StatusOr<TorchFile> ReadZipCheckpoint(const ByteSource& source) {
  ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(&source));
  const ZipEntry* pickle = nullptr;
  std::string prefix;
  std::vector<std::string> torchscript_markers;
  for (const ZipEntry& entry : zip.entries()) {
    const size_t slash = entry.name.find('/');
    if (slash == std::string::npos) continue;
    const absl::string_view rest = absl::string_view(entry.name).substr(slash + 1);
    if (rest == "constants.pkl" || absl::StartsWith(rest, "code/")) {
      torchscript_markers.push_back(entry.name);
    }
    if (rest == "data.pkl") {
      if (pickle != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(source.name(), ": two pickles, '",
                                                       pickle->name, "' and '", entry.name, "'"));
      }
      pickle = &entry;
      prefix = entry.name.substr(0, slash + 1);
    }
  }
  const bool torchscript = !torchscript_markers.empty();
  if (pickle == nullptr) {
    std::vector<std::string> names;
    for (const ZipEntry& entry : zip.entries()) {
      if (names.size() == 5) {
        names.push_back("...");
        break;
      }
      names.push_back(entry.name);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source.name(),
                     " is a zip archive without <name>/data.pkl, so not a torch.save file "
                     "(entries: ",
                     names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }

  TorchFile file;
  file.format = "torch_zip";
  bool big_endian = false;
  if (const ZipEntry* byteorder = zip.Find(prefix + "byteorder")) {
    ASSIGN_OR_RETURN(std::string order, zip.ReadToString(*byteorder, 64));
    const absl::string_view trimmed = absl::StripAsciiWhitespace(order);
    if (trimmed == "big") {
      big_endian = true;
    } else if (trimmed != "little") {
      return absl::InvalidArgumentError(absl::StrCat(source.name(), ": record '", byteorder->name,
                                                     "' says '", absl::CHexEscape(trimmed),
                                                     "', expected 'little' or 'big'"));
    }
  }
  for (const std::string& name : {prefix + "version", prefix + ".data/version"}) {
    const ZipEntry* version = zip.Find(name);
    if (version == nullptr) continue;
    ASSIGN_OR_RETURN(std::string text, zip.ReadToString(*version, 64));
    int64_t number;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &number)) {
      return absl::InvalidArgumentError(absl::StrCat(source.name(), ": record '", name,
                                                     "' is not a version number: '",
                                                     absl::CHexEscape(text), "'"));
    }
    if (number > kNewestKnownZipVersion) {
      file.warnings.push_back(absl::StrCat(source.name(), ": format version ", number,
                                           " is newer than ", kNewestKnownZipVersion,
                                           ", the newest this reader knows"));
    }
    break;
  }
  ASSIGN_OR_RETURN(std::string pickle_bytes, zip.ReadToString(*pickle, kMaxPickleBytes));
  const std::string pickle_name = absl::StrCat(source.name(), ": ", pickle->name);
  std::unique_ptr<ByteSource> pickle_source = MemorySource(pickle_bytes, pickle_name);
  ZipHooks hooks(zip, prefix, big_endian);
  PickleOptions options;
  options.name = pickle_name;
  ASSIGN_OR_RETURN(PickleResult result, ReadPickle(*pickle_source, 0, options, &hooks));
  if (torchscript) {
    // The pickle is the module as objects of its TorchScript classes; what a checkpoint reader
    // wants is its state_dict(), which the classes' declarations in code/ define.
    ASSIGN_OR_RETURN(file.root, TorchScriptWeights(zip, prefix, source.name(), result.value));
    file.format = "torchscript";
    for (std::string& warning : result.warnings) {
      // Every module class is an opaque object to the pickle reader, and TorchScript's typed
      // containers (torch.jit._pickle.build_intlist, ...) hold plain attributes: expected here.
      if (!absl::StrContains(warning, "__torch__.") &&
          !absl::StrContains(warning, "torch.jit._pickle.")) {
        file.warnings.push_back(std::move(warning));
      }
    }
    file.warnings.push_back(absl::StrCat(
        source.name(), ": a TorchScript archive of ", result.value.opaque_class_name(), ": read ",
        file.root.entries().size(),
        " parameters and buffers as its state_dict() without running "
        "its code",
        zip.Find(prefix + "extra/state_dict_keys.txt") != nullptr
            ? " (keys as its extra/state_dict_keys.txt lists them)"
            : " (like torch.jit.load's state_dict(), it includes any non-persistent buffers)"));
    return file;
  }
  file.root = std::move(result.value);
  for (std::string& warning : result.warnings) file.warnings.push_back(std::move(warning));
  return file;
}

// --- torch_legacy -----------------------------------------------------------------------------

class LegacyHooks : public TorchHooks {
 public:
  explicit LegacyHooks(const ByteSource& source) : source_(source) {}

  // ('storage', type, root_key, location, numel, view_metadata) or
  // ('module', class, source_file, source).
  absl::StatusOr<PersistentObject> PersistentLoad(const Value& pid) override {
    if (!pid.is_tuple() || pid.items().size() < 2) {
      return absl::InvalidArgumentError("expected ('storage', ...) or ('module', ...)");
    }
    const std::vector<Value>& a = pid.items();
    ASSIGN_OR_RETURN(std::string kind, AsText(a[0], "persistent id kind"));
    PersistentObject object;
    if (kind == "module") {
      std::optional<std::string> name = GlobalName(a[1]);
      if (!name.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("module persistent id without a class: ", a[1].DebugString()));
      }
      object.global_name = *name;
      return object;
    }
    if (kind != "storage" || a.size() < 5) {
      return absl::InvalidArgumentError(absl::StrCat("unknown persistent id kind '", kind, "'"));
    }
    ASSIGN_OR_RETURN(DType dtype, StorageDType(a[1]));
    ASSIGN_OR_RETURN(std::string key, AsText(a[2], "storage key"));
    ASSIGN_OR_RETURN(std::string location, AsText(a[3], "storage location"));
    ASSIGN_OR_RETURN(int64_t numel, AsInt(a[4], "storage size"));
    auto it = roots_.find(key);
    if (it == roots_.end()) {
      ASSIGN_OR_RETURN(int64_t nbytes, ByteLengthOf(dtype, {numel}));
      // Every storage's bytes follow the pickles in the same file.
      if (static_cast<uint64_t>(nbytes) > source_.size() - std::min(allocated_, source_.size())) {
        return absl::DataLossError(absl::StrCat("storage '", key, "' claims ", nbytes,
                                                " bytes; the file has only ", source_.size(),
                                                " in all"));
      }
      allocated_ += nbytes;
      ASSIGN_OR_RETURN(c10::Storage storage, AllocateStorage(nbytes));
      ASSIGN_OR_RETURN(Value value, StorageValue(storage, dtype, numel, location, warnings()));
      it = roots_.emplace(key, Root{storage, dtype, numel, std::move(value), false}).first;
      order_.push_back(key);
    } else if (it->second.dtype != dtype || it->second.numel != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage '", key, "' is referenced as ", numel, " x ", DTypeName(dtype),
                       " and earlier as ", it->second.numel, " x ", DTypeName(it->second.dtype)));
    }
    const Root& root = it->second;
    if (a.size() > 5 && !a[5].is_none()) {
      // (view_key, offset, size) in elements: a slice of the root storage (PyTorch < 0.4).
      const Value& view = a[5];
      if (!view.is_tuple() || view.items().size() != 3) {
        return absl::InvalidArgumentError(absl::StrCat(
            "view metadata: expected (key, offset, size), found ", view.DebugString()));
      }
      ASSIGN_OR_RETURN(std::string view_key, AsText(view.items()[0], "view key"));
      ASSIGN_OR_RETURN(int64_t offset, AsInt(view.items()[1], "view offset"));
      ASSIGN_OR_RETURN(int64_t size, AsInt(view.items()[2], "view size"));
      auto view_it = views_.find(view_key);
      if (view_it != views_.end()) {
        object.value = view_it->second;
        return object;
      }
      if (offset < 0 || size < 0 || offset > root.numel || size > root.numel - offset ||
          !root.value.is_tensor()) {
        return absl::InvalidArgumentError(absl::StrCat("storage view [", offset, ", +", size,
                                                       ") outside storage '", key, "' of ",
                                                       root.numel, " elements"));
      }
      ASSIGN_OR_RETURN(at::Tensor narrowed, CatchTorchErrors([&] {
                         return root.value.tensor().narrow(0, offset, size);
                       }));
      object.value = Value::Tensor(std::move(narrowed), location);
      views_.emplace(view_key, object.value);
      return object;
    }
    object.value = root.value;
    return object;
  }

  // Reads the storage data section that starts at `offset`, in the order of `keys`; returns the
  // offset after it.
  absl::StatusOr<uint64_t> ReadStorages(const std::vector<std::string>& keys, uint64_t offset) {
    for (const std::string& key : keys) {
      auto it = roots_.find(key);
      if (it == roots_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(source_.name(), ": storage '", key,
                                                       "' has data at offset ", offset,
                                                       " but no tensor refers to it"));
      }
      Root& root = it->second;
      if (root.filled) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_.name(), ": storage '", key, "' is listed twice"));
      }
      char count_bytes[8];
      RETURN_IF_ERROR(source_.ReadAt(offset, absl::MakeSpan(count_bytes, 8)));
      int64_t count;  // little-endian, as this host is (the static_assert above)
      std::memcpy(&count, count_bytes, 8);
      if (count != root.numel) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_.name(), ": offset ", offset, ": storage '", key, "' has ", count,
                         " elements in the data section but the pickle expects ", root.numel));
      }
      const uint64_t nbytes = static_cast<uint64_t>(root.numel) * ElementSize(root.dtype);
      if (nbytes > 0) {
        RETURN_IF_ERROR(
            source_.ReadAt(offset + 8, absl::MakeSpan(StorageBytes(root.storage), nbytes)));
      }
      root.filled = true;
      offset += 8 + nbytes;
    }
    for (const std::string& key : order_) {
      if (!roots_.at(key).filled) {
        return absl::InvalidArgumentError(absl::StrCat(source_.name(), ": storage '", key,
                                                       "' is used by the pickle but has no data"));
      }
    }
    return offset;
  }

 private:
  struct Root {
    c10::Storage storage;
    DType dtype;
    int64_t numel;
    Value value;
    bool filled;
  };
  const ByteSource& source_;
  uint64_t allocated_ = 0;
  absl::flat_hash_map<std::string, Root> roots_;
  std::vector<std::string> order_;
  absl::flat_hash_map<std::string, Value> views_;
};

absl::Status NotATorchFile(const ByteSource& source, absl::string_view head,
                           absl::string_view detail) {
  std::string hint;
  if (head.size() >= 9 && head[8] == '{') {
    hint = " (it looks like a safetensors file)";
  } else if (absl::StartsWith(head, "\x93NUMPY")) {
    hint = " (it looks like a numpy .npy file)";
  } else if (absl::StartsWith(head, "\x89HDF")) {
    hint = " (it looks like an HDF5 file)";
  } else if (absl::StartsWith(head, "GGUF")) {
    hint = " (it looks like a GGUF file)";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source.name(), " is not a torch.save file", hint,
      ": it is neither a zip archive nor a legacy torch.save pickle stream (first bytes: '",
      absl::CHexEscape(head.substr(0, 16)), "')", detail.empty() ? "" : "; ", detail));
}

absl::StatusOr<TorchFile> ReadLegacyCheckpoint(const ByteSource& source, absl::string_view head) {
  PickleOptions options;
  options.name = absl::StrCat(source.name(), ": legacy magic-number pickle");
  absl::StatusOr<PickleResult> magic = ReadPickle(source, 0, options, nullptr);
  if (!magic.ok()) return NotATorchFile(source, head, magic.status().message());
  const Value& number = magic->value;
  const bool is_magic = number.is_opaque() && number.opaque_class_name() == "builtins.int" &&
                        number.opaque_args().is_tuple() &&
                        number.opaque_args().items().size() == 1 &&
                        number.opaque_args().items()[0].is_string() &&
                        number.opaque_args().items()[0].string_value() == kLegacyMagic;
  if (!is_magic) {
    return NotATorchFile(source, head,
                         absl::StrCat("its first pickle is ", number.DebugString().substr(0, 80),
                                      ", not torch.save's magic number"));
  }
  options.name = absl::StrCat(source.name(), ": legacy protocol-version pickle");
  ASSIGN_OR_RETURN(PickleResult protocol, ReadPickle(source, magic->end_offset, options, nullptr));
  if (!protocol.value.is_int() || protocol.value.int_value() != kLegacyProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(source.name(), ": legacy protocol version ",
                                                   protocol.value.DebugString(), ", expected ",
                                                   kLegacyProtocolVersion));
  }
  options.name = absl::StrCat(source.name(), ": legacy sys_info pickle");
  ASSIGN_OR_RETURN(PickleResult sys_info,
                   ReadPickle(source, protocol.end_offset, options, nullptr));
  // sys_info's little_endian records the writing host's byte order only: the legacy writer
  // (THPStorage_writeFileRaw) stores every storage's count and elements little-endian whatever
  // the host, and torch's reader takes them as such, so this reader never swaps either.
  TorchFile file;
  file.format = "torch_legacy";
  LegacyHooks hooks(source);
  options.name =
      absl::StrCat(source.name(), ": legacy main pickle at offset ", sys_info.end_offset);
  ASSIGN_OR_RETURN(PickleResult main, ReadPickle(source, sys_info.end_offset, options, &hooks));
  options.name =
      absl::StrCat(source.name(), ": legacy storage-key pickle at offset ", main.end_offset);
  ASSIGN_OR_RETURN(PickleResult keys_pickle, ReadPickle(source, main.end_offset, options, nullptr));
  if (!keys_pickle.value.is_sequence()) {
    return absl::InvalidArgumentError(absl::StrCat(options.name,
                                                   ": expected a list of keys, found ",
                                                   keys_pickle.value.DebugString().substr(0, 80)));
  }
  std::vector<std::string> keys;
  for (const Value& key : keys_pickle.value.items()) {
    ASSIGN_OR_RETURN(std::string text, AsText(key, options.name));
    keys.push_back(std::move(text));
  }
  ASSIGN_OR_RETURN(uint64_t end, hooks.ReadStorages(keys, keys_pickle.end_offset));
  if (end != source.size()) {
    file.warnings.push_back(absl::StrCat(source.name(), ": ", source.size() - end,
                                         " bytes after the last storage ignored"));
  }
  RETURN_IF_ERROR(hooks.RebuildSetStateTensors(main.value));
  file.root = std::move(main.value);
  for (std::string& warning : main.warnings) file.warnings.push_back(std::move(warning));
  for (std::string& warning : hooks.warnings()) file.warnings.push_back(std::move(warning));
  return file;
}

bool IsTar(absl::string_view head) { return head.size() >= 262 && head.substr(257, 5) == "ustar"; }

}  // namespace

absl::StatusOr<TorchFile> ReadTorchSource(const ByteSource& source) {
  ASSIGN_OR_RETURN(std::string head, source.ReadString(0, std::min<uint64_t>(source.size(), 512)));
  if (ZipReader::HasZipMagic(head)) return ReadZipCheckpoint(source);
  if (IsTar(head)) {
    return absl::UnimplementedError(
        absl::StrCat(source.name(),
                     " is a tar archive: the torch.save format of PyTorch before 0.4, which "
                     "ckpt does not read; load it with an old PyTorch and save it again"));
  }
  if (head.empty()) return NotATorchFile(source, head, "the file is empty");
  return ReadLegacyCheckpoint(source, head);
}

absl::StatusOr<TorchFile> ReadTorchFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, OpenFileSource(path));
  return ReadTorchSource(*source);
}

absl::StatusOr<TorchFile> ReadTorchBytes(absl::string_view bytes, absl::string_view name) {
  std::unique_ptr<ByteSource> source = MemorySource(bytes, std::string(name));
  return ReadTorchSource(*source);
}

}  // namespace ckpt