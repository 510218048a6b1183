// Fuzz target: the zip reader opens arbitrary bytes and reads every entry it lists (bounded),
// returning statuses only.
#include <cstddef>
#include <cstdint>
#include <string>

#include "libs/format/byte_source.h"
#include "libs/format/zip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto source =
      ckpt::MemorySource(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz.zip");
  absl::StatusOr<ckpt::ZipReader> zip = ckpt::ZipReader::Open(source.get());
  if (!zip.ok()) return 0;
  for (const ckpt::ZipEntry& entry : zip->entries()) {
    (void)zip->ReadToString(entry, /*max_size=*/size);
  }
  return 0;
}
