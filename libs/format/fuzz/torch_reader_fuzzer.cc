// Fuzz target: the whole torch.save reader (zip or legacy container, pickle, storages, tensor
// views) on arbitrary bytes, then bundle extraction on whatever it read.
#include <cstddef>
#include <cstdint>

#include "libs/format/module_state.h"
#include "libs/format/torch_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<ckpt::TorchFile> file =
      ckpt::ReadTorchBytes(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz.pt");
  if (file.ok()) (void)ckpt::ExtractCheckpointBundle(file->root);
  return 0;
}
