// Several checkpoint_store processes on one bucket (libs/s3's fake S3 server) and a real etcd
// (issue #53): the one holding the writer's lease takes changes, the other follows. Through a
// client given both addresses, as a trainer or `ckpt --store=A,B` is:
//   - kill -9 of the writer: the follower takes over within seconds; every acknowledged commit
//     is there exactly once, and commits go on (F1, the failover time, is printed);
//   - SIGSTOP of the writer past its lease (split brain): the follower takes over and commits;
//     after SIGCONT the old writer acknowledges nothing and nothing it tried is visible.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/ha/testing/etcd_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/testing/seeded_checkpoints.h"
#include "libs/testing/child_process.h"
#include "libs/testing/requirements.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ChildProcess;
using ::ckpt::testing::CommitSeeded;

constexpr char kAccessKey[] = "AKIDHA";
constexpr char kSecretKey[] = "ha/secret+key";
constexpr char kBucket[] = "ha-bucket";

class StoreFleet {
 public:
  explicit StoreFleet(std::string dir) : dir_(std::move(dir)), etcd_(dir_ + "/etcd") {}

  bool StartBucket() {
    std::filesystem::create_directories(dir_ + "/s3");
    s3_ = std::make_unique<ChildProcess>("/usr/bin/python3", dir_ + "/s3");
    if (!s3_->Start({testing::RunfilesPath("libs/s3/testdata/fake_s3_server.py"),
                     "--port_file=" + dir_ + "/s3/port", "--bucket=" + std::string(kBucket),
                     "--access_key=" + std::string(kAccessKey),
                     "--secret_key=" + std::string(kSecretKey)})) {
      return false;
    }
    const int port = s3_->WaitForPort(dir_ + "/s3/port", absl::Seconds(30));
    endpoint_ = absl::StrCat("http://127.0.0.1:", port);
    testing::WriteTextFile(dir_ + "/credentials",
                           absl::StrCat("[default]\naws_access_key_id = ", kAccessKey,
                                        "\naws_secret_access_key = ", kSecretKey, "\n"));
    return port > 0 && etcd_.ok();
  }

  // Starts store `name` (a fresh directory: its own host); its port, 0 on failure.
  int StartStore(const std::string& name, int port = 0) {
    const std::string home = absl::StrCat(dir_, "/", name, "-", ++starts_);
    std::filesystem::create_directories(home);
    auto process = std::make_unique<ChildProcess>(
        testing::RunfilesPath("services/checkpoint_store/checkpoint_store"), home);
    if (!process->Start({"--store_dir=" + home + "/index",
                         absl::StrCat("--listen=127.0.0.1:", port), "--port_file=" + home + "/port",
                         "--chunks_s3_endpoint=" + endpoint_,
                         "--chunks_s3_bucket=" + std::string(kBucket),
                         "--chunks_s3_prefix=fleet/",
                         "--chunks_s3_credentials_file=" + dir_ + "/credentials",
                         "--etcd_endpoints=" + etcd_.endpoint(), "--writer_lease_ttl=2s",
                         "--follow_interval=100ms", "--shutdown_grace=1s"})) {
      return 0;
    }
    const int bound = process->WaitForPort(home + "/port", absl::Seconds(30));
    stores_[name] = std::move(process);
    ports_[name] = bound;
    return bound;
  }

  ChildProcess& store(const std::string& name) { return *stores_.at(name); }
  int port(const std::string& name) { return ports_.at(name); }

  // The store whose stderr says last that it is the writer; "" when none does within `timeout`.
  std::string WaitForWriter(absl::Duration timeout, const std::string& other_than = "") {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      for (const auto& [name, process] : stores_) {
        if (name == other_than) continue;
        const std::string text = process->stderr_text();
        const size_t writer = text.rfind("checkpoint_store: the writer");
        const size_t follower = text.rfind("checkpoint_store: a follower");
        if (writer != std::string::npos && (follower == std::string::npos || follower < writer)) {
          return name;
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return "";
  }

  absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> Client(const std::string& address) {
    RemoteStoreOptions options;
    options.address = address;
    options.deadline = absl::Seconds(10);
    options.connect_timeout = absl::Seconds(2);
    return RemoteCheckpointStore::Connect(options);
  }

  std::string AllAddresses() {
    std::vector<std::string> all;
    for (const auto& [name, port] : ports_) all.push_back(absl::StrCat("127.0.0.1:", port));
    return absl::StrJoin(all, ",");
  }

 private:
  std::string dir_;
  ha::testing::EtcdServer etcd_;
  std::unique_ptr<ChildProcess> s3_;
  std::string endpoint_;
  int starts_ = 0;
  std::map<std::string, std::unique_ptr<ChildProcess>> stores_;
  std::map<std::string, int> ports_;
};

// Commits seed `seed` until one attempt is acknowledged (as a trainer's next checkpoint would be
// tried again); the version, or the last error at `deadline`.
absl::StatusOr<int64_t> CommitUntilAcknowledged(CheckpointStore& store, int64_t seed,
                                                absl::Time deadline) {
  absl::Status last;
  while (absl::Now() < deadline) {
    absl::StatusOr<int64_t> version = CommitSeeded(store, "m", seed);
    if (version.ok()) return version;
    last = version.status();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return last;
}

// Every version of "m" and the seed it holds (its global step).
std::map<int64_t, int64_t> SeedsByVersion(CheckpointStore& store) {
  std::map<int64_t, int64_t> seeds;
  absl::StatusOr<std::vector<v1::VersionInfo>> versions = store.ListVersions("m");
  if (absl::IsNotFound(versions.status())) return seeds;  // not followed that far yet.
  EXPECT_TRUE(versions.ok()) << versions.status();
  if (!versions.ok()) return seeds;
  for (const v1::VersionInfo& info : *versions) {
    v1::VersionRef ref;
    ref.set_model("m");
    ref.set_version(info.version());
    absl::StatusOr<v1::Manifest> manifest = store.GetManifest(ref);
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    if (manifest.ok()) seeds[info.version()] = manifest->metadata().global_step();
  }
  return seeds;
}

// Every acknowledged seed is in `seeds` exactly once; no seed appears twice.
void ExpectEachAcknowledgedOnce(const std::map<int64_t, int64_t>& seeds,
                                const std::vector<int64_t>& acknowledged) {
  std::map<int64_t, int> count;
  for (const auto& [version, seed] : seeds) ++count[seed];
  for (const auto& [seed, times] : count) EXPECT_EQ(times, 1) << "seed " << seed << " twice";
  for (int64_t seed : acknowledged) EXPECT_EQ(count[seed], 1) << "acknowledged seed " << seed;
}

class StoreFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestCaseDir();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string dir_;
};

TEST_F(StoreFailoverTest, AKilledWriterIsReplacedWithinSecondsAndNoCommitIsLostOrDoubled) {
  CKPT_REQUIRE(ha::testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  StoreFleet fleet(dir_);
  ASSERT_TRUE(fleet.StartBucket());
  ASSERT_GT(fleet.StartStore("a"), 0) << fleet.store("a").stderr_text();
  ASSERT_EQ(fleet.WaitForWriter(absl::Seconds(15)), "a") << fleet.store("a").stderr_text();
  ASSERT_GT(fleet.StartStore("b"), 0) << fleet.store("b").stderr_text();
  ASSERT_OK_AND_ASSIGN(auto client, fleet.Client(fleet.AllAddresses()));

  std::vector<int64_t> acknowledged;
  for (int64_t seed = 1; seed <= 3; ++seed) {
    ASSERT_OK(CommitUntilAcknowledged(*client, seed, absl::Now() + absl::Seconds(20)).status());
    acknowledged.push_back(seed);
  }
  // The follower answers reads from what it followed.
  ASSERT_OK_AND_ASSIGN(auto follower, fleet.Client(absl::StrCat("127.0.0.1:", fleet.port("b"))));
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (SeedsByVersion(*follower).size() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(SeedsByVersion(*follower).size(), 3u);
  EXPECT_THAT(CommitSeeded(*follower, "m", 99),
              testing::StatusIs(absl::StatusCode::kUnavailable, "writer"));

  const absl::Time killed = absl::Now();
  fleet.store("a").Signal(SIGKILL);
  ASSERT_OK(CommitUntilAcknowledged(*client, 4, absl::Now() + absl::Seconds(30)).status())
      << fleet.store("b").stderr_text();
  const absl::Duration failover = absl::Now() - killed;
  acknowledged.push_back(4);
  std::printf("F1 failover (kill -9 of the writer, lease TTL 2 s): %.2f s to the first "
              "acknowledged commit on its successor\n",
              absl::ToDoubleSeconds(failover));
  EXPECT_LT(failover, absl::Seconds(5));
  EXPECT_EQ(fleet.WaitForWriter(absl::Seconds(1), /*other_than=*/"a"), "b");

  // The killed host comes back empty (a new disk): it rebuilds from the bucket and follows.
  ASSERT_GT(fleet.StartStore("a2"), 0);
  for (int64_t seed = 5; seed <= 6; ++seed) {
    ASSERT_OK(CommitUntilAcknowledged(*client, seed, absl::Now() + absl::Seconds(20)).status());
    acknowledged.push_back(seed);
  }
  ASSERT_OK_AND_ASSIGN(auto rebuilt, fleet.Client(absl::StrCat("127.0.0.1:", fleet.port("a2"))));
  deadline = absl::Now() + absl::Seconds(10);
  while (SeedsByVersion(*rebuilt).size() < acknowledged.size() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::map<int64_t, int64_t> on_writer = SeedsByVersion(*client);
  ExpectEachAcknowledgedOnce(on_writer, acknowledged);
  EXPECT_EQ(SeedsByVersion(*rebuilt), on_writer);
}

TEST_F(StoreFailoverTest, APausedWriterPastItsLeaseAcknowledgesNothingAfterItsSuccessorStarted) {
  CKPT_REQUIRE(ha::testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  StoreFleet fleet(dir_);
  ASSERT_TRUE(fleet.StartBucket());
  ASSERT_GT(fleet.StartStore("a"), 0);
  ASSERT_EQ(fleet.WaitForWriter(absl::Seconds(15)), "a");
  ASSERT_GT(fleet.StartStore("b"), 0);
  ASSERT_OK_AND_ASSIGN(auto to_a, fleet.Client(absl::StrCat("127.0.0.1:", fleet.port("a"))));
  ASSERT_OK_AND_ASSIGN(auto to_b, fleet.Client(absl::StrCat("127.0.0.1:", fleet.port("b"))));
  ASSERT_OK(CommitSeeded(*to_a, "m", 1).status());

  fleet.store("a").Signal(SIGSTOP);
  ASSERT_EQ(fleet.WaitForWriter(absl::Seconds(15), /*other_than=*/"a"), "b")
      << fleet.store("b").stderr_text();
  ASSERT_OK(CommitUntilAcknowledged(*to_b, 2, absl::Now() + absl::Seconds(10)).status());
  // The old writer wakes up believing, for a moment, that it still writes: whatever it is sent
  // now is refused -- by its own step-down or by the log, whose next number is taken.
  fleet.store("a").Signal(SIGCONT);
  for (int64_t seed = 100; seed < 105; ++seed) {
    EXPECT_FALSE(CommitSeeded(*to_a, "m", seed).ok()) << "seed " << seed << " acknowledged";
    EXPECT_FALSE(to_a->SetAlias("m", "best", 1).ok());
  }
  ASSERT_OK(CommitUntilAcknowledged(*to_b, 3, absl::Now() + absl::Seconds(10)).status());
  const std::map<int64_t, int64_t> seeds = SeedsByVersion(*to_b);
  EXPECT_EQ(seeds, (std::map<int64_t, int64_t>{{1, 1}, {2, 2}, {3, 3}}));
  // The old writer, now a follower, converges on the same registry.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (SeedsByVersion(*to_a) != seeds && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(SeedsByVersion(*to_a), seeds);
  EXPECT_THAT(fleet.store("a").stderr_text(), ::testing::HasSubstr("a follower"));
}

}  // namespace
}  // namespace ckpt
