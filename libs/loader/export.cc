#include "libs/loader/export.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <memory>
#include <utility>

#include "ATen/ATen.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/bundle.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_writer.h"
#include "libs/io/atomic_file.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/manifest_validation.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"

namespace ckpt {
namespace {

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

// The whole bundle of `reader`'s version as `target` adapts it, on the CPU; `model_tensors` gets
// how many model tensors it holds.
absl::StatusOr<AssembledBundle> BundleOf(const VersionReader& reader, const LoadTarget& target,
                                         int64_t& model_tensors) {
  const v1::Manifest& manifest = reader.manifest();
  const std::string where = FormatVersionRef(manifest.model(), manifest.version());
  if (target.include_optimizer && !manifest.has_optimizer_state()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " holds no optimizer state (it has ", manifest.tensors_size(), " model tensors",
        manifest.has_scheduler_state() ? ", scheduler state" : "",
        manifest.has_extra_state() ? " and other fields" : "",
        "; retention drops optimizer state from older versions): export it without the "
        "optimizer, or pick a version that has one"));
  }
  LoadTarget on_cpu = target;
  on_cpu.device = DeviceSpec::Cpu();
  if (target.include_optimizer) {
    ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(manifest, on_cpu));
    RETURN_IF_ERROR(CheckOptimizerAlignment(manifest, planned));
  }
  ASSIGN_OR_RETURN(LoadedState state, Load(reader, on_cpu));
  model_tensors = static_cast<int64_t>(state.model.size());
  BundleParts parts;
  parts.model = StateDictToValue(state.model);
  parts.optimizer = std::move(state.optimizer);
  parts.scheduler = std::move(state.scheduler);
  if (manifest.has_extra_state()) {
    ASSIGN_OR_RETURN(parts.extra,
                     LoadValueTree(reader, manifest, manifest.extra_state(), DeviceSpec::Cpu()));
  }
  v1::BundleLayout layout = manifest.bundle_layout();
  if (!IsBundleLayout(layout)) DefaultLayout(manifest, parts.extra, layout);

  std::vector<std::string> left_out;
  if (manifest.has_optimizer_state() && !target.include_optimizer) {
    left_out.push_back("optimizer: not asked for");
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

// Streams a safetensors file of the adapted model tensors to `sink`, one tensor at a time.
absl::StatusOr<ExportResult> StreamSafetensors(const VersionReader& reader,
                                               const ExportOptions& options,
                                               const ExportSink& sink) {
  const v1::Manifest& manifest = reader.manifest();
  const LoadTarget target = OnCpu(options.target);
  ASSIGN_OR_RETURN(std::vector<PlannedTensor> planned, PlanLoad(manifest, target));
  std::vector<SafetensorsTensorSpec> specs;
  absl::flat_hash_map<std::string, const PlannedTensor*> by_name;
  for (const PlannedTensor& tensor : planned) {
    SafetensorsTensorSpec& spec = specs.emplace_back();
    spec.name = tensor.key;
    spec.dtype = target.dtype.Apply(static_cast<DType>(tensor.meta->dtype()));
    spec.shape.assign(tensor.meta->shape().begin(), tensor.meta->shape().end());
    by_name.emplace(tensor.key, &tensor);
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"ckpt.version", FormatVersionRef(manifest.model(), manifest.version())}};
  ASSIGN_OR_RETURN(SafetensorsLayout layout, PlanSafetensors(specs, metadata));
  ExportResult result;
  result.version = FormatVersionRef(manifest.model(), manifest.version());
  result.left_out = SafetensorsLeftOut(manifest, options.target);
  RETURN_IF_ERROR(sink(result, layout.total_bytes, layout.header_bytes));
  uint64_t done = layout.header_bytes.size();
  for (const SafetensorsTensorInfo& info : layout.tensors) {
    const PlannedTensor& tensor = *by_name.at(info.name);
    ASSIGN_OR_RETURN(at::Tensor stored, reader.ReadTensor(*tensor.meta));
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
      RETURN_IF_ERROR(sink(result, layout.total_bytes,
                           absl::string_view(static_cast<const char*>(cast.data_ptr()), nbytes)));
    }
    done += nbytes;
    ++result.tensors;
    if (options.progress) options.progress(done, layout.total_bytes);
  }
  result.file_bytes = layout.total_bytes;
  return result;
}

absl::StatusOr<ExportResult> WriteTorch(const VersionReader& reader, const ExportOptions& options,
                                        const std::string& path) {
  ExportResult result;
  result.version = FormatVersionRef(reader.manifest().model(), reader.manifest().version());
  Value root;
  if (ExportWritesBundle(options)) {
    ASSIGN_OR_RETURN(AssembledBundle bundle, BundleOf(reader, options.target, result.tensors));
    root = std::move(bundle.root);
    result.bundle = true;
    result.left_out = std::move(bundle.left_out);
  } else {
    ASSIGN_OR_RETURN(LoadedState state, Load(reader, OnCpu(options.target)));
    result.tensors = static_cast<int64_t>(state.model.size());
    root = StateDictToValue(state.model);
  }
  ASSIGN_OR_RETURN(TorchWriteReport report, WriteTorchFile(path, root));
  result.file_bytes = report.file_bytes;
  result.warnings = std::move(report.warnings);
  if (options.progress) options.progress(result.file_bytes, result.file_bytes);
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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown export format '", name, "'; expected torch or safetensors"));
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
  return format == ExportFormat::kTorch ? v1::EXPORT_FORMAT_TORCH : v1::EXPORT_FORMAT_SAFETENSORS;
}

std::string ExportFileName(absl::string_view model, int64_t version, ExportFormat format) {
  return absl::StrCat(model, "-v", version,
                      format == ExportFormat::kTorch ? ".pt" : ".safetensors");
}

absl::StatusOr<ExportResult> ExportToFile(const VersionReader& reader, const ExportOptions& options,
                                          const std::string& path) {
  if (options.format == ExportFormat::kTorch) return WriteTorch(reader, options, path);
  ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  ASSIGN_OR_RETURN(ExportResult result,
                   StreamSafetensors(reader, options,
                                     [&](const ExportResult&, uint64_t, absl::string_view bytes) {
                                       return out.Append(bytes);
                                     }));
  RETURN_IF_ERROR(out.Commit());
  return result;
}

absl::StatusOr<ExportResult> ExportToSink(const VersionReader& reader, const ExportOptions& options,
                                          const std::string& scratch_dir, size_t piece_bytes,
                                          const ExportSink& sink) {
  if (piece_bytes == 0) return absl::InvalidArgumentError("ExportToSink: piece_bytes is 0");
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
  // The zip's central directory is written last, so the file is staged in a private directory,
  // then streamed and deleted.
  std::string dir_template =
      absl::StrCat(scratch_dir.empty() ? "/tmp" : scratch_dir, "/ckpt-export-XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return ErrnoToStatus(errno, "creating a staging directory for a torch export in", scratch_dir);
  }
  const std::string path = absl::StrCat(dir_template, "/export.pt");
  struct Cleanup {
    std::string dir, file;
    ~Cleanup() {
      unlink(file.c_str());
      rmdir(dir.c_str());
    }
  } cleanup{dir_template, path};
  ASSIGN_OR_RETURN(ExportResult result, WriteTorch(reader, options, path));
  std::ifstream file(path, std::ios::binary);
  if (!file) return ErrnoToStatus(errno, "opening the staged export", path);
  std::string buffer(piece_bytes, '\0');
  uint64_t sent = 0;
  while (sent < result.file_bytes) {
    file.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = file.gcount();
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat("staged export ", path, " ended after ", sent, " of ",
                                              result.file_bytes, " bytes"));
    }
    RETURN_IF_ERROR(sink(result, result.file_bytes, absl::string_view(buffer.data(), n)));
    sent += static_cast<uint64_t>(n);
  }
  return result;
}

}  // namespace ckpt
