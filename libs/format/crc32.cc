#include "libs/format/crc32.h"

#include <zlib.h>

namespace ckpt {

uint32_t Crc32(uint32_t crc, absl::string_view data) {
  // crc32_z takes a size_t length, so no 4 GiB record needs splitting.
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

}  // namespace ckpt
