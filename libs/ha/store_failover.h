#ifndef CKPT_LIBS_HA_STORE_FAILOVER_H_
#define CKPT_LIBS_HA_STORE_FAILOVER_H_

// StoreFailover: which of several checkpoint stores sharing one change log (one bucket) is the
// writer, chosen with a lease in etcd (issue #53); the others follow the log and answer reads.
//
// Each store runs one of these. A store that is not the writer tries, every `follow_interval`,
// to create the etcd key `key` (holding its address) under a lease of its own; the one that
// creates it calls TakeOverAsWriter (catch up, then a takeover record that fences every earlier
// writer) and keeps the lease alive every ttl/3. The others apply the writer's records
// (FollowChangeLog) and refuse changes with the writer's address. When the writer dies, its lease
// expires after `lease_ttl`, the key goes with it, and the first follower to create it again
// takes over: so a failover takes at most about lease_ttl + follow_interval + the catch-up.
//
// Safety does not rest on the lease: a writer paused past its TTL (SIGSTOP, a stalled VM) or cut
// off from etcd may still believe it writes, but its next change needs the next log record, which
// the successor's takeover record already holds, so the append is refused (S3 If-None-Match) and
// the store steps down. The lease decides who may try; the log's conditional creates decide who
// succeeds. A writer steps down by itself once it cannot renew its lease before it would expire.
//
// Thread-safe; one thread of its own.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/ha/etcd_client.h"
#include "libs/store/rocksdb_checkpoint_store.h"

namespace ckpt::ha {

struct StoreFailoverOptions {
  // The etcd key that names the writer, one per change log (e.g. "/ckpt/writer/BUCKET/PREFIX").
  // Required.
  std::string key;
  // This store's address as clients reach it: what followers name as the writer. Required.
  std::string address;
  // The writer's lease. Shorter fails over sooner; each renewal is a round trip to etcd, and a
  // writer that cannot renew within it (etcd slow or unreachable that long) steps down. etcd
  // raises TTLs below its minimum (1.5 s with its default election timeout). Default 2 s.
  absl::Duration lease_ttl = absl::Seconds(2);
  // How often a follower applies new records and tries for the lease. Default 100 ms.
  absl::Duration follow_interval = absl::Milliseconds(100);
  // Called on the failover thread when this store becomes the writer (true) or a follower
  // (false, with the writer's address when known): the service's health status follows it.
  std::function<void(bool writer, const std::string& writer_address)> on_role;
};

class StoreFailover {
 public:
  // Starts following (the store must have been opened with start_as_follower).
  // INVALID_ARGUMENT for a missing key or address, or a store that is not a follower.
  static absl::StatusOr<std::unique_ptr<StoreFailover>> Start(RocksDbCheckpointStore& store,
                                                              EtcdClient etcd,
                                                              StoreFailoverOptions options);
  // Stops the thread; a writer steps down and revokes its lease, so a follower takes over at
  // once instead of after the TTL.
  ~StoreFailover();

  bool is_writer() const { return writer_.load(); }

 private:
  StoreFailover(RocksDbCheckpointStore& store, EtcdClient etcd, StoreFailoverOptions options);
  void Run();
  void Follow();
  void Lead();
  void SetRole(bool writer, const std::string& writer_address);

  RocksDbCheckpointStore& store_;
  EtcdClient etcd_;
  const StoreFailoverOptions options_;
  std::atomic<bool> writer_{false};
  int64_t lease_ = 0;                             // the failover thread's only.
  absl::Time renew_by_ = absl::InfinitePast();    // step down if not renewed by then.
  absl::Time next_renewal_ = absl::InfinitePast();
  std::string last_writer_address_;
  bool role_announced_ = false;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace ckpt::ha

#endif  // CKPT_LIBS_HA_STORE_FAILOVER_H_
