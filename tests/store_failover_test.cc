// Several checkpoint_store processes on one bucket (libs/s3's fake S3 server) and a real etcd
// (issue #53): the one holding the writer's lease takes changes, the other follows. Through a
// client given both addresses, as a trainer or `ckpt --store=A,B` is:
//   - kill -9 of the writer: the follower takes over within seconds; every acknowledged commit
//     is there exactly once, and commits go on (F1, the failover time, is printed);
//   - a committer calling CommitCheckpoint back to back while the writer is killed: every call
//     succeeds once, none has to be retried by the caller, none lands twice; a Watch begun on
//     the writer resumes on its successor and sees each commit once, in order;
//   - SIGSTOP of the writer past its lease (split brain): the follower takes over and commits;
//     after SIGCONT the old writer acknowledges nothing and nothing it tried is visible.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ATen/ops/empty.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/ha/testing/etcd_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
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

  // The bucket, store "a" as the writer, store "b" following it.
  ::testing::AssertionResult StartWriterAndFollower() {
    if (!StartBucket()) return ::testing::AssertionFailure() << "the bucket or etcd did not start";
    if (StartStore("a") == 0 || WaitForWriter(absl::Seconds(15)) != "a") {
      return ::testing::AssertionFailure() << "a is not the writer: " << StderrOf("a");
    }
    if (StartStore("b") == 0) {
      return ::testing::AssertionFailure() << "b did not start: " << StderrOf("b");
    }
    return ::testing::AssertionSuccess();
  }

  ChildProcess& store(const std::string& name) { return *stores_.at(name); }
  std::string StderrOf(const std::string& name) {
    return stores_.count(name) > 0 ? store(name).stderr_text() : "(its process did not start)";
  }
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
  ASSERT_TRUE(fleet.StartWriterAndFollower());
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

// Checkpoint `seed` as a trainer hands it over: tensors in memory (SeededContents' bytes), the
// seed as its global step.
CheckpointContents SeededCheckpoint(int64_t seed) {
  CheckpointContents contents;
  for (const auto& [key, bytes] : testing::SeededContents(seed)) {
    const bool step = key == "step";
    at::Tensor tensor =
        at::empty({static_cast<int64_t>(bytes.size()) / (step ? 8 : 4)},
                  at::TensorOptions().dtype(step ? at::kLong : at::kInt));
    std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
    EXPECT_OK(contents.model.Insert(key, tensor));
  }
  contents.metadata.set_global_step(seed);
  return contents;
}

TEST_F(StoreFailoverTest, ACommitterGivenEveryStoreRidesThroughAKilledWriterWithoutRetryingItself) {
  CKPT_REQUIRE(ha::testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  StoreFleet fleet(dir_);
  ASSERT_TRUE(fleet.StartWriterAndFollower());
  // As the trainer's store client is: every address, and the default window in which a commit
  // is sent again (connect_timeout, 10 s).
  RemoteStoreOptions options;
  options.address = fleet.AllAddresses();
  options.deadline = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(auto client, RemoteCheckpointStore::Connect(options));

  // A watcher of the model, as `ckpt sync` is: its watch began on the writer, must resume on
  // the successor, and must see every commit once, in order.
  v1::WatchRequest watch_request;
  watch_request.add_models("m");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, client->Watch(watch_request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> state,
                       watch->Next(absl::Now() + absl::Seconds(10)));
  ASSERT_TRUE(state.has_value() && state->has_state());

  // One CommitCheckpoint per checkpoint, back to back, while the writer is killed under them:
  // each returns OK once (the one in flight at the kill is sent again to the new writer with its
  // idempotency key), and the registry holds each exactly once.
  constexpr int64_t kCheckpoints = 8;
  std::vector<absl::StatusOr<CommitResult>> results;
  std::atomic<int> acknowledged{0};
  std::thread committer([&] {
    for (int64_t seed = 1; seed <= kCheckpoints; ++seed) {
      results.push_back(CommitCheckpoint(*client, "m", SeededCheckpoint(seed)));
      ++acknowledged;
    }
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (acknowledged.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  fleet.store("a").Signal(SIGKILL);
  committer.join();
  std::vector<int64_t> seeds;
  for (int64_t seed = 1; seed <= kCheckpoints; ++seed) {
    const absl::StatusOr<CommitResult>& result = results[seed - 1];
    EXPECT_OK(result.status()) << "checkpoint " << seed << "\n" << fleet.store("b").stderr_text();
    if (result.ok()) seeds.push_back(seed);
  }
  EXPECT_EQ(fleet.WaitForWriter(absl::Seconds(1), /*other_than=*/"a"), "b");
  const std::map<int64_t, int64_t> on_writer = SeedsByVersion(*client);
  ExpectEachAcknowledgedOnce(on_writer, seeds);
  EXPECT_EQ(on_writer.size(), static_cast<size_t>(kCheckpoints));
  for (const auto& [version, seed] : on_writer) {
    EXPECT_OK(testing::CheckSeeded(*client, "m", version, seed));
  }
  std::vector<int64_t> watched;
  while (watched.size() < on_writer.size()) {
    ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> update,
                         watch->Next(absl::Now() + absl::Seconds(15)));
    ASSERT_TRUE(update.has_value()) << "the watch saw " << watched.size() << " commits";
    if (update->has_event() && update->event().kind() == v1::RegistryEvent::VERSION_COMMITTED) {
      watched.push_back(update->event().version());
    }
  }
  std::vector<int64_t> versions;
  for (const auto& [version, seed] : on_writer) versions.push_back(version);
  EXPECT_EQ(watched, versions);
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
