#ifndef CKPT_LIBS_FORMAT_CRC32_H_
#define CKPT_LIBS_FORMAT_CRC32_H_

// CRC-32 as zip archives use it (IEEE 802.3, reflected polynomial 0xEDB88320, the value zlib's
// crc32() gives). Slice-by-8, about 1.5 GB/s: checking every tensor record of a checkpoint costs
// little next to reading it.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace ckpt {

// Extends `crc` (0 for a fresh checksum) with `data`:
//   Crc32(Crc32(0, a), b) == Crc32(0, a + b).
uint32_t Crc32(uint32_t crc, absl::string_view data);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_CRC32_H_
