// Fuzz target: the safetensors reader on arbitrary bytes must return a status, never crash,
// hang or allocate more than the input justifies.
#include <cstddef>
#include <cstdint>

#include "libs/format/byte_source.h"
#include "libs/format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto source = ckpt::MemorySource(absl::string_view(reinterpret_cast<const char*>(data), size),
                                   "fuzz.safetensors");
  (void)ckpt::ReadSafetensors(*source);
  return 0;
}
