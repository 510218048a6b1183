#include "libs/store/chunk_backend.h"

#include <sys/mman.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace ckpt {
namespace {
constexpr absl::string_view kPackSuffix = ".pack";
}  // namespace

std::string PackFileName(uint64_t pack_id) {
  return absl::StrCat(absl::StrFormat("%016x", pack_id), kPackSuffix);
}

std::optional<uint64_t> PackIdFromFileName(absl::string_view name) {
  if (!absl::ConsumeSuffix(&name, kPackSuffix) || name.size() != 16) return std::nullopt;
  uint64_t pack_id = 0;
  if (!absl::SimpleHexAtoi(name, &pack_id)) return std::nullopt;
  return pack_id;
}

MappedPackRegion::~MappedPackRegion() { ::munmap(base_, mapped_length_); }

}  // namespace ckpt
