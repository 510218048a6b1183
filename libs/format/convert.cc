#include "libs/format/convert.h"

#include <map>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/format/bundle.h"
#include "libs/format/checkpoint_file.h"
#include "libs/format/module_state.h"
#include "libs/format/safetensors.h"
#include "libs/format/torch_writer.h"
#include "libs/status/status_macros.h"
#include "libs/tensor/key_normalization.h"
#include "libs/tensor/sparse_layout.h"

namespace ckpt {
namespace {

absl::StatusOr<std::string> ResolveFormat(const std::string& requested, const std::string& out) {
  if (requested.empty()) {
    return absl::EndsWith(out, ".safetensors") ? std::string("safetensors") : std::string("torch");
  }
  if (requested == "torch" || requested == "safetensors") return requested;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown format '", requested, "'; expected torch or safetensors"));
}

absl::StatusOr<StateDict> StripPrefix(const StateDict& model, const std::string& mode,
                                      std::string* stripped) {
  if (mode == "none") return model;
  if (mode == "auto") {
    ASSIGN_OR_RETURN(auto normalized, NormalizeStateDict(model));
    *stripped = normalized.second.stripped_prefix;
    return std::move(normalized.first);
  }
  absl::StatusOr<StateDict> exact = StripExactPrefix(model, mode);
  if (!exact.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--strip-prefix: ", exact.status().message(),
                     " (use 'auto' to detect wrapper prefixes, or 'none')"));
  }
  *stripped = mode;
  return exact;
}

// A root that holds no model state dict, written as it is (torch) or as its tensors under their
// paths (safetensors), every tensor on the CPU as read.
absl::StatusOr<ConvertReport> ConvertPlainRoot(const CheckpointFile& file, const std::string& out,
                                               ConvertReport report) {
  const RootDescription described = DescribeRoot(file.root);
  report.plain_root = described.kind;
  if (!described.unstored.empty()) {
    const auto& [path, kind] = described.unstored.front();
    return absl::InvalidArgumentError(absl::StrCat(
        file.path, ": '", path, "' is ", kind,
        "; ckpt writes dense tensors only (make it dense with tensor.to_dense(), or give it "
        "storage, before saving)"));
  }
  StateDict tensors;
  file.root.ForEachTensor([&](const std::string& path, const at::Tensor& tensor) {
    tensors.InsertOrAssign(path.empty() ? "tensor" : path, tensor.detach());
  });
  report.tensors = tensors.size();
  report.tensor_bytes = tensors.TotalBytes();
  if (report.format == "safetensors") {
    if (tensors.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path, ": its root (", report.plain_root,
          ") holds no tensor, and safetensors holds tensors only; write a .pt"));
    }
    std::map<std::string, std::string> metadata = file.metadata;
    metadata["format"] = "pt";
    metadata["ckpt.source_format"] = std::string(CheckpointFormatName(file.format));
    RETURN_IF_ERROR(WriteSafetensorsFile(out, tensors, metadata));
  } else {
    // As torch.load gave it: an nn.Parameter stays one.
    ASSIGN_OR_RETURN(TorchWriteReport written, WriteTorchFile(out, file.root));
    report.warnings.insert(report.warnings.end(), written.warnings.begin(), written.warnings.end());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> written, OpenFileSource(out));
  report.file_bytes = written->size();
  return report;
}

}  // namespace

absl::StatusOr<ConvertReport> ConvertCheckpoint(const std::string& in, const std::string& out,
                                                const ConvertOptions& options) {
  ConvertReport report;
  ASSIGN_OR_RETURN(report.format, ResolveFormat(options.format, out));
  ReadCheckpointOptions read_options;
  read_options.model_key = options.model_key;
  read_options.max_expanded_bytes = options.max_expanded_bytes;
  read_options.allow_no_model = true;
  ASSIGN_OR_RETURN(CheckpointFile file, ReadCheckpointFile(in, read_options));
  report.warnings = file.warnings;
  if (!file.has_model) return ConvertPlainRoot(file, out, std::move(report));
  // (A model named by model_key has no layout: it is written alone.)
  report.bundle =
      report.format == "torch" && !options.model_only && IsBundleLayout(file.bundle.layout);
  if (!report.bundle) {
    const std::string why = report.format == "safetensors"
                                ? ": safetensors holds tensors only (write a .pt to keep it)"
                                : ": model weights only";
    if (file.bundle.optimizer.has_value()) report.left_out.push_back("optimizer" + why);
    if (file.bundle.scheduler.has_value()) report.left_out.push_back("scheduler" + why);
    if (file.bundle.extra.is_dict() && options.model_key.empty()) {
      for (const auto& [key, value] : file.bundle.extra.entries()) {
        report.left_out.push_back(
            (key.is_int() ? std::to_string(key.int_key()) : key.string_key()) + why);
      }
    }
  }

  // A state dict holds plain tensors: parameters of a whole-model pickle lose requires_grad,
  // as Module.state_dict() detaches them.
  StateDict detached;
  for (const StateDict::Entry& entry : file.bundle.model) {
    RETURN_IF_ERROR(detached.Insert(entry.key, entry.tensor.detach(), entry.original_device));
  }
  ASSIGN_OR_RETURN(StateDict model,
                   StripPrefix(detached, options.strip_prefix, &report.stripped_prefix));
  if (!options.add_prefix.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> keys,
                     ApplyKeyPolicy(model.keys(), KeyPolicy::AddPrefix(options.add_prefix), {}));
    ASSIGN_OR_RETURN(model, model.WithKeys(keys));
  }
  report.tensors = model.size();
  report.tensor_bytes = model.TotalBytes();

  if (report.format == "safetensors") {
    // safetensors has no shared storage: tied tensors are written once each.
    absl::flat_hash_map<const void*, std::string> first_user;
    for (const StateDict::Entry& entry : model) {
      if (entry.tensor.numel() == 0 || IsSparseTensor(entry.tensor)) continue;  // no storage
      auto [it, inserted] = first_user.emplace(entry.tensor.storage().data(), entry.key);
      if (!inserted) {
        report.warnings.push_back(absl::StrCat("'", entry.key, "' shares storage with '",
                                               it->second,
                                               "'; safetensors stores a separate copy"));
      }
    }
    std::map<std::string, std::string> metadata = file.metadata;
    metadata["format"] = "pt";
    metadata["ckpt.source_format"] = std::string(CheckpointFormatName(file.format));
    if (!report.stripped_prefix.empty()) metadata["ckpt.stripped_prefix"] = report.stripped_prefix;
    RETURN_IF_ERROR(WriteSafetensorsFile(out, model, metadata));
  } else {
    Value root = StateDictToValue(model);
    if (report.bundle) {
      BundleParts parts;
      parts.model = std::move(root);
      parts.optimizer = std::move(file.bundle.optimizer);
      parts.scheduler = std::move(file.bundle.scheduler);
      parts.extra = std::move(file.bundle.extra);
      ASSIGN_OR_RETURN(AssembledBundle bundle,
                       AssembleBundle(file.bundle.layout, std::move(parts)));
      root = std::move(bundle.root);
      report.left_out = std::move(bundle.left_out);
    }
    ASSIGN_OR_RETURN(TorchWriteReport written, WriteTorchFile(out, root));
    report.warnings.insert(report.warnings.end(), written.warnings.begin(), written.warnings.end());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> written, OpenFileSource(out));
  report.file_bytes = written->size();
  return report;
}

}  // namespace ckpt
