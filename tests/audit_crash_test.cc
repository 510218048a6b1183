// The audit log survives SIGKILL: a sequence of commits, alias moves and deletes by two identities
// reads back exactly from a store whose writer was killed -- including the call it was killed in,
// recorded PENDING and reconciled as not applied when the store reopens -- and the real
// checkpoint_store server's records survive a
// SIGKILL of the server.
//
// Two identities come from AuditedStore actors in a forked writer (the store service names every
// caller "anonymous" until callers have named identities); the served case runs the real binary.

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/status/status_matchers.h"
#include "libs/store/audited_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::StartsWith;

const AuditedStore::Actor kAlice{"alice", "ipv4:10.0.0.1:40000"};
const AuditedStore::Actor kBob{"bob", "ipv4:10.0.0.2:40001"};

// A header of one uint8 tensor "w" of `bytes` bytes.
v1::Manifest Header(int64_t bytes) {
  v1::Manifest header;
  v1::TensorMeta* meta = header.add_tensors();
  meta->set_key("w");
  meta->set_dtype(v1::DTYPE_UINT8);
  meta->add_shape(bytes);
  meta->set_byte_length(bytes);
  return header;
}

// Commits `bytes` as a new version of `model` through `store` (the path CommitCheckpoint takes,
// without LibTorch: the writer is a forked child).
absl::StatusOr<CommitResult> Commit(CheckpointStore& store, const std::string& model,
                                    const std::string& bytes, std::vector<std::string> aliases) {
  CommitOptions options;
  options.aliases = std::move(aliases);
  absl::StatusOr<std::unique_ptr<UploadSession>> session =
      store.BeginUpload(model, Header(static_cast<int64_t>(bytes.size())), options);
  if (!session.ok()) return session.status();
  if (absl::Status added = (*session)->AddTensorData(0, 0, bytes); !added.ok()) return added;
  return (*session)->Commit();
}

// The forked writer: the sequence by alice and bob, then a call held forever after its audit
// record was written. Reports 'H' (holding) or 'F' (a step failed) on `report`; never returns.
[[noreturn]] void RunWriter(const std::string& db_path, int report) {
  auto fail = [&](absl::string_view step, const absl::Status& status) {
    std::cerr << "writer: " << step << ": " << status << "\n";
    const char failed = 'F';
    (void)!write(report, &failed, 1);
    _exit(1);
  };
  StoreOptions options;
  options.db_path = db_path;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) fail("open", store.status());
  InstrumentedStore held(store->get());
  held.set_hook([&](absl::string_view method) {
    if (method != "SetAlias") return;
    // Audit record 7 is on disk, the change it announces not made: the parent kills us here.
    const char holding = 'H';
    (void)!write(report, &holding, 1);
    for (;;) pause();
  });
  AuditedStore alice(**store, kAlice);
  AuditedStore bob(**store, kBob);
  if (auto r = Commit(alice, "m", "abcd", {"best"}); !r.ok()) fail("alice commits", r.status());
  if (auto r = Commit(bob, "m", "efghijkl", {}); !r.ok()) fail("bob commits", r.status());
  if (auto r = bob.SetAlias("m", "best", 2); !r.ok()) fail("bob moves best", r.status());
  if (auto r = alice.SetAlias("m", "best", 7); !absl::IsNotFound(r.status())) {
    fail("alice moves best to a missing version", r.status());
  }
  if (auto r = alice.DeleteVersion("m", 1, false); !r.ok()) fail("alice deletes", r.status());
  if (auto r = bob.DeleteAlias("m", "best"); !r.ok()) fail("bob deletes best", r);
  AuditedStore bob_held(held, kBob);
  (void)bob_held.SetAlias("m", "prod", 2);
  fail("the held call", absl::InternalError("returned"));
  _exit(1);  // not reached
}

v1::AuditRecord Expected(int64_t sequence, const AuditedStore::Actor& actor,
                         absl::string_view action, int64_t version, absl::string_view alias,
                         v1::AuditRecord::Outcome outcome, absl::string_view detail) {
  v1::AuditRecord record;
  record.set_sequence(sequence);
  record.set_identity(actor.identity);
  record.set_peer(actor.peer);
  record.set_action(std::string(action));
  record.set_model("m");
  record.set_version(version);
  record.set_alias(std::string(alias));
  record.set_outcome(outcome);
  record.set_detail(std::string(detail));
  return record;
}

TEST(AuditCrashTest, TwoIdentitiesChangesReadBackExactlyAfterTheWriterIsKilled) {
  const std::string db_path = testing::TestCaseDir();
  const absl::Time started = absl::Now();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    close(pipe_fds[0]);
    RunWriter(db_path, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  pollfd ready{pipe_fds[0], POLLIN, 0};
  char report = 0;
  // The writer's report, or its end; a minute covers a slow machine.
  if (poll(&ready, 1, 60'000) == 1) (void)!read(pipe_fds[0], &report, 1);
  close(pipe_fds[0]);
  kill(writer, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  ASSERT_EQ(report, 'H') << "the writer did not reach the held call (see its stderr above)";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  StoreOptions options;
  options.db_path = db_path;
  options.create_if_missing = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                       RocksDbCheckpointStore::Open(options));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store->ListAudit({}));

  std::vector<v1::AuditRecord> expected = {
      Expected(1, kAlice, "commit", 1, "best", v1::AuditRecord::OK,
               "committed m@1: 4 bytes, 4 new; aliases best"),
      Expected(2, kBob, "commit", 2, "", v1::AuditRecord::OK, "committed m@2: 8 bytes, 8 new"),
      Expected(3, kBob, "set_alias", 2, "best", v1::AuditRecord::OK, "alias best: 1 -> 2"),
      Expected(4, kAlice, "set_alias", 7, "best", v1::AuditRecord::FAILED, "alias best -> 7"),
      Expected(5, kAlice, "delete_version", 1, "", v1::AuditRecord::OK,
               "deleted m@1; 4 bytes no longer referenced"),
      Expected(6, kBob, "delete_alias", 0, "best", v1::AuditRecord::OK, "alias best deleted"),
      // Killed during the call, which never reached the store: reconciled at the reopening.
      Expected(7, kBob, "set_alias", 2, "prod", v1::AuditRecord::FAILED, "alias prod -> 2"),
  };
  expected[6].set_error_code(static_cast<int>(absl::StatusCode::kAborted));
  expected[6].set_error_message(
      "not applied: the store stopped, or could not record the outcome, before the call "
      "finished; reconciled at open, and the registry history holds no change of it");
  expected[3].set_error_code(static_cast<int>(absl::StatusCode::kNotFound));
  expected[3].set_error_message("m@7 not found");
  ASSERT_EQ(records.size(), expected.size());
  int64_t previous_micros = absl::ToUnixMicros(started);
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE(records[i].ShortDebugString());
    EXPECT_GE(records[i].unix_micros(), previous_micros);
    previous_micros = records[i].unix_micros();
    v1::AuditRecord untimed = records[i];
    untimed.clear_unix_micros();
    std::string differences;
    MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&differences);
    EXPECT_TRUE(differencer.Compare(expected[i], untimed)) << differences;
  }
  EXPECT_LE(previous_micros, absl::ToUnixMicros(absl::Now()));

  // The store agrees with the log: the held call never reached it.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store->ListVersions("m"));
  ASSERT_EQ(versions.size(), 1u);
  EXPECT_EQ(versions[0].version(), 2);
  EXPECT_TRUE(versions[0].aliases().empty());
  ASSERT_OK_AND_ASSIGN(v1::Manifest second, store->GetManifest(MakeVersionRef("m", 2)));
  EXPECT_EQ(second.metadata().producer(), "bob");
}

// The real server, killed with SIGKILL after its calls, restarted on the same database.
class Server {
 public:
  explicit Server(std::string db) : db_(std::move(db)) {}

  std::unique_ptr<RemoteCheckpointStore> Start() {
    const std::string dir = absl::StrCat(db_, ".run", ++starts_);
    EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
    process_ = std::make_unique<testing::ChildProcess>(
        testing::RunfilesPath("services/checkpoint_store/checkpoint_store"), dir);
    const std::string port_file = dir + "/port";
    EXPECT_TRUE(
        process_->Start({"--store_dir=" + db_, "--listen=127.0.0.1:0", "--port_file=" + port_file}));
    const int port = process_->WaitForPort(port_file, absl::Seconds(60));
    EXPECT_GT(port, 0) << process_->stderr_text();
    RemoteStoreOptions options;
    options.address = absl::StrCat("127.0.0.1:", port);
    options.deadline = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> remote =
        RemoteCheckpointStore::Connect(options);
    EXPECT_OK(remote.status());
    return remote.ok() ? *std::move(remote) : nullptr;
  }

  void Kill() {
    process_->Signal(SIGKILL);
    std::optional<int> status = process_->WaitForExit(absl::Seconds(30));
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  }

 private:
  const std::string db_;
  int starts_ = 0;
  std::unique_ptr<testing::ChildProcess> process_;
};

// "ACTION model@version OUTCOME code" for each record.
std::vector<std::string> Summaries(const std::vector<v1::AuditRecord>& records) {
  std::vector<std::string> lines;
  for (const v1::AuditRecord& record : records) {
    lines.push_back(absl::StrCat(
        record.sequence(), " ", record.action(), " ", record.model(), "@", record.version(), " ",
        v1::AuditRecord::Outcome_Name(record.outcome()), " ", record.error_code()));
  }
  return lines;
}

TEST(AuditCrashTest, TheServersRecordsSurviveASigkillOfTheServer) {
  Server server(testing::TestCaseDir());
  std::vector<v1::AuditRecord> before;
  {
    std::unique_ptr<RemoteCheckpointStore> remote = server.Start();
    ASSERT_NE(remote, nullptr);
    ASSERT_OK(Commit(*remote, "m", "abcd", {"best"}).status());
    ASSERT_OK(Commit(*remote, "m", "efgh", {}).status());
    ASSERT_OK(remote->SetAlias("m", "best", 2).status());
    EXPECT_THAT(remote->SetAlias("m", "prod", 9), StatusIs(absl::StatusCode::kNotFound));
    ASSERT_OK(remote->DeleteAlias("m", "best"));
    ASSERT_OK(remote->DeleteVersion("m", 1, /*force=*/false).status());
    ASSERT_OK_AND_ASSIGN(before, remote->ListAudit({}));
    server.Kill();
  }
  std::unique_ptr<RemoteCheckpointStore> remote = server.Start();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> after, remote->ListAudit({}));
  EXPECT_THAT(Summaries(after),
              ::testing::ElementsAre("1 commit m@1 OK 0", "2 commit m@2 OK 0",
                                     "3 set_alias m@2 OK 0", "4 set_alias m@9 FAILED 5",
                                     "5 delete_alias m@0 OK 0", "6 delete_version m@1 OK 0"));
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(before[i], after[i])) << i;
    EXPECT_EQ(after[i].identity(), "anonymous");
    EXPECT_THAT(after[i].peer(), StartsWith("ipv4:127.0.0.1:"));
  }
  // Numbering continues after the restart.
  ASSERT_OK(remote->SetAlias("m", "best", 2).status());
  ASSERT_OK_AND_ASSIGN(after, remote->ListAudit({}));
  ASSERT_EQ(after.size(), 7u);
  EXPECT_EQ(after.back().sequence(), 7);
  EXPECT_EQ(after.back().detail(), "alias best: (new) -> 2");
}

}  // namespace
}  // namespace ckpt
