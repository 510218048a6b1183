#ifndef CKPT_LIBS_FORMAT_CONVERT_H_
#define CKPT_LIBS_FORMAT_CONVERT_H_

// `ckpt convert IN OUT`: any checkpoint ckpt reads, as a clean CPU file any tool can load -- e.g.
// a DDP checkpoint saved on cuda:1 becomes a state dict with canonical keys that
// `model.load_state_dict(torch.load(OUT, weights_only=True))` accepts on a CPU box.
//
// A training bundle (torch.save({"epoch", "model", "optimizer", "scheduler", ...})) written as
// torch stays a whole bundle: the producer's dict, order and value types, with the model's keys
// converted and every tensor on the CPU (libs/format/bundle.h), so Python resumes from OUT as
// from IN. Opaque objects (never written back as code) are left out and named. With
// model_only, or for safetensors (which holds tensors only), OUT is the model's state dict and
// the report names what was left out.

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
  // automatically. A model named this way is written alone (no bundle is rebuilt around it).
  std::string model_key;
  // Write the model's state dict alone, even when IN is a bundle.
  bool model_only = false;
  // See ReadCheckpointOptions::max_expanded_bytes (0: 1/8 of this host's available memory).
  int64_t max_expanded_bytes = 0;
};

struct ConvertReport {
  std::string format;  // "torch" or "safetensors".
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t file_bytes = 0;
  std::string stripped_prefix;  // What was removed from the front of every key.
  bool bundle = false;          // OUT is the whole bundle, not the state dict alone.
  // IN's root held no model state dict (a bare tensor, a list of tensors, plain values): OUT is
  // that root as it is (torch) or its tensors under their paths ("0", "a/b"; a bare tensor as
  // "tensor") (safetensors); this says what the root was, e.g. "a list of 2 items".
  std::string plain_root;
  // What OUT does not hold, each with why ("optimizer: model weights only", "scheduler/
  // anneal_func: a builtins.getattr object (never written back as code)").
  std::vector<std::string> left_out;
  std::vector<std::string> warnings;
};

// Errors from reading IN (see ReadCheckpointFile), INVALID_ARGUMENT for bad options (unknown
// format, a PREFIX some key lacks, keys that collide), and write errors; OUT is written
// atomically, so a failure leaves any previous OUT intact.
absl::StatusOr<ConvertReport> ConvertCheckpoint(const std::string& in, const std::string& out,
                                                const ConvertOptions& options);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_CONVERT_H_
