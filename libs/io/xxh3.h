#ifndef CKPT_LIBS_IO_XXH3_H_
#define CKPT_LIBS_IO_XXH3_H_

// XXH3-64, the checksum every stored chunk carries, through libxxhash's runtime dispatch on
// x86-64. Debian builds libxxhash for baseline x86-64, so its plain XXH3_64bits runs SSE2 code;
// the dispatching entry points pick AVX2 or AVX-512 where the CPU has them. The digests are the
// same (the dispatch only changes the instructions). On the benchmark VM, copying and hashing
// 768 MiB in 64 KiB blocks took 0.16-0.17 s with the plain entry point, 0.10-0.14 s dispatched.
// Every chunk checksum (the store, the loader's stream digests, the download client) goes through
// here, so a reader and a writer never disagree on how.

#include <xxhash.h>

#include <cstdint>
#include <memory>

#include "absl/strings/string_view.h"

namespace ckpt {

// XXH3_64bits(bytes) with seed 0.
uint64_t Xxh3(absl::string_view bytes);

// XXH3_64bits_update(state, bytes): the streaming form, for bytes that arrive in pieces.
void Xxh3Update(XXH3_state_t* state, absl::string_view bytes);

// Incremental XXH3_64bits (seed 0), for bytes hashed as they are sent or received. Its
// ~600-byte state is allocated on the first Update. Not thread-safe; movable.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(Xxh3Stream&&) noexcept;
  Xxh3Stream& operator=(Xxh3Stream&&) noexcept;

  void Update(absl::string_view bytes);
  // The digest of everything given since construction or the last Reset.
  uint64_t Digest() const;
  void Reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_XXH3_H_
