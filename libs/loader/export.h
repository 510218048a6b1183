#ifndef CKPT_LIBS_LOADER_EXPORT_H_
#define CKPT_LIBS_LOADER_EXPORT_H_

// Export: a stored version, adapted to a LoadTarget (subset, key policy, dtype cast), written as
// a file another framework reads -- a torch.save zip that Python's torch.load(weights_only=True)
// accepts (libs/format/torch_writer.h), or safetensors (libs/format/safetensors.h).
//
// What is exported: the model's tensors (the state dict a consumer's load_state_dict takes), or,
// when the target asks for optimizer or scheduler state and the format is torch, the whole
// training bundle as its producer saved it -- {"epoch", "model", "optimizer", "scheduler",
// <every other plain field>} in the producer's order and types (libs/format/bundle.h), which
// Python's model / optimizer / scheduler .load_state_dict() resume from. A version that recorded
// no bundle layout (the trainer's) is written as {"epoch", "global_step", "model", "optimizer",
// "scheduler", <its other fields>}. LoadTarget::device is ignored: files hold CPU bytes.
//
// A bundle's optimizer state is indexed by parameter position over the whole model, so with the
// optimizer included a subset must keep every parameter the optimizer names (known from
// Manifest.optimizer_param_names); anything else is refused rather than written misaligned.
//
// Memory: both formats stream, holding one tensor (and its cast) at a time, never the version.
// The file is planned from the manifest alone -- the safetensors header (PlanSafetensors), or
// the torch pickle with a placeholder for every tensor (DeferredTensors) and the zip's layout --
// so its size is known before the first byte; then each tensor is read, cast, written (for
// torch, CRC-32'd first: the zip's local header carries it) and released before the next.
// Tensors are copied out of the store into buffers of their own, never mapped: a store reader
// keeps its pack-file mappings, and every page of them it touched, until the reader goes.
//
// Sharded safetensors (ExportOptions::max_shard_bytes): Hugging Face's layout in a directory --
// model-00001-of-0000N.safetensors ... and model.safetensors.index.json, split as
// huggingface_hub splits (libs/format/safetensors.h), or model.safetensors alone when one shard
// holds everything, as transformers' save_pretrained writes it.
//
// Example:
//   ExportOptions options;
//   options.format = ExportFormat::kSafetensors;
//   options.target.dtype = *DTypePolicy::CastFloatingTo(DType::kBFloat16);
//   ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader, store.OpenVersion(ref));
//   ASSIGN_OR_RETURN(ExportResult result, ExportToFile(*reader, options, "/tmp/m.safetensors"));

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/loader/load_target.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {

// kDcp: a PyTorch Distributed Checkpoint directory (libs/format/dcp_writer.h), which
// torch.distributed.checkpoint.load reads on any number of ranks; written from the store by
// ExportToFile only (a directory is no stream: ExportToSink and the loader's Export refuse it).
enum class ExportFormat { kTorch, kSafetensors, kDcp };

// "torch" (also "pt"), "safetensors" or "dcp"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name);
// The wire enum; INVALID_ARGUMENT for EXPORT_FORMAT_UNSPECIFIED or an unknown value.
absl::StatusOr<ExportFormat> ExportFormatFromProto(v1::ExportFormat format);
// EXPORT_FORMAT_UNSPECIFIED (which a loader refuses) for kDcp, which no stream carries.
v1::ExportFormat ExportFormatToProto(ExportFormat format);
// "MODEL-vN.pt" / "MODEL-vN.safetensors" / "MODEL-vN.dcp" (a directory).
std::string ExportFileName(absl::string_view model, int64_t version, ExportFormat format);
// "torch", "safetensors" or "dcp", which ParseExportFormat reads back.
absl::string_view ExportFormatName(ExportFormat format);
// The format an export to `path` is written in, told from its name: ".safetensors" is
// safetensors, ".pt" and ".pth" torch; with `sharded` (ExportOptions::max_shard_bytes > 0) any
// other name is the directory of a sharded export, which holds safetensors shards only.
// INVALID_ARGUMENT naming the path otherwise.
absl::StatusOr<ExportFormat> ExportFormatForPath(absl::string_view path, bool sharded);

struct ExportOptions {
  ExportFormat format = ExportFormat::kTorch;
  LoadTarget target;
  // Called after each tensor is written with the file bytes written so far and the total. May be
  // empty.
  std::function<void(uint64_t bytes_done, uint64_t bytes_total)> progress;
  // Safetensors only: more than 0 writes Hugging Face's sharded layout into the directory
  // ExportToFile is given (created if missing), no shard holding more than this many tensor
  // bytes unless one tensor alone is larger (it gets a shard of its own). Files of that layout
  // already in the directory are replaced; other files are left alone.
  uint64_t max_shard_bytes = 0;
};

// "5GB" (10^9, as Hugging Face's max_shard_size), "500MB", "2GiB" (2^30), "1048576" (bytes);
// units are case-insensitive. INVALID_ARGUMENT for anything else, or less than one byte.
absl::StatusOr<uint64_t> ParseShardSize(absl::string_view text);

// Whether `options` export the whole training bundle (torch format, optimizer or scheduler
// state asked for) rather than the model's state dict; what ExportResult::bundle reports.
bool ExportWritesBundle(const ExportOptions& options);

struct ExportResult {
  std::string version;  // what was exported: "MODEL@N".
  uint64_t file_bytes = 0;
  int64_t tensors = 0;  // model tensors written.
  bool bundle = false;  // the file is the whole bundle, not the state dict alone.
  // Parts of the version the file does not hold, each with why ("scheduler/anneal_func: a
  // builtins.getattr object (never written back as code)", "optimizer: safetensors holds
  // tensors only").
  std::vector<std::string> left_out;
  std::vector<std::string> warnings;  // from the writer.
  // A sharded export: the files written in the directory, shards then the index.
  std::vector<std::string> files;
};

// Writes the export to `path` atomically (a failure leaves any previous file intact); a sharded
// one into the directory `path`, each file atomically and the index last. Errors as
// Load (INVALID_ARGUMENT for a bad subset or key policy, DATA_LOSS from the store), plus
// INVALID_ARGUMENT for a dtype the format cannot hold or a subset that would misalign the
// optimizer state, FAILED_PRECONDITION when optimizer state is asked for and the version holds
// none, and filesystem errors as AtomicFileWriter reports them.
absl::StatusOr<ExportResult> ExportToFile(const VersionReader& reader, const ExportOptions& options,
                                          const std::string& path);

// Receives the file in consecutive pieces; `total_bytes` is the whole file's size (known before
// the first piece in both formats); `prepared` says what the file holds and leaves out (its
// file_bytes and tensors may still be 0 while a safetensors file streams). A non-OK return
// stops the export and is returned.
using ExportSink = std::function<absl::Status(const ExportResult& prepared, uint64_t total_bytes,
                                              absl::string_view bytes)>;

// Streams the export to `sink` in pieces of at most `piece_bytes`, as it is written: nothing is
// staged on disk. Errors as ExportToFile and from the sink; INVALID_ARGUMENT for a sharded
// export (a stream carries one file).
absl::StatusOr<ExportResult> ExportToSink(const VersionReader& reader, const ExportOptions& options,
                                          size_t piece_bytes, const ExportSink& sink);

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_EXPORT_H_
