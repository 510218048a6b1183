#include "libs/io/xxh3.h"

#include <memory>

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

struct Xxh3Stream::State {
  State() : state(XXH3_createState()) { XXH3_64bits_reset(state); }
  ~State() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

Xxh3Stream::Xxh3Stream() = default;
Xxh3Stream::~Xxh3Stream() = default;
Xxh3Stream::Xxh3Stream(Xxh3Stream&&) noexcept = default;
Xxh3Stream& Xxh3Stream::operator=(Xxh3Stream&&) noexcept = default;

void Xxh3Stream::Update(absl::string_view bytes) {
  if (state_ == nullptr) state_ = std::make_unique<State>();
  Xxh3Update(state_->state, bytes);
}

uint64_t Xxh3Stream::Digest() const {
  if (state_ == nullptr) return XXH3_64bits(nullptr, 0);
  return XXH3_64bits_digest(state_->state);
}

void Xxh3Stream::Reset() {
  if (state_ != nullptr) XXH3_64bits_reset(state_->state);
}

}  // namespace ckpt
