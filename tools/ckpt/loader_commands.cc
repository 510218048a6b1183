#include "tools/ckpt/loader_commands.h"

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/inspect.h"
#include "libs/loader/export.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "tools/ckpt/output.h"
#include "tools/ckpt/store_access.h"

namespace ckpt {
namespace {

// The LoadTarget --dtype, --key-prefix and --include describe.
absl::StatusOr<LoadTarget> TargetFromOptions(const cli::ParsedCommandLine& line) {
  LoadTarget target;
  if (line.Has("dtype")) {
    ASSIGN_OR_RETURN(DType dtype, ParseDType(line.Get("dtype")));
    ASSIGN_OR_RETURN(target.dtype, DTypePolicy::CastFloatingTo(dtype));
  }
  if (line.Has("key-prefix") && !line.Get("key-prefix").empty()) {
    target.keys = KeyPolicy::AddPrefix(line.Get("key-prefix"));
  }
  if (line.Has("include")) {
    target.include_prefixes = absl::StrSplit(line.Get("include"), ',', absl::SkipEmpty());
  }
  return target;
}

}  // namespace

cli::CommandSpec ExportCommand() {
  return {
      "export",
      "MODEL@REF OUT",
      "Write a stored version's model tensors -- or with --bundle the whole training bundle "
      "that Python resumes from -- as a torch .pt (torch.load(weights_only=True) globals only) "
      "or safetensors file, written atomically; or (--format dcp) as a PyTorch Distributed "
      "Checkpoint directory that torch.distributed.checkpoint.load reads.",
      2,
      2,
      {{"format", "torch|safetensors|dcp",
        "output format (dcp: a PyTorch Distributed Checkpoint directory OUT)",
        "from OUT's extension"},
       {"bundle", "",
        "the whole bundle: model, optimizer, scheduler, epoch and every other plain field, in "
        "the producer's layout (torch only)",
        ""},
       {"no-optimizer", "", "with --bundle: leave the optimizer state out", ""},
       {"no-scheduler", "", "with --bundle: leave the scheduler state out", ""},
       {"dtype", "DTYPE", "cast floating tensors, e.g. bf16, fp16, fp32", "keep"},
       {"key-prefix", "PREFIX", "prefix every key, e.g. module. for a DDP consumer", ""},
       {"include", "PREFIX[,PREFIX]", "only tensors whose canonical key starts with one", "all"},
       {"max-shard-size", "SIZE",
        "safetensors in Hugging Face's sharded layout: OUT is a directory of "
        "model-00001-of-0000N.safetensors... and model.safetensors.index.json, shards of at most "
        "SIZE tensor bytes (5GB, 500MB, 2GiB, bytes; a larger tensor gets a shard of its own)",
        "one file"},
       {"loader", "HOST:PORT[,HOST:PORT...]|dns:///NAME:PORT",
        "export through a loader service (several: round-robin over the healthy ones) instead of "
        "the store",
        ""}}};
}

cli::CommandSpec CheckCommand() {
  return {
      "check",
      "MODEL@REF",
      "Preflight: compare a stored version's keys and shapes with another checkpoint file's "
      "(a consumer's); exit 1 when they do not fit.",
      1,
      1,
      {{"against", "FILE", "checkpoint whose model state dict is the consumer (required)", ""},
       {"key-prefix", "PREFIX", "the consumer's keys carry this prefix, e.g. module.", ""},
       {"include", "PREFIX[,PREFIX]", "compare only tensors whose canonical key starts with one",
        "all"},
       {"loader", "HOST:PORT[,HOST:PORT...]|dns:///NAME:PORT",
        "ask a loader service (several: round-robin over the healthy ones) instead of the store",
        ""}}};
}

absl::Status RunExport(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
  const std::string& out = line.arguments()[1];
  ExportOptions options;
  if (line.Has("format")) {
    ASSIGN_OR_RETURN(options.format, ParseExportFormat(line.Get("format")));
  } else {
    absl::StatusOr<ExportFormat> format = ExportFormatForPath(out, line.Has("max-shard-size"));
    if (!format.ok()) {
      return absl::Status(
          format.status().code(),
          absl::StrCat(format.status().message(), "; pass --format torch|safetensors|dcp"));
    }
    options.format = *format;
  }
  ASSIGN_OR_RETURN(options.target, TargetFromOptions(line));
  if (line.Has("bundle")) {
    if (options.format != ExportFormat::kTorch) {
      return absl::InvalidArgumentError(
          absl::StrCat("--bundle needs the torch format: ", ExportFormatName(options.format),
                       " here holds the model's tensors only"));
    }
    options.target.include_optimizer = !line.Has("no-optimizer");
    options.target.include_scheduler = !line.Has("no-scheduler");
    if (!options.target.include_optimizer && !options.target.include_scheduler) {
      return absl::InvalidArgumentError(
          "--bundle with --no-optimizer and --no-scheduler is the model alone: drop --bundle");
    }
  } else if (line.Has("no-optimizer") || line.Has("no-scheduler")) {
    return absl::InvalidArgumentError("--no-optimizer and --no-scheduler go with --bundle");
  }
  if (options.format == ExportFormat::kDcp && line.Has("loader")) {
    return absl::InvalidArgumentError(
        "--format dcp writes a directory, which a loader service cannot stream (it sends one "
        "file): export from the store");
  }
  if (line.Has("max-shard-size")) {
    if (options.format != ExportFormat::kSafetensors) {
      return absl::InvalidArgumentError("--max-shard-size shards safetensors exports only");
    }
    // The loader service streams one file; shards are files the store side writes.
    if (line.Has("loader")) {
      return absl::InvalidArgumentError(
          "--max-shard-size writes a directory, which a loader service cannot stream (it sends "
          "one file): export from the store, or drop --max-shard-size");
    }
    ASSIGN_OR_RETURN(options.max_shard_bytes, ParseShardSize(line.Get("max-shard-size")));
  }
  ProgressBar bar("exporting");
  options.progress = [&](uint64_t done, uint64_t total) {
    bar.Update(static_cast<int64_t>(done), static_cast<int64_t>(total),
               absl::StrCat(HumanBytes(done), " / ", HumanBytes(total)));
  };
  ASSIGN_OR_RETURN(LoaderHandle loader, OpenLoader(line));
  ASSIGN_OR_RETURN(ExportResult result, loader.loader->Export(ref, options, out));
  std::cout << "exported " << result.version << " to " << out << " ("
            << ExportFormatName(options.format) << (result.bundle ? ", whole bundle" : "")
            << (result.files.size() > 1 && options.format == ExportFormat::kSafetensors
                    ? absl::StrCat(", ", result.files.size() - 1, " shards")
                    : "")
            << "): " << result.tensors << " model tensors, " << HumanBytes(result.file_bytes)
            << "\n";
  for (const std::string& file : result.files) std::cout << "  " << out << "/" << file << "\n";
  PrintLeftOut(result.left_out);
  for (const std::string& warning : result.warnings) std::cerr << "warning: " << warning << "\n";
  return absl::OkStatus();
}

absl::Status RunCheck(const cli::ParsedCommandLine& line) {
  if (!line.Has("against") || line.Get("against").empty()) {
    return absl::InvalidArgumentError("check needs --against FILE");
  }
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
  ASSIGN_OR_RETURN(LoadTarget target, TargetFromOptions(line));
  absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(line.Get("against"));
  if (!file.ok()) return file.status();
  std::vector<ExpectedTensor> expected;
  for (const StateDict::Entry& entry : file->bundle.model) {
    expected.push_back({entry.key, entry.tensor.sizes().vec()});
  }
  ASSIGN_OR_RETURN(LoaderHandle loader, OpenLoader(line));
  ASSIGN_OR_RETURN(PreflightReport report, loader.loader->Preflight(ref, expected, target));
  const bool compatible = report.report.compatible();
  const std::string& summary = report.summary;
  std::cout << summary << "\n";
  if (!compatible) {
    return absl::FailedPreconditionError(
        absl::StrCat(line.Get("against"), " does not fit ", line.arguments()[0]));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
