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
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_writer.h"
#include "libs/io/atomic_file.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
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
  RETURN_IF_ERROR(sink(layout.total_bytes, layout.header_bytes));
  uint64_t done = layout.header_bytes.size();
  ExportResult result;
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
      RETURN_IF_ERROR(sink(layout.total_bytes,
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
  ASSIGN_OR_RETURN(LoadedState state, Load(reader, OnCpu(options.target)));
  ASSIGN_OR_RETURN(TorchWriteReport report, WriteTorchFile(path, StateDictToValue(state.model)));
  ExportResult result;
  result.file_bytes = report.file_bytes;
  result.tensors = static_cast<int64_t>(state.model.size());
  result.warnings = std::move(report.warnings);
  if (options.progress) options.progress(result.file_bytes, result.file_bytes);
  return result;
}

}  // namespace

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
                   StreamSafetensors(reader, options, [&](uint64_t, absl::string_view bytes) {
                     return out.Append(bytes);
                   }));
  RETURN_IF_ERROR(out.Commit());
  return result;
}

absl::StatusOr<ExportResult> ExportToSink(const VersionReader& reader, const ExportOptions& options,
                                          const std::string& scratch_dir, size_t piece_bytes,
                                          const ExportSink& sink) {
  if (piece_bytes == 0) return absl::InvalidArgumentError("ExportToSink: piece_bytes is 0");
  const auto send_in_pieces = [&](uint64_t total, absl::string_view bytes) -> absl::Status {
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), piece_bytes);
      RETURN_IF_ERROR(sink(total, bytes.substr(0, n)));
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
    RETURN_IF_ERROR(sink(result.file_bytes, absl::string_view(buffer.data(), n)));
    sent += static_cast<uint64_t>(n);
  }
  return result;
}

}  // namespace ckpt
