#include "libs/io/backoff.h"

#include <algorithm>
#include <random>
#include <utility>

namespace ckpt {
namespace {

double ThreadUniformDraw() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(generator);
}

}  // namespace

Backoff::Backoff(BackoffPolicy policy, absl::Time deadline, std::function<double()> uniform01)
    : policy_(policy),
      deadline_(deadline),
      uniform01_(uniform01 != nullptr ? std::move(uniform01) : ThreadUniformDraw) {}

absl::Duration Backoff::Delay(const BackoffPolicy& policy, int retry, double uniform01) {
  const absl::Duration initial = std::max(policy.initial, absl::ZeroDuration());
  const absl::Duration max = std::max(policy.max, initial);
  const double multiplier = std::max(policy.multiplier, 1.0);
  absl::Duration cap = initial;
  // Stops growing at the cap, so a long outage neither overflows nor loops for long.
  for (int i = 0; i < retry && cap < max; ++i) cap = cap * multiplier;
  cap = std::min(cap, max);
  const double jitter = std::clamp(policy.jitter, 0.0, 1.0);
  return cap * (1.0 - jitter * std::clamp(uniform01, 0.0, 1.0));
}

std::optional<absl::Duration> Backoff::Next() {
  const absl::Duration wait = Delay(policy_, retries_, uniform01_());
  if (deadline_ != absl::InfiniteFuture() && absl::Now() + wait >= deadline_) return std::nullopt;
  ++retries_;
  return wait;
}

bool Backoff::Wait() {
  const std::optional<absl::Duration> wait = Next();
  if (!wait.has_value()) return false;
  absl::SleepFor(*wait);
  return true;
}

}  // namespace ckpt
