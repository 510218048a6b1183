// StoreFailover in one process: two stores on one bucket (libs/s3's fake) and a real etcd. One
// becomes the writer, the other follows its change log and answers reads; a handover moves the
// writes; the old writer cannot write again. Killed and paused writers (other processes) are
// tests/store_failover_test.cc.

#include "libs/ha/store_failover.h"

#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ha/testing/etcd_server.h"
#include "libs/s3/s3_client.h"
#include "libs/s3/testing/fake_s3_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/s3_chunk_backend.h"
#include "libs/store/testing/seeded_checkpoints.h"
#include "libs/testing/child_process.h"
#include "libs/testing/requirements.h"

namespace ckpt::ha {
namespace {

using ::ckpt::testing::CommitSeeded;
using ::ckpt::testing::ListedVersions;
using ::ckpt::testing::StatusIs;

struct Node {
  std::unique_ptr<RocksDbCheckpointStore> store;
  std::unique_ptr<StoreFailover> failover;
};

class StoreFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ckpt::testing::TestCaseDir();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  Node Start(const std::string& name) {
    Node node;
    S3ChunkBackendOptions backend_options;
    backend_options.prefix = "fleet/";
    absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(s3_.ClientOptions());
    EXPECT_OK(client.status());
    if (!client.ok()) return node;
    absl::StatusOr<std::unique_ptr<S3ChunkBackend>> backend =
        S3ChunkBackend::Create(std::shared_ptr<s3::S3Client>(*std::move(client)), backend_options);
    EXPECT_OK(backend.status());
    StoreOptions options;
    options.db_path = absl::StrCat(dir_, "/", name);
    options.chunk_backend = *std::move(backend);
    options.start_as_follower = true;
    absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
        RocksDbCheckpointStore::Open(options);
    EXPECT_OK(store.status());
    if (!store.ok()) return node;
    node.store = *std::move(store);
    EtcdClientOptions etcd_options;
    etcd_options.endpoints = etcd_.endpoint();
    absl::StatusOr<EtcdClient> etcd = EtcdClient::Create(etcd_options);
    EXPECT_OK(etcd.status());
    StoreFailoverOptions failover;
    failover.key = "/ckpt/writer/test-bucket/fleet/";
    failover.address = name;
    absl::StatusOr<std::unique_ptr<StoreFailover>> started =
        StoreFailover::Start(*node.store, *std::move(etcd), failover);
    EXPECT_OK(started.status());
    if (started.ok()) node.failover = *std::move(started);
    return node;
  }

  // Waits until `node` is the writer (true) or `timeout` passes (false).
  static bool WaitForWriter(const Node& node, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (node.failover->is_writer()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  static bool WaitForVersions(RocksDbCheckpointStore& store, const std::set<int64_t>& versions) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::set<int64_t>> listed = ListedVersions(store, "m");
      if (listed.ok() && *listed == versions) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  testing::EtcdServer etcd_;
  ckpt::testing::FakeS3Server s3_;
  std::string dir_;
};

TEST_F(StoreFailoverTest, OneWriterTheOtherFollowsAndAHandoverMovesTheWrites) {
  CKPT_REQUIRE(testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  ASSERT_TRUE(etcd_.ok());
  Node a = Start("store-a");
  ASSERT_TRUE(WaitForWriter(a, absl::Seconds(10)));
  Node b = Start("store-b");
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(b.failover->is_writer());

  ASSERT_OK(CommitSeeded(*a.store, "m", 1).status());
  ASSERT_OK(CommitSeeded(*a.store, "m", 2).status());
  // The follower answers reads within its follow interval, and refuses changes, naming the writer.
  ASSERT_TRUE(WaitForVersions(*b.store, {1, 2}));
  ASSERT_OK(ckpt::testing::CheckSeeded(*b.store, "m", 2, 2));
  EXPECT_THAT(CommitSeeded(*b.store, "m", 3),
              StatusIs(absl::StatusCode::kUnavailable, "follows the writer"));
  EXPECT_THAT(b.store->SetAlias("m", "best", 1),
              StatusIs(absl::StatusCode::kUnavailable, "the writer is at store-a"));

  // A clean handover: the writer stops (its lease revoked), the follower takes over at once.
  const absl::Time stopped = absl::Now();
  a.failover.reset();
  ASSERT_TRUE(WaitForWriter(b, absl::Seconds(10)));
  const absl::Duration handover = absl::Now() - stopped;
  EXPECT_LT(handover, absl::Seconds(2)) << "a revoked lease needs no TTL to pass";
  ASSERT_OK_AND_ASSIGN(int64_t third, CommitSeeded(*b.store, "m", 3));
  EXPECT_EQ(third, 3);
  // The old writer, still open, can write nothing: it is a follower now, and its log position
  // is taken.
  EXPECT_THAT(a.store->SetAlias("m", "best", 1), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_OK_AND_ASSIGN(std::set<int64_t> versions, ListedVersions(*b.store, "m"));
  EXPECT_EQ(versions, (std::set<int64_t>{1, 2, 3}));
}

// The writer's lease expires while it is cut off from etcd (here: etcd killed): it steps down by
// itself before the lease could have passed to anyone, and refuses changes from then on.
TEST_F(StoreFailoverTest, AWriterThatCannotRenewItsLeaseStepsDown) {
  CKPT_REQUIRE(testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  ASSERT_TRUE(etcd_.ok());
  Node a = Start("store-a");
  ASSERT_TRUE(WaitForWriter(a, absl::Seconds(10)));
  ASSERT_OK(CommitSeeded(*a.store, "m", 1).status());
  etcd_.process()->Signal(SIGSTOP);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (a.failover->is_writer() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(a.failover->is_writer());
  EXPECT_THAT(CommitSeeded(*a.store, "m", 2), StatusIs(absl::StatusCode::kUnavailable));
  etcd_.process()->Signal(SIGCONT);
  // Once etcd answers again, it is elected again (the only store) and carries on.
  ASSERT_TRUE(WaitForWriter(a, absl::Seconds(15)));
  ASSERT_OK_AND_ASSIGN(int64_t next, CommitSeeded(*a.store, "m", 2));
  EXPECT_EQ(next, 2);
}

}  // namespace
}  // namespace ckpt::ha
