// Multi-node training on two "hosts": two network namespaces joined by a veth pair, the real
// trainer launcher in each (--nnodes=2, 2 ranks per node over Gloo), rank 0's embedded store lent
// to node 1's ranks over TLS. One rank of node 1 is SIGKILLed mid-training; both launchers
// restart their ranks, and the run must end bit-identical to an uninterrupted run while every
// rank, on either host, holds the same model after every step.
//
// Needs root (CAP_NET_ADMIN) and iproute2's `ip`; skipped with the reason where namespaces
// cannot be made.

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"
#include "libs/train/testing/bundle_comparison.h"
#include "tests/testing/trainer_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::ChildProcess;
using ::ckpt::testing::FindRank;
using ::ckpt::testing::IsOk;
using ::ckpt::testing::OpenStore;
using ::ckpt::testing::ReadFileOrEmpty;
using ::ckpt::testing::RunfilesPath;
using ::ckpt::testing::RunShell;
using ::ckpt::testing::ShellResult;
using ::ckpt::testing::TempPath;
using ::testing::HasSubstr;

constexpr char kModel[] = "mlp-synthetic";
constexpr char kNamePrefix[] = "ckmn";  // namespaces ckmn<pid>a/b, veths ckmn<pid>va/vb.
constexpr int64_t kSteps = 600;
// Rank 3 is killed once it has logged this step: past the checkpoint at step 250, so the steps
// after it are trained twice.
constexpr int64_t kKillAfterStep = 275;

std::string IpCommand() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Namespaces whose creator (the pid in their name) is gone: left by a test that was killed
// before its cleanup ran. Their processes are killed and the namespaces deleted.
void RemoveStaleNamespaces(const std::string& ip) {
  DIR* dir = opendir("/run/netns");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(kNamePrefix, 0) != 0 || name.size() < strlen(kNamePrefix) + 2) continue;
    pid_t pid = 0;
    const std::string digits =
        name.substr(strlen(kNamePrefix), name.size() - 1 - strlen(kNamePrefix));
    if (absl::SimpleAtoi(digits, &pid) && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      stale.push_back(name);
    }
  }
  closedir(dir);
  for (const std::string& name : stale) {
    RunShell(absl::StrCat(ip, " netns pids ", name, " | xargs -r kill -9; ", ip, " netns del ",
                          name, " 2>/dev/null"));
  }
}

// Two network namespaces ("hosts") joined by a veth pair: node 0 at 10.231.<x>.1, node 1 at
// .2 (/30), loopback up in each. Destroying it kills what still runs inside them and deletes
// them (the veth pair goes with them).
class TwoHosts {
 public:
  // nullptr with `skip_reason` set when namespaces cannot be made here.
  static std::unique_ptr<TwoHosts> Create(std::string& skip_reason) {
    const std::string ip = IpCommand();
    if (ip.empty()) {
      skip_reason = "iproute2's `ip` is not installed; multi-node needs network namespaces";
      return nullptr;
    }
    RemoveStaleNamespaces(ip);
    auto hosts = std::unique_ptr<TwoHosts>(new TwoHosts(ip));
    const std::string id = absl::StrCat(kNamePrefix, getpid());
    hosts->ns_ = {id + "a", id + "b"};
    hosts->veth_ = {id + "va", id + "vb"};
    // A third octet of our own (by pid) keeps logs of parallel runs apart; the namespaces are
    // private either way.
    const int octet = static_cast<int>(getpid() % 250) + 1;
    hosts->address_ = {absl::StrCat("10.231.", octet, ".1"), absl::StrCat("10.231.", octet, ".2")};
    ShellResult added = RunShell(absl::StrCat(ip, " netns add ", hosts->ns_[0], " 2>&1"));
    if (added.exit_code != 0) {
      skip_reason = absl::StrCat(
          "cannot create a network namespace (needs root / CAP_NET_ADMIN; ",
          "`ip netns add` said: ", absl::StripTrailingAsciiWhitespace(added.output), ")");
      return nullptr;
    }
    hosts->created_ = 1;
    ShellResult made = RunShell(absl::StrCat(ip, " netns add ", hosts->ns_[1], " 2>&1"));
    if (made.exit_code == 0) hosts->created_ = 2;
    std::vector<std::string> steps = {
        absl::StrCat("link add ", hosts->veth_[0], " type veth peer name ", hosts->veth_[1]),
    };
    for (int node : {0, 1}) {
      steps.push_back(absl::StrCat("link set ", hosts->veth_[node], " netns ", hosts->ns_[node]));
      steps.push_back(absl::StrCat("-n ", hosts->ns_[node], " addr add ", hosts->address_[node],
                                   "/30 dev ", hosts->veth_[node]));
      steps.push_back(
          absl::StrCat("-n ", hosts->ns_[node], " link set ", hosts->veth_[node], " up"));
      steps.push_back(absl::StrCat("-n ", hosts->ns_[node], " link set lo up"));
    }
    for (const std::string& step : steps) {
      if (made.exit_code != 0) break;
      made = RunShell(absl::StrCat(ip, " ", step, " 2>&1"));
    }
    if (made.exit_code != 0) {
      skip_reason = absl::StrCat("cannot join two network namespaces with a veth pair: ",
                                 absl::StripTrailingAsciiWhitespace(made.output));
      return nullptr;  // the destructor deletes what was made.
    }
    return hosts;
  }

  ~TwoHosts() {
    for (int node = 0; node < created_; ++node) {
      RunShell(absl::StrCat(ip_, " netns pids ", ns_[node], " | xargs -r kill -9"));
      RunShell(absl::StrCat(ip_, " netns del ", ns_[node], " 2>&1"));
    }
  }

  // `binary flags...` run inside node `node`'s namespace with `env` (NAME=VALUE) added; `ip netns
  // exec` and `env` exec in place, so the child's pid is the binary's.
  std::unique_ptr<ChildProcess> Start(int node, const std::string& dir, const std::string& binary,
                                      const std::vector<std::string>& env,
                                      const std::vector<std::string>& flags) const {
    mkdir(dir.c_str(), 0755);
    auto child = std::make_unique<ChildProcess>(ip_, dir);
    std::vector<std::string> args = {"netns", "exec", ns_[node], "/usr/bin/env"};
    args.insert(args.end(), env.begin(), env.end());
    args.push_back(binary);
    args.insert(args.end(), flags.begin(), flags.end());
    if (!child->Start(args)) return nullptr;
    return child;
  }

  const std::string& address(int node) const { return address_[node]; }
  const std::string& interface(int node) const { return veth_[node]; }

 private:
  explicit TwoHosts(std::string ip) : ip_(std::move(ip)) {}
  const std::string ip_;
  std::vector<std::string> ns_, veth_, address_;
  int created_ = 0;
};

std::string Trainer() {
  char resolved[PATH_MAX];
  const std::string path = RunfilesPath("services/trainer/trainer");
  return realpath(path.c_str(), resolved) != nullptr ? resolved : path;
}

// The same training job for every run: a small MLP, 4 ranks in all, bit-reproducible (one thread
// per rank), a checkpoint every 50 steps, a state digest per rank per step.
std::vector<std::string> JobFlags(const std::string& store_dir) {
  return {"--store_dir=" + store_dir, "--hidden=64",    absl::StrCat("--steps=", kSteps),
          "--checkpoint_every=50",    "--log_every=50", "--log_state_digests",
          "--rank_exit_timeout=3s"};
}

// Waits until the log at `log_path` shows `rank`'s state digest at or past `step`.
bool WaitForStep(const std::string& log_path, int rank, int64_t step, absl::Duration timeout) {
  const std::regex progress(absl::StrCat("rank ", rank, R"( step (\d+) state)"));
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const std::string log = ReadFileOrEmpty(log_path);
    for (auto it = std::sregex_iterator(log.begin(), log.end(), progress);
         it != std::sregex_iterator(); ++it) {
      if (std::stoll((*it)[1]) >= step) return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// rank -> step -> every state digest that rank logged for that step (a step trained again after
// a restart is logged again).
using Digests = std::map<int, std::map<int64_t, std::vector<std::string>>>;

void CollectDigests(const std::string& log, Digests& digests) {
  const std::regex line(R"(trainer: rank (\d+) step (\d+) state ([0-9a-f]{16}))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    digests[std::stoi((*it)[1])][std::stoll((*it)[2])].push_back((*it)[3]);
  }
}

std::string Logs(const std::vector<std::pair<std::string, std::string>>& logs) {
  std::string text;
  for (const auto& [name, log] : logs) absl::StrAppend(&text, "\n===== ", name, "\n", log);
  return text;
}

TEST(MultiNodeTest, KilledRankOnTheSecondHostResumesBitExactAndRanksAgreeOnEveryStep) {
  const absl::Time test_start = absl::Now();
  std::string skip_reason;
  std::unique_ptr<TwoHosts> hosts = TwoHosts::Create(skip_reason);
  if (hosts == nullptr) GTEST_SKIP() << skip_reason;
  const std::string trainer = Trainer();

  // The reference: the same job uninterrupted on one host, 4 ranks over loopback. Gloo reduces
  // in the same order whatever the transport, so two hosts must match it bit for bit.
  const std::string reference_store = TempPath("reference");
  const std::string reference_dir = TempPath("reference_logs");
  mkdir(reference_dir.c_str(), 0755);
  ChildProcess reference(trainer, reference_dir);
  std::vector<std::string> reference_flags = JobFlags(reference_store);
  reference_flags.push_back("--nproc_per_node=4");
  ASSERT_TRUE(reference.Start(reference_flags));
  std::optional<int> reference_exit = reference.WaitForExit(absl::Seconds(90));
  ASSERT_TRUE(reference_exit.has_value()) << reference.stderr_text();
  ASSERT_EQ(*reference_exit, 0) << reference.stderr_text();

  // Two hosts, two ranks each; node 1 keeps no store of its own (its ranks use rank 0's).
  const std::string store = TempPath("two_hosts");
  const std::string node1_store = TempPath("node1_store_unused");
  std::unique_ptr<ChildProcess> node[2];
  for (int n : {0, 1}) {
    std::vector<std::string> flags = JobFlags(n == 0 ? store : node1_store);
    for (const std::string& flag :
         {std::string("--nnodes=2"), absl::StrCat("--node_rank=", n),
          "--master_addr=" + hosts->address(0), std::string("--master_port=29500"),
          std::string("--nproc_per_node=2"), std::string("--max_restarts=1")}) {
      flags.push_back(flag);
    }
    // Gloo binds to the veth's address (as on a real cluster, where the hostname may resolve to
    // an interface the other host cannot reach).
    node[n] = hosts->Start(n, TempPath(absl::StrCat("node", n)), trainer,
                           {"GLOO_SOCKET_IFNAME=" + hosts->interface(n)}, flags);
    ASSERT_NE(node[n], nullptr);
  }
  auto logs = [&] {
    return Logs({{"node 0", node[0]->stderr_text()}, {"node 1", node[1]->stderr_text()}});
  };
  ASSERT_TRUE(WaitForStep(TempPath("node1/stderr"), 3, kKillAfterStep, absl::Seconds(60)))
      << logs();
  const pid_t rank3 = FindRank(node[1]->pid(), 3);
  ASSERT_GT(rank3, 0) << logs();
  ASSERT_EQ(kill(rank3, SIGKILL), 0);
  std::optional<int> exits[2];
  for (int n : {0, 1}) {
    exits[n] = node[n]->WaitForExit(absl::Seconds(90));
    ASSERT_TRUE(exits[n].has_value()) << "node " << n << " did not finish" << logs();
  }
  EXPECT_EQ(*exits[0], 0) << logs();
  EXPECT_EQ(*exits[1], 0) << logs();
  const std::string log0 = node[0]->stderr_text(), log1 = node[1]->stderr_text();

  // Node 1's ranks reached the store on node 0's address over TLS, not on a loopback.
  EXPECT_THAT(log0, HasSubstr(absl::StrCat("lending the embedded store to the other ranks on ",
                                           hosts->address(0), ":")));
  EXPECT_THAT(log0, HasSubstr("(TLS with this run's certificate)"));
  EXPECT_NE(access(node1_store.c_str(), F_OK), 0) << "node 1 opened a store of its own";
  // The kill was seen, both nodes restarted, and the run resumed from a checkpoint.
  EXPECT_THAT(log1, HasSubstr(absl::StrCat("rank 3 (pid ", rank3, ") was killed by signal 9")));
  EXPECT_THAT(log0, HasSubstr("restart 1")) << logs();
  EXPECT_THAT(log1, HasSubstr("restart 1")) << logs();
  std::smatch resumed;
  ASSERT_TRUE(std::regex_search(
      log0, resumed,
      std::regex(absl::StrCat(R"(resuming mlp-synthetic@(\d+) from step (\d+) to )", kSteps))))
      << logs();
  const int64_t resumed_step = std::stoll(resumed[2]);
  // A checkpoint every 50 steps (and at every 32-step epoch end) and the kill after step 275: a
  // retrain from 0 is not a resume.
  EXPECT_GE(resumed_step, 200);
  EXPECT_LT(resumed_step, kSteps);

  // Every rank on either host, before and after the restart, holds the reference's model after
  // every step.
  Digests expected, actual;
  CollectDigests(reference.stderr_text(), expected);
  CollectDigests(log0, actual);
  CollectDigests(log1, actual);
  ASSERT_EQ(expected.size(), 4u);
  ASSERT_EQ(actual.size(), 4u) << logs();
  int64_t compared = 0;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_EQ(actual[rank].size(), static_cast<size_t>(kSteps)) << "steps logged";
    for (int64_t step = 1; step <= kSteps; ++step) {
      ASSERT_EQ(expected[rank][step].size(), 1u) << "step " << step;
      const std::string& want = expected[0][step].front();
      EXPECT_EQ(expected[rank][step].front(), want) << "reference rank, step " << step;
      for (const std::string& got : actual[rank][step]) {
        EXPECT_EQ(got, want) << "step " << step;
        ++compared;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
  // Steps after the resumed one and up to the kill were trained twice and logged twice.
  EXPECT_GT(compared, 4 * kSteps);

  // The same versions at the same steps, and the final bundle bit-identical to the reference's.
  std::unique_ptr<RocksDbCheckpointStore> a = OpenStore(reference_store), b = OpenStore(store);
  ASSERT_TRUE(a && b);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions_a, a->ListVersions(kModel));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions_b, b->ListVersions(kModel));
  ASSERT_EQ(versions_a.size(), versions_b.size());
  for (size_t i = 0; i < versions_a.size(); ++i) {
    EXPECT_EQ(versions_a[i].metadata().global_step(), versions_b[i].metadata().global_step());
  }
  EXPECT_EQ(versions_b.back().metadata().global_step(), kSteps);
  EXPECT_EQ(versions_b.back().metadata().world_size(), 4);
  // Model, optimizer, scheduler and the trainer's own state (epoch, sampler position, steps,
  // RNG): everything a resume restores.
  EXPECT_THAT(train::testing::CompareStoredBundles(*a, *ParseVersionRef(kModel), *b,
                                                   *ParseVersionRef(kModel)),
              IsOk());
  std::cerr << "multinode_test: resumed at step " << resumed_step << ", " << compared
            << " rank-step digests compared, " << absl::FormatDuration(absl::Now() - test_start)
            << " in all\n";
}

}  // namespace
}  // namespace ckpt
