#ifndef CKPT_LIBS_FORMAT_CONVERT_H_
#define CKPT_LIBS_FORMAT_CONVERT_H_

// `ckpt convert IN OUT`: the model state dict of any checkpoint ckpt reads, as a clean CPU file
// any tool can load -- e.g. a DDP checkpoint saved on cuda:1 becomes a state dict with canonical
// keys that `model.load_state_dict(torch.load(OUT, weights_only=True))` accepts on a CPU box.
//
// Only the model's weights are converted: optimizer, scheduler and other bundle entries are
// left out (the report names them; `ckpt import` keeps them in the store).

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

struct ConvertOptions {
  // "torch" or "safetensors"; empty picks safetensors for a .safetensors OUT, else torch.
  std::string format;
  // "auto": strip the wrapper prefixes normalization detects (module., _orig_mod., FSDP and
  // checkpoint-wrapper segments); "none": keep keys as they are; anything else: a prefix every
  // key must start with, stripped exactly.
  std::string strip_prefix = "auto";
  // Prefix added to every key after stripping ("module." for a DDP consumer); empty: none.
  std::string add_prefix;
  // Where the model state dict is inside the file ("model", "ckpt/state_dict"); empty: found
  // automatically.
  std::string model_key;
};

struct ConvertReport {
  std::string format;             // "torch" or "safetensors".
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;
  std::string stripped_prefix;    // What was removed from the front of every key.
  std::vector<std::string> left_out;  // Bundle parts not converted ("optimizer", ...).
  std::vector<std::string> warnings;
};

// Errors from reading IN (see ReadCheckpointFile), INVALID_ARGUMENT for bad options (unknown
// format, a PREFIX some key lacks, keys that collide), and write errors; OUT is written
// atomically, so a failure leaves any previous OUT intact.
absl::StatusOr<ConvertReport> ConvertCheckpoint(const std::string& in, const std::string& out,
                                                const ConvertOptions& options);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_CONVERT_H_
