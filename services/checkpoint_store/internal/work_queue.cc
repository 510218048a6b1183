#include "services/checkpoint_store/internal/work_queue.h"

#include <utility>

namespace ckpt::store_service_internal {

WorkQueue::WorkQueue(int threads) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { RunWorker(); });
}

WorkQueue::~WorkQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void WorkQueue::Schedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
}

void WorkQueue::RunWorker() {
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkQueue* self) { return self->stopping_ || !self->queue_.empty(); }, this));
      // Drain before stopping: a scheduled closure may be the one that finishes a call.
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace ckpt::store_service_internal
