#include "libs/format/checkpoint_file.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "libs/format/dcp_reader.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_reader.h"
#include "libs/format/zip_reader.h"
#include "libs/status/status_macros.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {
namespace {

// This host's available memory in bytes (MemAvailable in /proc/meminfo; the physical memory where
// that is missing); 0 when the system does not say.
uint64_t AvailableMemoryBytes() {
  if (FILE* meminfo = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), meminfo) != nullptr) {
      found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    }
    std::fclose(meminfo);
    if (found) return static_cast<uint64_t>(kib) * 1024;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * page_size : 0;
}

// The reader keeps a view as the file describes it (storage, size, stride), so reading costs
// only the stored bytes; convert and import then materialize every element. Refuses, before
// that, a file whose tensors would together take more than `max_expanded_bytes` beyond what the
// file stores for them: a broadcast (stride-0) or overlapping view claims memory (and output
// bytes) the file does not hold, so eight views of 4 bytes each can claim 30 GiB. Each such
// tensor counts its materialized bytes less its storage's; tensors no larger than their storage
// count nothing, so an ordinary checkpoint of any size is never refused.
absl::Status CheckExpansion(const std::string& path, const Value& root,
                            int64_t max_expanded_bytes) {
  if (max_expanded_bytes < 0) return absl::OkStatus();
  const uint64_t budget = max_expanded_bytes > 0 ? static_cast<uint64_t>(max_expanded_bytes)
                                                 : AvailableMemoryBytes() / kDefaultExpansionShare;
  if (budget == 0) return absl::OkStatus();
  const Expansion measured = MeasureExpansion(root);
  const uint64_t expansion = measured.bytes;
  const int views = measured.views;
  const std::string& largest = measured.widest;
  if (expansion <= budget) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      path, ": its tensors would take ", expansion,
      " bytes more once materialized than the file "
      "stores for them (",
      views, views == 1 ? " view" : " views", " wider than its storage; the widest, ", largest,
      " bytes), more than the expansion budget "
      "of ",
      budget, " bytes", max_expanded_bytes > 0 ? "" : " (1/8 of this host's available memory)",
      "; refused before allocating or writing anything. Raise the budget (ckpt "
      "--max-expanded-bytes, ReadCheckpointOptions.max_expanded_bytes) only if the machine has "
      "that memory and the destination that disk; `ckpt inspect` shows the file"));
}

// The root's entry at `path` ("a/b"), or NOT_FOUND listing what exists where the walk stopped.
absl::StatusOr<const Value*> FindByPath(const Value& root, absl::string_view path) {
  const Value* current = &root;
  std::string walked;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    const Value* state = current;
    if (current->is_opaque() && current->opaque_state().is_dict()) state = &current->opaque_state();
    const Value* next = nullptr;
    int64_t index = 0;
    if (state->is_dict()) {
      next = state->Find(std::string(part));
      if (next == nullptr && absl::SimpleAtoi(part, &index)) next = state->Find(index);
    } else if ((state->is_list() || state->is_tuple()) && absl::SimpleAtoi(part, &index) &&
               index >= 0 && index < static_cast<int64_t>(state->items().size())) {
      next = &state->items()[static_cast<size_t>(index)];  // "0": a list's first item.
    }
    if (next == nullptr) {
      std::vector<std::string> keys;
      if (state->is_dict()) {
        for (const auto& [key, value] : state->entries()) keys.push_back(key.DebugString());
      }
      return absl::NotFoundError(
          absl::StrCat("no '", part, "' at '", walked.empty() ? "<root>" : walked, "'",
                       keys.empty() ? std::string(" (not a dict)")
                                    : absl::StrCat("; keys there: ", absl::StrJoin(keys, ", "))));
    }
    absl::StrAppend(&walked, walked.empty() ? "" : "/", part);
    current = next;
  }
  return current;
}

// `file` (its root read) with the bundle found in it.
absl::StatusOr<CheckpointFile> WithBundle(CheckpointFile file,
                                          const ReadCheckpointOptions& options) {
  const std::string& path = file.path;
  if (options.model_key.empty()) {
    if (file.root.is_dict() && file.root.entries().empty()) {
      // An empty state dict is a valid (if useless) checkpoint.
      file.bundle.extra = Value::Dict();
    } else {
      absl::StatusOr<CheckpointBundle> bundle = ExtractCheckpointBundle(file.root);
      if (absl::IsNotFound(bundle.status()) && options.allow_no_model) {
        file.has_model = false;
        return file;
      }
      if (!bundle.ok()) {
        return absl::Status(bundle.status().code(),
                            absl::StrCat(path, ": ", bundle.status().message()));
      }
      file.bundle = *std::move(bundle);
    }
  } else {
    ASSIGN_OR_RETURN(const Value* model, FindByPath(file.root, options.model_key));
    absl::StatusOr<StateDict> state_dict = IsModuleObject(*model)
                                               ? StateDictFromModule(*model, &file.warnings)
                                               : StateDictFromTensorDict(*model);
    if (!state_dict.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", options.model_key,
                       "' is not a model state dict: ", state_dict.status().message()));
    }
    file.bundle.model = *std::move(state_dict);
    file.bundle.model_key_path = options.model_key;
    file.bundle.extra = file.root;
  }
  file.warnings.insert(file.warnings.end(), file.bundle.warnings.begin(),
                       file.bundle.warnings.end());
  return file;
}

}  // namespace

Expansion MeasureExpansion(const Value& root) {
  Expansion expansion;
  uint64_t widest = 0;
  std::function<void(const std::string&, const at::Tensor&)> measure;
  measure = [&](const std::string& key, const at::Tensor& tensor) {
    if (IsSparseTensor(tensor)) {  // no storage of its own: its parts are what was read.
      absl::StatusOr<SparseParts> sparse = SparsePartsOf(tensor);
      if (sparse.ok()) {
        for (const at::Tensor& part : sparse->parts) measure(key, part);
      }
      return;
    }
    // The reader checked that size and stride stay inside the storage, so numel * element size
    // fits in 64 bits (a view of n elements spans at most 2^63 of them).
    const uint64_t claimed =
        static_cast<uint64_t>(tensor.numel()) * static_cast<uint64_t>(tensor.element_size());
    const uint64_t stored = tensor.storage().nbytes();
    if (claimed <= stored) return;
    const uint64_t extra = claimed - stored;
    ++expansion.views;
    expansion.bytes = expansion.bytes > UINT64_MAX - extra ? UINT64_MAX : expansion.bytes + extra;
    if (extra > widest) {
      widest = extra;
      expansion.widest = absl::StrCat("'", key, "' of shape [", absl::StrJoin(tensor.sizes(), ", "),
                                      "] and stride [", absl::StrJoin(tensor.strides(), ", "),
                                      "] views ", stored, " stored bytes but would take ", claimed);
    }
  };
  root.ForEachTensor(measure);
  return expansion;
}

absl::string_view CheckpointFormatName(CheckpointFormat format) {
  switch (format) {
    case CheckpointFormat::kTorchZip:
      return "torch_zip";
    case CheckpointFormat::kTorchLegacy:
      return "torch_legacy";
    case CheckpointFormat::kSafetensors:
      return "safetensors";
    case CheckpointFormat::kTorchScript:
      return "torchscript";
    case CheckpointFormat::kDcp:
      return "dcp";
  }
  return "unknown";
}

absl::StatusOr<CheckpointFormat> DetectCheckpointFormat(const ByteSource& source) {
  std::string head(std::min<uint64_t>(source.size(), 16), '\0');
  RETURN_IF_ERROR(source.ReadAt(0, absl::MakeSpan(head)));
  if (ZipReader::HasZipMagic(head)) return CheckpointFormat::kTorchZip;
  // Legacy torch.save files begin with a pickle of the magic number: PROTO, then LONG1.
  if (head.size() >= 2 && head[0] == '\x80' && head[1] >= 2 && head[1] <= 5) {
    return CheckpointFormat::kTorchLegacy;
  }
  if (head.size() >= 9 && head[8] == '{') {
    uint64_t header_length = 0;
    std::memcpy(&header_length, head.data(), 8);
    if (header_length <= source.size() - 8) return CheckpointFormat::kSafetensors;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source.name(),
                   ": not a checkpoint ckpt can read (expected a torch.save zip or legacy file, "
                   "or safetensors)"));
}

absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path,
                                                  const ReadCheckpointOptions& options) {
  CheckpointFile file;
  file.path = path;
  if (IsDcpDirectory(path)) {
    ASSIGN_OR_RETURN(DcpCheckpoint dcp, ReadDcpDirectory(path));
    file.format = CheckpointFormat::kDcp;
    file.file_bytes = dcp.file_bytes;
    file.root = std::move(dcp.root);
    file.warnings = std::move(dcp.warnings);
    return WithBundle(std::move(file), options);
  }
  // Hugging Face's layout: a directory (sharded, or model.safetensors) or a shard index.
  ASSIGN_OR_RETURN(const HuggingFaceLayout layout, LocateHuggingFaceLayout(path));
  if (!layout.index.empty()) {
    ASSIGN_OR_RETURN(ShardedSafetensors sharded, ReadShardedSafetensors(layout.index));
    std::vector<Value::Entry> entries;
    for (const StateDict::Entry& entry : sharded.tensors) {
      entries.emplace_back(DictKey(entry.key), Value::Tensor(entry.tensor, entry.original_device));
    }
    file.format = CheckpointFormat::kSafetensors;
    file.file_bytes = sharded.file_bytes;
    file.root = Value::Dict(std::move(entries));
    file.metadata = std::move(sharded.metadata);
    file.warnings = std::move(sharded.warnings);
    return WithBundle(std::move(file), options);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source,
                   OpenFileSource(layout.file.empty() ? path : layout.file));
  file.file_bytes = source->size();
  ASSIGN_OR_RETURN(file.format, DetectCheckpointFormat(*source));
  if (file.format == CheckpointFormat::kSafetensors) {
    ASSIGN_OR_RETURN(SafetensorsFile safetensors, ReadSafetensors(*source));
    std::vector<Value::Entry> entries;
    for (const StateDict::Entry& entry : safetensors.tensors) {
      entries.emplace_back(DictKey(entry.key), Value::Tensor(entry.tensor, entry.original_device));
    }
    file.root = Value::Dict(std::move(entries));
    file.metadata = std::move(safetensors.header.metadata);
  } else {
    ASSIGN_OR_RETURN(TorchFile torch, ReadTorchSource(*source));
    if (torch.format == "torchscript") file.format = CheckpointFormat::kTorchScript;
    file.root = std::move(torch.root);
    file.warnings = std::move(torch.warnings);
    // safetensors has no strides: each of its tensors is exactly the bytes the file stores.
    RETURN_IF_ERROR(CheckExpansion(path, file.root, options.max_expanded_bytes));
  }
  return WithBundle(std::move(file), options);
}

}  // namespace ckpt
