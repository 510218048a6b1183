#ifndef CKPT_SERVICES_CHECKPOINT_STORE_INTERNAL_WORK_QUEUE_H_
#define CKPT_SERVICES_CHECKPOINT_STORE_INTERNAL_WORK_QUEUE_H_

// WorkQueue: a fixed pool of threads that runs closures in the order they were scheduled.
//
// The store service runs every store call here rather than on gRPC's callback threads: RocksDB
// reads can miss the cache, commits fsync, uploads hash megabytes, and a blocked callback thread
// stalls unrelated calls (gRPC's callback API asks reactions not to block).
//
// Thread-safe. The destructor runs everything already scheduled, then joins the threads; nothing
// may be scheduled once destruction has begun.

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::store_service_internal {

class WorkQueue {
 public:
  // `threads` >= 1.
  explicit WorkQueue(int threads);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Schedule(std::function<void()> work);

 private:
  void RunWorker();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // Joined by the destructor.
};

}  // namespace ckpt::store_service_internal

#endif  // CKPT_SERVICES_CHECKPOINT_STORE_INTERNAL_WORK_QUEUE_H_
