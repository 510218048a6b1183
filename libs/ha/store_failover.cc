#include "libs/ha/store_failover.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::ha {

namespace {

void Log(const std::string& line) { std::fprintf(stderr, "ckpt failover: %s\n", line.c_str()); }

}  // namespace

absl::StatusOr<std::unique_ptr<StoreFailover>> StoreFailover::Start(RocksDbCheckpointStore& store,
                                                                    EtcdClient etcd,
                                                                    StoreFailoverOptions options) {
  if (options.key.empty()) return absl::InvalidArgumentError("StoreFailoverOptions.key is empty");
  if (options.address.empty()) {
    return absl::InvalidArgumentError("StoreFailoverOptions.address is empty");
  }
  if (options.lease_ttl < absl::Seconds(1) || options.follow_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the writer's lease must be >= 1 s and the follow interval > 0");
  }
  if (!store.is_follower()) {
    return absl::InvalidArgumentError("StoreFailover needs a store opened as a follower");
  }
  auto failover = std::unique_ptr<StoreFailover>(
      new StoreFailover(store, std::move(etcd), std::move(options)));
  failover->thread_ = std::thread([raw = failover.get()] { raw->Run(); });
  return failover;
}

StoreFailover::StoreFailover(RocksDbCheckpointStore& store, EtcdClient etcd,
                             StoreFailoverOptions options)
    : store_(store), etcd_(std::move(etcd)), options_(std::move(options)) {}

StoreFailover::~StoreFailover() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  if (writer_.load()) {
    store_.StepDown("");
    writer_ = false;
  }
  if (lease_ != 0) {
    if (absl::Status revoked = etcd_.RevokeLease(lease_); !revoked.ok()) {
      Log(absl::StrCat("revoking the lease at shutdown: ", revoked.ToString()));
    }
  }
}

void StoreFailover::SetRole(bool writer, const std::string& writer_address) {
  const bool changed = !role_announced_ || writer != writer_.load() ||
                       (!writer && writer_address != last_writer_address_);
  writer_ = writer;
  last_writer_address_ = writer_address;
  role_announced_ = true;
  if (!writer) store_.StepDown(writer_address);
  if (changed && options_.on_role) options_.on_role(writer, writer_address);
}

void StoreFailover::Run() {
  SetRole(false, "");
  while (!stop_.WaitForNotificationWithTimeout(
      writer_.load() ? std::min(options_.follow_interval, options_.lease_ttl / 6)
                     : options_.follow_interval)) {
    if (writer_.load()) {
      Lead();
    } else {
      Follow();
    }
  }
}

void StoreFailover::Follow() {
  if (absl::StatusOr<int64_t> applied = store_.FollowChangeLog(); !applied.ok()) {
    Log(absl::StrCat("following the change log: ", applied.status().ToString()));
  }
  if (lease_ == 0) {
    absl::StatusOr<int64_t> lease = etcd_.GrantLease(options_.lease_ttl);
    if (!lease.ok()) {
      Log(absl::StrCat("asking etcd for a lease: ", lease.status().ToString()));
      return;
    }
    lease_ = *lease;
  }
  const absl::Time asked = absl::Now();
  EtcdValue holder;
  absl::StatusOr<bool> created = etcd_.CreateIfAbsent(options_.key, options_.address, lease_, &holder);
  if (absl::IsNotFound(created.status()) || absl::IsFailedPrecondition(created.status())) {
    lease_ = 0;  // our campaign lease expired while we followed: ask for another.
    return;
  }
  if (!created.ok()) {
    Log(absl::StrCat("trying for the writer's key: ", created.status().ToString()));
    return;
  }
  if (!*created) {
    if (holder.lease == lease_) {
      *created = true;  // ours already (an earlier answer lost).
    } else {
      // Keep the campaign lease alive for the next try.
      if (!etcd_.KeepAlive(lease_).ok()) lease_ = 0;
      if (holder.value != last_writer_address_) SetRole(false, holder.value);
      return;
    }
  }
  // Ours: the writer's key is held by our lease. Renewed from now on by Lead().
  renew_by_ = asked + options_.lease_ttl;
  if (absl::Status took = store_.TakeOverAsWriter(); !took.ok()) {
    Log(absl::StrCat("taking over as the writer: ", took.ToString(), "; giving the lease up"));
    if (!etcd_.RevokeLease(lease_).ok()) Log("revoking the lease failed; it expires by itself");
    lease_ = 0;
    return;
  }
  Log(absl::StrCat(options_.address, " is the writer (etcd lease ", lease_, ")"));
  next_renewal_ = absl::InfinitePast();
  SetRole(true, options_.address);
  Lead();
}

void StoreFailover::Lead() {
  if (store_.is_follower()) {
    // Fenced by the log: another store appended after this one (it took over while this one
    // was paused or cut off). Let it be the writer.
    Log("fenced by the change log: stepping down");
    if (!etcd_.RevokeLease(lease_).ok()) Log("revoking the lease failed; it expires by itself");
    lease_ = 0;
    SetRole(false, "");
    return;
  }
  const absl::Time now = absl::Now();
  if (now >= next_renewal_) {
    absl::StatusOr<absl::Duration> ttl = etcd_.KeepAlive(lease_);
    if (ttl.ok()) {
      renew_by_ = now + *ttl;  // from when we asked: the lease lasts at least that long.
      next_renewal_ = now + *ttl / 3;
    } else {
      Log(absl::StrCat("renewing the writer's lease: ", ttl.status().ToString()));
      if (absl::IsNotFound(ttl.status())) renew_by_ = absl::InfinitePast();
      next_renewal_ = now + options_.follow_interval;
    }
  }
  // Step down while the lease still holds, so no two stores believe they write at once (the
  // log would refuse the older one anyway).
  if (absl::Now() + options_.follow_interval >= renew_by_) {
    Log("the writer's lease could not be renewed in time: stepping down");
    lease_ = 0;
    SetRole(false, "");
  }
}

}  // namespace ckpt::ha
