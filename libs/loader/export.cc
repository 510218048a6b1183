#include "libs/loader/export.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/bundle.h"
#include "libs/format/dcp_writer.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_writer.h"
#include "libs/io/atomic_file.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/manifest_validation.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {
namespace {

// The reader an export reads through: the store's, but every tensor copied into a buffer of its
// own rather than mapped. A store reader shares one mapping per pack file among the tensors it
// maps, kept until the reader goes, so the pages of every tensor an export had mapped would stay
// in the process: an export of mapped tensors grew to the whole version (M2 measured 8.0 for 8
// tensors). A copied tensor's memory goes when the writer releases it.
class CopyingReader final : public VersionReader {
 public:
  explicit CopyingReader(const VersionReader& inner) : inner_(inner) {}
  const v1::Manifest& manifest() const override { return inner_.manifest(); }
  absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                const ChunkCallback& callback) const override {
    return inner_.ReadTensorChunks(meta, callback);
  }
  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination) const override {
    return inner_.ReadTensorInto(meta, destination);
  }
  absl::Status ReadTensorRange(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                               char* destination) const override {
    return inner_.ReadTensorRange(meta, begin, end, destination);
  }
  // MapTensorBytes: the default, which maps nothing.

 private:
  const VersionReader& inner_;
};

// The target a file export loads with: files hold CPU bytes, whatever device was asked for.
LoadTarget OnCpu(const LoadTarget& target) {
  LoadTarget cpu = target;
  cpu.device = DeviceSpec::Cpu();
  cpu.include_optimizer = false;
  cpu.include_scheduler = false;
  return cpu;
}

// What a safetensors export of a bundle request cannot hold.
std::vector<std::string> SafetensorsLeftOut(const v1::Manifest& manifest,
                                            const LoadTarget& target) {
  std::vector<std::string> left_out;
  if (!target.include_optimizer && !target.include_scheduler) return left_out;
  constexpr absl::string_view kWhy =
      ": safetensors holds tensors only (export a torch .pt for "
      "the whole bundle)";
  if (manifest.has_optimizer_state()) left_out.push_back(absl::StrCat("optimizer", kWhy));
  if (manifest.has_scheduler_state()) left_out.push_back(absl::StrCat("scheduler", kWhy));
  if (manifest.has_extra_state()) left_out.push_back(absl::StrCat("the other fields", kWhy));
  return left_out;
}

// Optimizer state is indexed by parameter position over the whole model: a subset may only drop
// tensors the optimizer does not index (buffers, frozen parameters), and only when the store
// knows which tensor each index is.
absl::Status CheckOptimizerAlignment(const v1::Manifest& manifest,
                                     const std::vector<PlannedTensor>& planned) {
  if (static_cast<int>(planned.size()) == manifest.tensors_size()) return absl::OkStatus();
  const std::string where = FormatVersionRef(manifest.model(), manifest.version());
  const std::string subset = absl::StrCat("the subset keeps ", planned.size(), " of ",
                                          manifest.tensors_size(), " model tensors");
  constexpr absl::string_view kWayOut =
      "; leave the optimizer out of the export, or select every tensor it indexes";
  if (manifest.optimizer_param_names().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", subset,
                     ", but its optimizer state is indexed by parameter position over "
                     "the whole model and the version does not record which tensor each index is",
                     kWayOut));
  }
  absl::flat_hash_set<std::string> kept;
  for (const PlannedTensor& tensor : planned) kept.insert(tensor.meta->key());
  std::vector<std::string> dropped;
  ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                   OptimizerParameterIndices(manifest.optimizer_state()));
  for (int64_t id : ids) {
    auto it = manifest.optimizer_param_names().find(id);
    if (it == manifest.optimizer_param_names().end()) {
      dropped.push_back(absl::StrCat(id, " (unnamed)"));
    } else if (!kept.contains(it->second)) {
      dropped.push_back(absl::StrCat(id, " (", it->second, ")"));
    }
  }
  if (dropped.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", subset,
                   ", but its optimizer state indexes parameters by position and would no "
                   "longer line up: the subset leaves out optimizer parameter(s) ",
                   absl::StrJoin(dropped, ", "), kWayOut));
}

// For a version that recorded no bundle layout (the trainer's, or one stored before layouts):
// {"epoch", "global_step", "model", "optimizer", "scheduler", <the other fields>}. Epoch and step
// come from the metadata when the other fields lack them and they are known: always for the
// trainer, otherwise when non-zero (an import of a file without them stores 0).
void DefaultLayout(const v1::Manifest& manifest, Value& extra, v1::BundleLayout& layout) {
  Value fields = Value::Dict();
  const bool trainer = manifest.metadata().source_format() == "trainer";
  const auto has = [&](const char* key) { return extra.is_dict() && extra.Find(key) != nullptr; };
  if ((trainer || manifest.metadata().epoch() != 0) && !has("epoch")) {
    fields.Set("epoch", Value::Int(manifest.metadata().epoch()));
  }
  if ((trainer || manifest.metadata().global_step() != 0) && !has("global_step") && !has("step")) {
    fields.Set("global_step", Value::Int(manifest.metadata().global_step()));
  }
  layout.Clear();
  int position = static_cast<int>(fields.entries().size());
  for (auto part : {v1::BundleLayout::PART_MODEL, v1::BundleLayout::PART_OPTIMIZER,
                    v1::BundleLayout::PART_SCHEDULER}) {
    v1::BundleLayout::Placement* placement = layout.add_placements();
    placement->set_part(part);
    placement->add_path()->set_string_key(part == v1::BundleLayout::PART_MODEL       ? "model"
                                          : part == v1::BundleLayout::PART_OPTIMIZER ? "optimizer"
                                                                                     : "scheduler");
    placement->set_position(position++);
  }
  if (extra.is_dict()) {
    for (Value::Entry& entry : extra.mutable_entries()) {
      if (fields.Find(entry.first) == nullptr) fields.Set(entry.first, std::move(entry.second));
    }
  } else if (!extra.is_none()) {
    fields.Set("extra", std::move(extra));
  }
  extra = std::move(fields);
}

// The model tensors `target` selects, as placeholders in `deferred` whose bytes are read, cast
// to the target's dtype and handed to the writer one tensor at a time, when it reaches them.
absl::StatusOr<StateDict> DeferredModel(const VersionReader& reader, const LoadTarget& target,
                                        DeferredTensors& deferred) {
  ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(reader.manifest(), target));
  StateDict model;
  for (PlannedTensor& tensor : planned) {
    const v1::TensorMeta* meta = tensor.meta;
    const DTypePolicy policy = target.dtype;
    if (meta->has_sparse()) {
      // A placeholder is one dense storage; a sparse tensor is several: read it now (sparse
      // tensors are small next to the dense ones the writer streams).
      ASSIGN_OR_RETURN(at::Tensor stored, ReadTensor(reader, *meta));
      ASSIGN_OR_RETURN(at::Tensor placed, PlaceTensor(stored, DeviceSpec::Cpu(), policy));
      RETURN_IF_ERROR(
          model.Insert(std::move(tensor.key), std::move(placed), meta->original_device()));
      continue;
    }
    ASSIGN_OR_RETURN(at::Tensor placeholder,
                     deferred.Add(policy.Apply(static_cast<DType>(meta->dtype())),
                                  std::vector<int64_t>(meta->shape().begin(), meta->shape().end()),
                                  [&reader, meta, policy]() -> absl::StatusOr<at::Tensor> {
                                    ASSIGN_OR_RETURN(at::Tensor stored, ReadTensor(reader, *meta));
                                    return PlaceTensor(stored, DeviceSpec::Cpu(), policy);
                                  }));
    RETURN_IF_ERROR(
        model.Insert(std::move(tensor.key), std::move(placeholder), meta->original_device()));
  }
  return model;
}

// A value tree of the manifest (optimizer, scheduler, other fields) with placeholders for its
// tensors, read as stored when the writer reaches them.
absl::StatusOr<Value> DeferredValueTree(const VersionReader& reader, const v1::Value& tree,
                                        DeferredTensors& deferred) {
  return ValueTreeFromManifest(
      reader.manifest(), tree, [&](const v1::TensorMeta& meta) -> absl::StatusOr<at::Tensor> {
        if (meta.has_sparse()) return ReadTensor(reader, meta);  // as in DeferredModel.
        return deferred.Add(static_cast<DType>(meta.dtype()),
                            std::vector<int64_t>(meta.shape().begin(), meta.shape().end()),
                            [&reader, &meta] { return ReadTensor(reader, meta); });
      });
}

// The whole bundle of `reader`'s version as `target` adapts it, its tensors deferred;
// `model_tensors` gets how many model tensors it holds.
absl::StatusOr<AssembledBundle> BundleOf(const VersionReader& reader, const LoadTarget& target,
                                         DeferredTensors& deferred, int64_t& model_tensors) {
  const v1::Manifest& manifest = reader.manifest();
  const std::string where = FormatVersionRef(manifest.model(), manifest.version());
  // A version without optimizer state (saved without one, or retention dropped it) is exported
  // without it, as one without a scheduler is, and left_out says why.
  const bool with_optimizer = target.include_optimizer && manifest.has_optimizer_state();
  const LoadTarget on_cpu = OnCpu(target);
  if (with_optimizer) {
    ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(manifest, on_cpu));
    RETURN_IF_ERROR(CheckOptimizerAlignment(manifest, planned));
  }
  ASSIGN_OR_RETURN(StateDict model, DeferredModel(reader, on_cpu, deferred));
  model_tensors = static_cast<int64_t>(model.size());
  BundleParts parts;
  parts.model = StateDictToValue(model);
  if (with_optimizer) {
    ASSIGN_OR_RETURN(parts.optimizer,
                     DeferredValueTree(reader, manifest.optimizer_state(), deferred));
  }
  if (target.include_scheduler && manifest.has_scheduler_state()) {
    ASSIGN_OR_RETURN(parts.scheduler,
                     DeferredValueTree(reader, manifest.scheduler_state(), deferred));
  }
  if (manifest.has_extra_state()) {
    ASSIGN_OR_RETURN(parts.extra, DeferredValueTree(reader, manifest.extra_state(), deferred));
  }
  v1::BundleLayout layout = manifest.bundle_layout();
  if (!IsBundleLayout(layout)) DefaultLayout(manifest, parts.extra, layout);

  std::vector<std::string> left_out;
  if (manifest.has_optimizer_state() && !target.include_optimizer) {
    left_out.push_back("optimizer: not asked for");
  } else if (!manifest.has_optimizer_state() && target.include_optimizer) {
    const auto dropped = std::find_if(
        manifest.warnings().begin(), manifest.warnings().end(), [](const std::string& warning) {
          return absl::StartsWith(warning, "optimizer state dropped by retention");
        });
    left_out.push_back(dropped != manifest.warnings().end()
                           ? absl::StrCat("optimizer: ", *dropped)
                           : absl::StrCat("optimizer: ", where, " holds none (saved without one)"));
  }
  if (!manifest.has_scheduler_state() && target.include_scheduler) {
    left_out.push_back("scheduler: the version holds none");
  } else if (manifest.has_scheduler_state() && !target.include_scheduler) {
    left_out.push_back("scheduler: not asked for");
  }
  ASSIGN_OR_RETURN(AssembledBundle bundle, AssembleBundle(layout, std::move(parts)));
  bundle.left_out.insert(bundle.left_out.begin(), left_out.begin(), left_out.end());
  return bundle;
}

// One safetensors file of some of the adapted model tensors, planned from the manifest.
struct PlannedSafetensors {
  SafetensorsLayout layout;
  absl::flat_hash_map<std::string, const PlannedTensor*> by_name;
};

absl::StatusOr<PlannedSafetensors> PlanSafetensorsFile(
    const v1::Manifest& manifest, const LoadTarget& target,
    const std::vector<const PlannedTensor*>& tensors) {
  PlannedSafetensors plan;
  std::vector<SafetensorsTensorSpec> specs;
  for (const PlannedTensor* tensor : tensors) {
    if (tensor->meta->has_sparse()) {
      return DenseOnlyFormatError("safetensors", tensor->key, SparseLayoutName(*tensor->meta));
    }
    SafetensorsTensorSpec& spec = specs.emplace_back();
    spec.name = tensor->key;
    spec.dtype = target.dtype.Apply(static_cast<DType>(tensor->meta->dtype()));
    spec.shape.assign(tensor->meta->shape().begin(), tensor->meta->shape().end());
    plan.by_name.emplace(tensor->key, tensor);
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"ckpt.version", FormatVersionRef(manifest.model(), manifest.version())}};
  ASSIGN_OR_RETURN(plan.layout, PlanSafetensors(specs, metadata));
  return plan;
}

// Writes `plan`'s file to `write`, one tensor at a time: read, cast, written, released.
// `written(bytes)` after each tensor.
absl::Status StreamSafetensorsFile(const VersionReader& reader, const LoadTarget& target,
                                   const PlannedSafetensors& plan,
                                   const std::function<absl::Status(absl::string_view)>& write,
                                   const std::function<void(uint64_t)>& written) {
  RETURN_IF_ERROR(write(plan.layout.header_bytes));
  written(plan.layout.header_bytes.size());
  for (const SafetensorsTensorInfo& info : plan.layout.tensors) {
    const PlannedTensor& tensor = *plan.by_name.at(info.name);
    ASSIGN_OR_RETURN(at::Tensor stored, ReadTensor(reader, *tensor.meta));
    ASSIGN_OR_RETURN(at::Tensor cast, PlaceTensor(stored, DeviceSpec::Cpu(), target.dtype));
    stored = at::Tensor();
    RETURN_IF_ERROR(CatchTorchErrors([&] { cast = cast.contiguous(); }));
    const uint64_t nbytes = cast.nbytes();
    if (nbytes != info.end - info.begin) {
      return absl::InternalError(absl::StrCat("safetensors export: tensor '", info.name, "' has ",
                                              nbytes, " bytes, the layout planned ",
                                              info.end - info.begin));
    }
    if (nbytes > 0) {
      RETURN_IF_ERROR(write(absl::string_view(static_cast<const char*>(cast.data_ptr()), nbytes)));
    }
    written(nbytes);
  }
  return absl::OkStatus();
}

std::vector<const PlannedTensor*> Pointers(const std::vector<PlannedTensor>& planned) {
  std::vector<const PlannedTensor*> pointers;
  pointers.reserve(planned.size());
  for (const PlannedTensor& tensor : planned) pointers.push_back(&tensor);
  return pointers;
}

// Streams a safetensors file of the adapted model tensors to `sink`, one tensor at a time.
absl::StatusOr<ExportResult> StreamSafetensors(const VersionReader& reader,
                                               const ExportOptions& options,
                                               const ExportSink& sink) {
  const v1::Manifest& manifest = reader.manifest();
  const LoadTarget target = OnCpu(options.target);
  ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(manifest, target));
  ASSIGN_OR_RETURN(PlannedSafetensors plan,
                   PlanSafetensorsFile(manifest, target, Pointers(planned)));
  ExportResult result;
  result.version = FormatVersionRef(manifest.model(), manifest.version());
  result.left_out = SafetensorsLeftOut(manifest, options.target);
  const uint64_t total = plan.layout.total_bytes;
  uint64_t done = 0;
  RETURN_IF_ERROR(StreamSafetensorsFile(
      reader, target, plan, [&](absl::string_view bytes) { return sink(result, total, bytes); },
      [&](uint64_t bytes) {
        done += bytes;
        if (done == bytes) return;  // The header.
        ++result.tensors;
        if (options.progress) options.progress(done, total);
      }));
  result.file_bytes = total;
  return result;
}

// 0 when `path` does not exist; else its S_IFMT type.
absl::StatusOr<mode_t> FileType(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0) return info.st_mode & S_IFMT;
  if (errno == ENOENT) return 0;
  return ErrnoToStatus(errno, "looking at", path);
}

absl::Status RemoveIfPresent(const std::string& path) {
  if (unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return ErrnoToStatus(errno, "removing the stale", path);
}

// Whether `name` is a shard name of Hugging Face's layout (model-NNNNN-of-NNNNN.safetensors).
bool IsShardName(absl::string_view name) {
  constexpr absl::string_view kPattern = "model-#####-of-#####.safetensors";
  if (name.size() != kPattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (kPattern[i] == '#' ? !absl::ascii_isdigit(name[i]) : name[i] != kPattern[i]) return false;
  }
  return true;
}

// Hugging Face's sharded layout in the directory `dir` (created if missing): every shard written
// atomically, one tensor at a time, then the index, then shards of an earlier export removed. A
// stale index or model.safetensors is removed first, so a reader never pairs an old index with
// new shards.
absl::StatusOr<ExportResult> WriteSafetensorsShards(const VersionReader& reader,
                                                    const ExportOptions& options,
                                                    const std::string& dir) {
  const v1::Manifest& manifest = reader.manifest();
  const LoadTarget target = OnCpu(options.target);
  ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(manifest, target));
  std::vector<uint64_t> sizes;
  uint64_t total_size = 0;
  for (const PlannedTensor& tensor : planned) {
    ASSIGN_OR_RETURN(const int64_t bytes,
                     ByteLengthOf(target.dtype.Apply(static_cast<DType>(tensor.meta->dtype())),
                                  std::vector<int64_t>(tensor.meta->shape().begin(),
                                                       tensor.meta->shape().end())));
    sizes.push_back(static_cast<uint64_t>(bytes));
    total_size += static_cast<uint64_t>(bytes);
  }
  const std::vector<std::vector<size_t>> groups =
      PlanSafetensorsShards(sizes, options.max_shard_bytes);
  const bool single = groups.size() == 1;  // As transformers: no index for one shard.
  std::vector<std::string> names;
  std::vector<PlannedSafetensors> plans;
  uint64_t total = 0;
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<const PlannedTensor*> tensors;
    for (size_t index : groups[i]) tensors.push_back(&planned[index]);
    ASSIGN_OR_RETURN(PlannedSafetensors plan, PlanSafetensorsFile(manifest, target, tensors));
    names.push_back(
        single ? kSafetensorsSingleName
               : SafetensorsShardName(static_cast<int>(i) + 1, static_cast<int>(groups.size())));
    for (const PlannedTensor* tensor : tensors) weight_map.emplace(tensor->key, names.back());
    total += plan.layout.total_bytes;
    plans.push_back(std::move(plan));
  }
  const std::string index_text = SafetensorsIndexJson(total_size, weight_map);
  if (!single) total += index_text.size();

  ASSIGN_OR_RETURN(const mode_t type, FileType(dir));
  if (type == 0 && mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, "creating the export directory", dir);
  }
  if (type != 0 && type != S_IFDIR) {
    return absl::InvalidArgumentError(absl::StrCat("a sharded export writes a directory (",
                                                   kSafetensorsIndexName, " and its shards), but ",
                                                   dir, " is a file"));
  }
  RETURN_IF_ERROR(RemoveIfPresent(absl::StrCat(dir, "/", kSafetensorsIndexName)));
  if (!single) RETURN_IF_ERROR(RemoveIfPresent(absl::StrCat(dir, "/", kSafetensorsSingleName)));

  ExportResult result;
  result.version = FormatVersionRef(manifest.model(), manifest.version());
  result.left_out = SafetensorsLeftOut(manifest, options.target);
  uint64_t done = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    ASSIGN_OR_RETURN(AtomicFileWriter out,
                     AtomicFileWriter::Create(absl::StrCat(dir, "/", names[i])));
    bool header = true;
    RETURN_IF_ERROR(StreamSafetensorsFile(
        reader, target, plans[i], [&](absl::string_view bytes) { return out.Append(bytes); },
        [&](uint64_t bytes) {
          done += bytes;
          if (header) {
            header = false;
            return;
          }
          ++result.tensors;
          if (options.progress) options.progress(done, total);
        }));
    RETURN_IF_ERROR(out.Commit());
  }
  if (!single) {
    ASSIGN_OR_RETURN(AtomicFileWriter out,
                     AtomicFileWriter::Create(absl::StrCat(dir, "/", kSafetensorsIndexName)));
    RETURN_IF_ERROR(out.Append(index_text));
    RETURN_IF_ERROR(out.Commit());
    done += index_text.size();
  }
  // Shards of an earlier export with another shard count.
  const absl::flat_hash_set<std::string> current(names.begin(), names.end());
  if (DIR* listing = opendir(dir.c_str()); listing != nullptr) {
    std::vector<std::string> stale;
    while (const dirent* entry = readdir(listing)) {
      if (IsShardName(entry->d_name) && !current.contains(entry->d_name)) {
        stale.push_back(entry->d_name);
      }
    }
    closedir(listing);
    for (const std::string& name : stale) {
      RETURN_IF_ERROR(RemoveIfPresent(absl::StrCat(dir, "/", name)));
    }
  }
  result.file_bytes = total;
  result.files = names;
  if (!single) result.files.push_back(kSafetensorsIndexName);
  if (options.progress) options.progress(done, total);
  return result;
}

// The torch file of the export, planned: its pickle built from the manifest with a placeholder
// for every tensor, so that writing it holds one tensor at a time.
struct PlannedTorch {
  ExportResult result;
  std::optional<TorchFileWriter> writer;
};

absl::StatusOr<PlannedTorch> PlanTorch(const VersionReader& reader, const ExportOptions& options) {
  PlannedTorch planned;
  ExportResult& result = planned.result;
  result.version = FormatVersionRef(reader.manifest().model(), reader.manifest().version());
  DeferredTensors deferred;
  Value root;
  if (ExportWritesBundle(options)) {
    ASSIGN_OR_RETURN(AssembledBundle bundle,
                     BundleOf(reader, options.target, deferred, result.tensors));
    root = std::move(bundle.root);
    result.bundle = true;
    result.left_out = std::move(bundle.left_out);
  } else {
    ASSIGN_OR_RETURN(StateDict model, DeferredModel(reader, OnCpu(options.target), deferred));
    result.tensors = static_cast<int64_t>(model.size());
    root = StateDictToValue(model);
  }
  ASSIGN_OR_RETURN(planned.writer, TorchFileWriter::Plan(root, &deferred));
  result.file_bytes = planned.writer->file_bytes();
  result.warnings = planned.writer->warnings();
  return planned;
}

// The model's state dict as a DCP directory, one tensor in memory at a time.
absl::StatusOr<ExportResult> WriteDcp(const VersionReader& reader, const ExportOptions& options,
                                      const std::string& path) {
  ExportResult result;
  result.version = FormatVersionRef(reader.manifest().model(), reader.manifest().version());
  if (options.target.include_optimizer || options.target.include_scheduler) {
    return absl::InvalidArgumentError(
        "a DCP export holds the model's state dict; optimizer and scheduler state go into a "
        "torch bundle (--format torch --bundle)");
  }
  DeferredTensors deferred;
  ASSIGN_OR_RETURN(StateDict model, DeferredModel(reader, OnCpu(options.target), deferred));
  result.tensors = static_cast<int64_t>(model.size());
  ASSIGN_OR_RETURN(DcpWriteReport report,
                   WriteDcpDirectory(path, StateDictToValue(model), &deferred, options.progress));
  result.file_bytes = report.file_bytes;
  result.warnings = std::move(report.warnings);
  for (const std::string& file : report.files) {
    result.files.push_back(std::filesystem::path(file).filename().string());
  }
  return result;
}

}  // namespace

bool ExportWritesBundle(const ExportOptions& options) {
  return options.format == ExportFormat::kTorch &&
         (options.target.include_optimizer || options.target.include_scheduler);
}

absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "torch" || lower == "pt") return ExportFormat::kTorch;
  if (lower == "safetensors") return ExportFormat::kSafetensors;
  if (lower == "dcp") return ExportFormat::kDcp;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown export format '", name, "'; expected torch, safetensors or dcp"));
}

absl::StatusOr<ExportFormat> ExportFormatFromProto(v1::ExportFormat format) {
  switch (format) {
    case v1::EXPORT_FORMAT_TORCH:
      return ExportFormat::kTorch;
    case v1::EXPORT_FORMAT_SAFETENSORS:
      return ExportFormat::kSafetensors;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("export format ", static_cast<int>(format),
                       " is not EXPORT_FORMAT_TORCH or EXPORT_FORMAT_SAFETENSORS"));
  }
}

v1::ExportFormat ExportFormatToProto(ExportFormat format) {
  switch (format) {
    case ExportFormat::kTorch:
      return v1::EXPORT_FORMAT_TORCH;
    case ExportFormat::kSafetensors:
      return v1::EXPORT_FORMAT_SAFETENSORS;
    case ExportFormat::kDcp:
      break;  // a directory: no wire format (the loader's Export streams one file)
  }
  return v1::EXPORT_FORMAT_UNSPECIFIED;
}

std::string ExportFileName(absl::string_view model, int64_t version, ExportFormat format) {
  return absl::StrCat(model, "-v", version, ".",
                      format == ExportFormat::kTorch ? "pt" : ExportFormatName(format));
}

absl::string_view ExportFormatName(ExportFormat format) {
  switch (format) {
    case ExportFormat::kTorch:
      return "torch";
    case ExportFormat::kSafetensors:
      return "safetensors";
    case ExportFormat::kDcp:
      return "dcp";
  }
  return "unknown";
}

absl::StatusOr<ExportFormat> ExportFormatForPath(absl::string_view path, bool sharded) {
  if (absl::EndsWith(path, ".safetensors")) return ExportFormat::kSafetensors;
  if (absl::EndsWith(path, ".pt") || absl::EndsWith(path, ".pth")) return ExportFormat::kTorch;
  if (sharded) return ExportFormat::kSafetensors;
  return absl::InvalidArgumentError(absl::StrCat("cannot tell the format from '", path, "'"));
}

absl::StatusOr<uint64_t> ParseShardSize(absl::string_view text) {
  const std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  size_t digits = 0;
  while (digits < upper.size() && (absl::ascii_isdigit(upper[digits]) || upper[digits] == '.')) {
    ++digits;
  }
  const std::string number = upper.substr(0, digits);
  const std::string unit(absl::StripAsciiWhitespace(absl::string_view(upper).substr(digits)));
  static const std::map<std::string, uint64_t>* const kUnits =
      new std::map<std::string, uint64_t>{{"", 1},
                                          {"B", 1},
                                          {"KB", 1000},
                                          {"MB", 1000 * 1000},
                                          {"GB", uint64_t{1000} * 1000 * 1000},
                                          {"TB", uint64_t{1000} * 1000 * 1000 * 1000},
                                          {"KIB", uint64_t{1} << 10},
                                          {"MIB", uint64_t{1} << 20},
                                          {"GIB", uint64_t{1} << 30},
                                          {"TIB", uint64_t{1} << 40}};
  double value = 0;
  const auto unit_it = kUnits->find(unit);
  if (number.empty() || !absl::SimpleAtod(number, &value) || unit_it == kUnits->end() ||
      !(value * static_cast<double>(unit_it->second) >= 1) ||
      value * static_cast<double>(unit_it->second) > 9.0e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard size '", text,
        "' is not a positive size: bytes, or a number with KB, MB, GB, TB (powers of 1000, as "
        "Hugging Face's \"5GB\") or KiB, MiB, GiB, TiB"));
  }
  return static_cast<uint64_t>(value * static_cast<double>(unit_it->second));
}

absl::StatusOr<ExportResult> ExportToFile(const VersionReader& store_reader,
                                          const ExportOptions& options, const std::string& path) {
  const CopyingReader reader(store_reader);
  if (options.max_shard_bytes > 0) {
    if (options.format != ExportFormat::kSafetensors) {
      return absl::InvalidArgumentError(
          "sharding (a maximum shard size) is for safetensors exports only");
    }
    return WriteSafetensorsShards(reader, options, path);
  }
  if (options.format == ExportFormat::kDcp) return WriteDcp(reader, options, path);
  if (options.format == ExportFormat::kTorch) {
    ASSIGN_OR_RETURN(PlannedTorch planned, PlanTorch(reader, options));
    ASSIGN_OR_RETURN(TorchWriteReport report, planned.writer->WriteFile(path, options.progress));
    planned.result.file_bytes = report.file_bytes;
    return std::move(planned.result);
  }
  ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  ASSIGN_OR_RETURN(ExportResult result,
                   StreamSafetensors(reader, options,
                                     [&](const ExportResult&, uint64_t, absl::string_view bytes) {
                                       return out.Append(bytes);
                                     }));
  RETURN_IF_ERROR(out.Commit());
  return result;
}

absl::StatusOr<ExportResult> ExportToSink(const VersionReader& store_reader,
                                          const ExportOptions& options, size_t piece_bytes,
                                          const ExportSink& sink) {
  const CopyingReader reader(store_reader);
  if (piece_bytes == 0) return absl::InvalidArgumentError("ExportToSink: piece_bytes is 0");
  if (options.format == ExportFormat::kDcp) {
    return absl::InvalidArgumentError(
        "a DCP export is a directory of files; a stream carries one file: export to a "
        "directory from the store");
  }
  if (options.max_shard_bytes > 0) {
    return absl::InvalidArgumentError(
        "a sharded export is a directory of files; a stream carries one file: export to a "
        "directory, or without a maximum shard size");
  }
  const auto send_in_pieces = [&](const ExportResult& prepared, uint64_t total,
                                  absl::string_view bytes) -> absl::Status {
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), piece_bytes);
      RETURN_IF_ERROR(sink(prepared, total, bytes.substr(0, n)));
      bytes.remove_prefix(n);
    }
    return absl::OkStatus();
  };
  if (options.format == ExportFormat::kSafetensors) {
    return StreamSafetensors(reader, options, send_in_pieces);
  }
  // The torch file's size is planned before its first byte, so it streams like safetensors: the
  // zip's central directory, which comes last, holds only names, sizes and checksums.
  ASSIGN_OR_RETURN(PlannedTorch planned, PlanTorch(reader, options));
  const ExportResult& prepared = planned.result;
  const uint64_t total = prepared.file_bytes;
  ASSIGN_OR_RETURN(TorchWriteReport report, planned.writer->Write(
                                                [&](absl::string_view bytes) {
                                                  return send_in_pieces(prepared, total, bytes);
                                                },
                                                options.progress));
  planned.result.file_bytes = report.file_bytes;
  return std::move(planned.result);
}

}  // namespace ckpt
