#include "libs/io/xxh3.h"

#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

namespace ckpt {

uint64_t Xxh3(absl::string_view bytes) {
#if defined(__x86_64__)
  return XXH3_64bits_dispatch(bytes.data(), bytes.size());
#else
  return XXH3_64bits(bytes.data(), bytes.size());
#endif
}

void Xxh3Update(XXH3_state_t* state, absl::string_view bytes) {
#if defined(__x86_64__)
  XXH3_64bits_update_dispatch(state, bytes.data(), bytes.size());
#else
  XXH3_64bits_update(state, bytes.data(), bytes.size());
#endif
}

}  // namespace ckpt
