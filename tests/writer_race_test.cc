// Two writers racing, as two processes (writer_race_child: the real client, Promote and Rollback
// of libs/registry) with identities writer-a and writer-b against the real checkpoint_store
// binary. Each race holds both processes at a barrier just before they send SetAlias -- their
// reads and checks done, on the same state -- and releases them together (in a random order;
// kinds, versions and roles are random too, seed printed), so the store decides every race:
//  - concurrent promotes of two versions to production;
//  - a rollback of production racing a promote of a third version;
//  - SetAlias compare-and-set (expected_current_version) of two versions from the same state;
//  - creating an alias that must not exist yet (expected_current_version -1).
// Exactly one wins each race, the other gets FAILED_PRECONDITION saying the alias moved; and
// `ckpt history` and `ckpt audit` agree with the final state: every winning change is one
// ALIAS_SET event (by the winner, from the state both saw) and one OK set_alias record, every
// losing one a FAILED set_alias record and no event.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_matchers.h"
#include "libs/store/chunk_hasher.h"
#include "libs/testing/child_process.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace ckpt {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using testing::RunfilesPath;
using ::testing::StartsWith;

constexpr char kModel[] = "resnet";
constexpr char kProduction[] = "production";
constexpr int kVersions = 6;
constexpr int kRacesOfEachKind = 40;
// How long a writer may take to reach the barrier, and to finish after it.
constexpr absl::Duration kWriterWithin = absl::Seconds(60);

std::string Dir() { return std::getenv("TEST_TMPDIR"); }

// A token file for `name` and its identities-file entry.
std::string Identity(const std::string& name, const std::string& role) {
  const std::string token = "token-of-" + name;
  testing::WriteTextFile(Dir() + "/" + name + ".token", token + "\n");
  return absl::StrCat(R"({"name": ")", name, R"(", "token_sha256": ")", HexEncode(Sha256(token)),
                      R"(", "role": ")", role, R"("})");
}

// One writer_race_child, running as `identity` for the whole test: stdin and stdout are pipes to
// this process, stderr the file log(). The destructor ends its stdin and reaps it (SIGKILL if it
// does not end by itself).
class Writer {
 public:
  Writer(std::string identity, int store_port)
      : identity_(std::move(identity)), log_(absl::StrCat(Dir(), "/", identity_, ".log")) {
    std::vector<std::string> args = {RunfilesPath("tests/writer_race_child"),
                                     absl::StrCat("127.0.0.1:", store_port),
                                     Dir() + "/" + identity_ + ".token"};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    stdin_ = to_child[1];
    stdout_ = from_child[0];
  }
  ~Writer() {
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
    if (pid_ > 0 && !Wait(absl::Seconds(10)).has_value()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  const std::string& identity() const { return identity_; }
  std::string log() const { return testing::ReadFileOrEmpty(log_); }

  // Sends it one operation (writer_race_child's stdin syntax).
  void Send(const std::vector<std::string>& operation) {
    const std::string line = absl::StrCat(absl::StrJoin(operation, " "), "\n");
    (void)!write(stdin_, line.data(), line.size());
  }

  // The next line it prints; nullopt if none comes before `deadline` (or it ended).
  std::optional<std::string> ReadLine(absl::Time deadline) {
    for (;;) {
      const size_t newline = buffered_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffered_.substr(0, newline);
        buffered_.erase(0, newline + 1);
        return line;
      }
      const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      pollfd readable{stdout_, POLLIN, 0};
      if (stdout_ < 0 || wait_ms <= 0 || poll(&readable, 1, static_cast<int>(wait_ms)) != 1) {
        return std::nullopt;
      }
      char bytes[256];
      const ssize_t n = read(stdout_, bytes, sizeof(bytes));
      if (n <= 0) return std::nullopt;
      buffered_.append(bytes, n);
    }
  }

  // Lets it send SetAlias.
  void Go() { (void)!write(stdin_, "g", 1); }

  // Its exit status once it ended within `timeout`; nullopt otherwise.
  std::optional<int> Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    do {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < deadline);
    return std::nullopt;
  }

 private:
  const std::string identity_;
  const std::string log_;
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffered_;
};

// What one writer of a race was asked to do, and how it ended.
struct Attempt {
  std::string identity;
  std::vector<std::string> operation;  // a writer_race_child stdin line, split.
  std::string alias;
  int64_t version = 0;  // where it tried to point the alias.
  bool won = false;
  int64_t previous = 0;  // when won: where the alias pointed before.
  std::string result;    // the child's last line.
};

// A race both writers reached SetAlias in: who won, who lost.
struct Race {
  std::string tag;  // "race-N", the end of every reason recorded for it.
  std::string kind;
  int64_t from = 0;  // where the alias pointed when both read it (0: did not exist).
  Attempt winner;
  Attempt loser;
};

class WriterRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A writer that died must fail the test through its missing answer, not kill the test with
    // SIGPIPE on the next write to its stdin.
    signal(SIGPIPE, SIG_IGN);
    const char* seed_env = std::getenv("CKPT_WRITER_RACE_SEED");
    seed_ = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10)
                                : static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
    std::cout << "seed " << seed_ << " (rerun with CKPT_WRITER_RACE_SEED=" << seed_ << ")\n";
    random_.seed(seed_);
    testing::WriteTextFile(
        Dir() + "/identities.json",
        absl::StrCat(R"({"identities": [)", Identity("writer-a", "writer"), ", ",
                     Identity("writer-b", "writer"), ", ", Identity("ops", "admin"), "]}"));
    std::filesystem::create_directories(Dir() + "/store-run");
    store_ = std::make_unique<ChildProcess>(
        RunfilesPath("services/checkpoint_store/checkpoint_store"), Dir() + "/store-run");
    ASSERT_TRUE(store_->Start({"--store_dir=" + Dir() + "/store", "--listen=127.0.0.1:0",
                               "--port_file=" + Dir() + "/store-run/port",
                               "--identities_file=" + Dir() + "/identities.json"}));
    store_port_ = store_->WaitForPort(Dir() + "/store-run/port", absl::Seconds(60));
    ASSERT_GT(store_port_, 0) << store_->stderr_text();
    RemoteStoreOptions options;
    options.address = absl::StrCat("127.0.0.1:", store_port_);
    options.auth_token = "token-of-ops";
    ASSERT_OK_AND_ASSIGN(ops_, RemoteCheckpointStore::Connect(options));
    for (const char* identity : {"writer-a", "writer-b"}) {
      writers_[identity] = std::make_unique<Writer>(identity, store_port_);
    }
  }

  void TearDown() override {
    writers_.clear();  // they end with their stdin.
    if (store_ != nullptr) {
      store_->Signal(SIGTERM);
      EXPECT_TRUE(store_->WaitForExit(absl::Seconds(30)).has_value());
    }
  }

  // Commits a one-tensor version whose bytes name it.
  void CommitVersion(int version) {
    const std::string bytes = absl::StrCat("weights of version ", version);
    v1::Manifest header;
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key("w");
    meta->set_dtype(v1::DTYPE_UINT8);
    meta->add_shape(static_cast<int64_t>(bytes.size()));
    meta->set_byte_length(static_cast<int64_t>(bytes.size()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         ops_->BeginUpload(kModel, header, CommitOptions{}));
    ASSERT_OK(session->AddTensorData(0, 0, bytes));
    ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());
    ASSERT_EQ(committed.version.version(), version);
  }

  // Sends `a` and `b` to their writers, holds both at SetAlias, releases them in a random order
  // and fills in how each ended. Fails the test if either did not reach SetAlias.
  void RunRace(Attempt& a, Attempt& b) {
    Writer& first = *writers_.at(a.identity);
    Writer& second = *writers_.at(b.identity);
    first.Send(a.operation);
    second.Send(b.operation);
    const absl::Time deadline = absl::Now() + kWriterWithin;
    for (Writer* writer : {&first, &second}) {
      const std::optional<std::string> ready = writer->ReadLine(deadline);
      ASSERT_EQ(ready, "ready") << writer->identity() << " did not reach SetAlias; its log:\n"
                                << writer->log();
    }
    if (random_() % 2 == 0) {
      first.Go();
      second.Go();
    } else {
      second.Go();
      first.Go();
    }
    for (auto [writer, attempt] : {std::pair{&first, &a}, std::pair{&second, &b}}) {
      const std::optional<std::string> result = writer->ReadLine(absl::Now() + kWriterWithin);
      ASSERT_TRUE(result.has_value()) << writer->identity() << " never said how it ended; its "
                                      << "log:\n"
                                      << writer->log();
      attempt->result = *result;
      attempt->won = absl::StartsWith(*result, "won ");
      if (attempt->won) {
        ASSERT_TRUE(absl::SimpleAtoi(result->substr(4), &attempt->previous)) << *result;
      }
    }
  }

  // Checks that exactly one of `a` and `b` won from `from`, and that the loser was told the
  // alias moved, then records the race.
  void ExpectOneWinner(const std::string& kind, int64_t from, Attempt a, Attempt b,
                       const std::string& tag) {
    SCOPED_TRACE(absl::StrCat(tag, " (", kind, "): ", a.identity, " ", a.result, "; ", b.identity,
                              " ", b.result));
    ASSERT_NE(a.won, b.won) << "exactly one writer must win";
    Race race{tag, kind, from, a.won ? a : b, a.won ? b : a};
    EXPECT_EQ(race.winner.previous, from);
    EXPECT_THAT(race.loser.result, StartsWith("lost FAILED_PRECONDITION: "));
    if (kind == "create") {
      EXPECT_THAT(race.loser.result,
                  HasSubstr(absl::StrCat("points at version ", race.winner.version,
                                         "; expected it not to exist")));
    } else {
      EXPECT_THAT(race.loser.result,
                  HasSubstr(absl::StrCat("points at version ", race.winner.version,
                                         "; expected version ", from)));
    }
    std::cout << tag << " " << kind << " " << race.winner.alias << " from " << from << ": "
              << race.winner.identity << " -> " << race.winner.version << " won, "
              << race.loser.identity << " -> " << race.loser.version << " lost\n";
    races_run_.push_back(std::move(race));
  }

  // A version other than those in `not_these`.
  int64_t OtherVersion(const std::vector<int64_t>& not_these) {
    for (;;) {
      const int64_t version = 1 + static_cast<int64_t>(random_() % kVersions);
      if (std::find(not_these.begin(), not_these.end(), version) == not_these.end()) {
        return version;
      }
    }
  }

  // JSON lines that `ckpt COMMAND` prints as ops.
  std::vector<nlohmann::json> CkptJsonLines(const std::string& command) {
    const testing::ShellResult result = testing::RunShell(
        absl::StrCat("tools/ckpt/ckpt ", command, " --json --store=127.0.0.1:", store_port_,
                     " --store_auth_token_file=", Dir(), "/ops.token"));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    std::vector<nlohmann::json> lines;
    for (absl::string_view line : absl::StrSplit(result.output, '\n', absl::SkipEmpty())) {
      lines.push_back(nlohmann::json::parse(line, nullptr, false));
      EXPECT_FALSE(lines.back().is_discarded()) << line;
    }
    return lines;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 random_;
  std::unique_ptr<ChildProcess> store_;
  int store_port_ = 0;
  std::unique_ptr<RemoteCheckpointStore> ops_;
  std::map<std::string, std::unique_ptr<Writer>> writers_;
  std::vector<Race> races_run_;
};

TEST_F(WriterRaceTest, ExactlyOneWriterWinsEachRaceAndHistoryAndAuditAgree) {
  const absl::Time start = absl::Now();
  for (int version = 1; version <= kVersions; ++version) {
    ASSERT_NO_FATAL_FAILURE(CommitVersion(version));
  }
  ASSERT_OK(ops_->SetAlias(kModel, kProduction, 1, kAliasMustNotExist, {"", "setup"}).status());
  int64_t production = 1;
  // Where production pointed before its last move (what a rollback goes back to).
  int64_t before_production = 0;

  std::vector<std::string> kinds;
  for (int i = 0; i < kRacesOfEachKind; ++i) {
    for (const char* kind : {"promote", "rollback", "compare-and-set", "create"}) {
      kinds.push_back(kind);
    }
  }
  std::shuffle(kinds.begin(), kinds.end(), random_);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const std::string& kind = kinds[i];
    const std::string tag = absl::StrCat("race-", i + 1);
    const std::string model = kModel;
    Attempt a{"writer-a"}, b{"writer-b"};
    if (random_() % 2 == 0) std::swap(a.identity, b.identity);
    int64_t from = production;
    if (kind == "promote") {
      a.version = OtherVersion({production});
      b.version = OtherVersion({production, a.version});
      a.alias = b.alias = kProduction;
      a.operation = {"promote", model, absl::StrCat(a.version), kProduction, tag};
      b.operation = {"promote", model, absl::StrCat(b.version), kProduction, tag};
    } else if (kind == "rollback") {
      if (before_production == 0) {  // nothing to roll back to yet: make a move first.
        const int64_t to = OtherVersion({production});
        ASSERT_OK(
            ops_->SetAlias(kModel, kProduction, to, production, {"", tag + "-setup"}).status());
        before_production = production;
        production = from = to;
      }
      a.version = before_production;
      b.version = OtherVersion({production, before_production});
      a.alias = b.alias = kProduction;
      a.operation = {"rollback", model, kProduction, tag};
      b.operation = {"promote", model, absl::StrCat(b.version), kProduction, tag};
    } else if (kind == "compare-and-set") {
      a.version = OtherVersion({production});
      b.version = OtherVersion({production, a.version});
      a.alias = b.alias = kProduction;
      a.operation = {"set", model, kProduction, absl::StrCat(a.version), absl::StrCat(production),
                     tag};
      b.operation = {"set", model, kProduction, absl::StrCat(b.version), absl::StrCat(production),
                     tag};
    } else {  // create: an alias of its own that neither writer may find existing.
      from = 0;
      a.alias = b.alias = absl::StrCat("canary-", i + 1);
      a.version = OtherVersion({});
      b.version = OtherVersion({a.version});
      a.operation = {"set", model, a.alias, absl::StrCat(a.version), "-1", tag};
      b.operation = {"set", model, b.alias, absl::StrCat(b.version), "-1", tag};
    }
    ASSERT_NO_FATAL_FAILURE(RunRace(a, b));
    ASSERT_NO_FATAL_FAILURE(ExpectOneWinner(kind, from, a, b, tag));
    const Attempt& winner = races_run_.back().winner;
    if (winner.alias == kProduction) {
      before_production = production;
      production = winner.version;
    }
  }

  // The final state: production and every canary where its race's winner put it.
  std::map<std::string, int64_t> expected_aliases = {{kProduction, production}};
  for (const Race& race : races_run_) {
    if (race.kind == "create") expected_aliases[race.winner.alias] = race.winner.version;
  }
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, ops_->ListModels());
  ASSERT_EQ(models.size(), 1u);
  const std::map<std::string, int64_t> aliases(models[0].aliases().begin(),
                                               models[0].aliases().end());
  EXPECT_EQ(aliases, expected_aliases);

  // The history: one ALIAS_SET per winning change (the setup moves too), from the state both
  // writers saw, by the winner; none for a loser. Production's moves form one chain.
  std::vector<nlohmann::json> alias_events;
  for (nlohmann::json& event : CkptJsonLines(absl::StrCat("history ", kModel))) {
    if (event.value("kind", "") == "ALIAS_SET") alias_events.push_back(std::move(event));
  }
  std::vector<std::string> expected_events = {"ops production 0 -> 1"};
  for (const Race& race : races_run_) {
    expected_events.push_back(absl::StrCat(race.winner.identity, " ", race.winner.alias, " ",
                                           race.from, " -> ", race.winner.version));
  }
  std::vector<std::string> events;
  int64_t chain = 0;
  for (const nlohmann::json& event : alias_events) {
    const std::string reason = event.value("reason", "");
    if (absl::EndsWith(reason, "-setup")) continue;  // moves the test made between races.
    events.push_back(absl::StrCat(event.value("identity", ""), " ", event.value("alias", ""), " ",
                                  event.value("previous_version", int64_t{-1}), " -> ",
                                  event.value("version", int64_t{-1})));
  }
  EXPECT_EQ(events, expected_events);
  for (const nlohmann::json& event : alias_events) {
    if (event.value("alias", "") != kProduction) continue;
    EXPECT_EQ(event.value("previous_version", int64_t{-1}), chain)
        << "production moved from a version it did not point at: " << event.dump();
    chain = event.value("version", int64_t{-1});
  }
  EXPECT_EQ(chain, production);
  // Each race's tag ends the reason of exactly one event: the winner's.
  for (const Race& race : races_run_) {
    int tagged = 0;
    for (const nlohmann::json& event : alias_events) {
      const std::string reason = event.value("reason", "");
      if (absl::EndsWith(reason, "; " + race.tag) || reason == race.tag) ++tagged;
    }
    EXPECT_EQ(tagged, 1) << race.tag;
  }

  // The audit log: per race one OK set_alias by the winner and one FAILED (FAILED_PRECONDITION)
  // by the loser; the OK records in the order of the history; nothing left PENDING.
  std::vector<std::string> ok_records, failed_records;
  for (const nlohmann::json& record : CkptJsonLines(absl::StrCat("audit ", kModel))) {
    EXPECT_NE(record.value("outcome", ""), "PENDING") << record.dump();
    if (record.value("action", "") != "set_alias") continue;
    const std::string summary =
        absl::StrCat(record.value("identity", ""), " ", record.value("alias", ""), " -> ",
                     record.value("version", int64_t{-1}));
    if (record.value("outcome", "") == "OK") {
      if (record.value("identity", "") == "ops") continue;  // the test's own moves.
      ok_records.push_back(summary);
    } else {
      EXPECT_EQ(record.value("error_code", ""), "FAILED_PRECONDITION") << record.dump();
      failed_records.push_back(summary);
    }
  }
  std::vector<std::string> expected_ok, expected_failed;
  for (const Race& race : races_run_) {
    expected_ok.push_back(
        absl::StrCat(race.winner.identity, " ", race.winner.alias, " -> ", race.winner.version));
    expected_failed.push_back(
        absl::StrCat(race.loser.identity, " ", race.loser.alias, " -> ", race.loser.version));
  }
  EXPECT_EQ(ok_records, expected_ok);
  EXPECT_EQ(failed_records, expected_failed);
  std::cout << races_run_.size() << " races in " << absl::FormatDuration(absl::Now() - start)
            << "\n";
}

}  // namespace
}  // namespace ckpt
