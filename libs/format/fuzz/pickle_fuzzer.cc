// Fuzz target: the restricted pickle machine on arbitrary bytes (no persistent-id hooks) returns
// a Value or a status, never executes anything, never crashes.
#include <cstddef>
#include <cstdint>

#include "libs/format/pickle_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ckpt::ReadPickleBytes(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
