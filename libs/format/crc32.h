#ifndef CKPT_LIBS_FORMAT_CRC32_H_
#define CKPT_LIBS_FORMAT_CRC32_H_

// CRC-32 as zip archives use it (IEEE 802.3, reflected polynomial 0xEDB88320): zlib's crc32_z.
// zlib 1.2.13's braided implementation runs at about 6.5 GB/s on the 2-core VM, 2.7 times the
// slice-by-8 loop this file held before (2.4 GB/s over the same 256 MiB in the same run,
// docs/benchmarks/history.md, 2026-12-08), so checking every tensor record of a checkpoint costs
// little next to reading it.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace ckpt {

// Extends `crc` (0 for a fresh checksum) with `data`:
//   Crc32(Crc32(0, a), b) == Crc32(0, a + b).
uint32_t Crc32(uint32_t crc, absl::string_view data);

}  // namespace ckpt

#endif  // CKPT_LIBS_FORMAT_CRC32_H_
