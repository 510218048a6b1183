// A power cut at every durability call of garbage collection with pack compaction and of an
// audited SetAlias, directory entries included (issue #36).
//
// rocksdb_checkpoint_store_crash_consistency_test cuts power at failpoints named in the product.
// This test needs none: a child process (this binary again, see main()) opens a store the parent
// prepared, arms testing::ArmPowerCut(n) and runs one operation through an AuditedStore; it dies
// with SIGKILL just before its n-th durability call from then on (fsync, fdatasync, unlink,
// rename), or, for n = 0, right after the operation returned, having counted them. The parent
// runs n = 0 first, then every n = 1..N on a fresh copy of the prepared store, and after each
// cuts every file and every directory entry back to what the child synced
// (testing/sync_recording_fs.h: a name created, renamed or removed survives only once its
// directory was fsynced) and checks the reopened store:
//   - gc: version 1 was deleted (acknowledged) before, leaving its pack mostly dead, so GC frees
//     its own chunks and compacts the pack: copies the chunk versions 2 and 3 still share to a new
//     pack, syncs it and its directory, moves the locations and unlinks the old pack. At every cut:
//     versions 2 and 3 read back byte for byte and 1 stays deleted (GC loses no referenced chunk),
//     Verify finds nothing, the audit log holds what it held plus at most GC's record (OK once
//     acknowledged, else settled at the reopening as interrupted), and a GC after the cut leaves
//     exactly the pack bytes an uninterrupted
//     GC leaves: nothing orphaned, nothing torn.
//   - set_alias: moves alias best from 1 to 3. At every cut: the alias names 1 or 3, and 3 once
//     the store acknowledged the move; the audit record exists once BeginAudit returned, and
//     whenever the alias moved (no change unaudited); it is OK only if the alias moved; the
//     alias's history agrees with the alias; the next audited call takes the next sequence number.
//   - and once GC was acknowledged, the pack it removed stays removed: the space it reported
//     reclaimed is not back after the cut.
// The parent also checks that the cuts landed where the issue asks: inside the compaction (its
// new pack's sync, the sync of the pack directory, the old pack's unlink), after the alias batch,
// after the audit record's write.
//
// Seen failing against each break when written: PackWriter::Sync without its SyncDirectory
// (chunk_pack.cc: after the compaction's location batch the compacted pack's name was never
// synced, the cut removes it, and versions 2 and 3 lose their shared chunk: DATA_LOSS "pack file
// ... is missing"); BeginAudit's write unsynced ("BeginAudit returned, but its set_alias record is
// gone", and the same for garbage_collect); SetAlias's batch unsynced ("the store acknowledged the
// move, but the alias is back"). The acknowledged GC's removal fails against the store as it was
// written (PackDirectory::Remove unlinks without syncing the directory: the old pack comes back).

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/audited_store.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/instrumented_store.h"
#include "libs/store/testing/seeded_checkpoints.h"
#include "libs/store/testing/sync_recording_fs.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"

namespace ckpt {
namespace {

using ::google::protobuf::util::MessageDifferencer;

// The child's environment: the store, the operation, the durability call to die before (0: after
// the operation) and the file it appends its progress to. (CKPT_SYNC_LOG names the sync log.)
constexpr char kChildStoreEnv[] = "CKPT_POWER_CUT_CHILD_STORE";
constexpr char kChildOperationEnv[] = "CKPT_POWER_CUT_CHILD_OPERATION";
constexpr char kChildEventEnv[] = "CKPT_POWER_CUT_CHILD_EVENT";
constexpr char kChildProgressEnv[] = "CKPT_POWER_CUT_CHILD_PROGRESS";

constexpr char kModel[] = "crash";
constexpr char kAlias[] = "best";
constexpr char kIdentity[] = "local:power-cut-test";
constexpr int64_t kCommits = 3;
// gc: deleted before the cut operation. set_alias: moved from kAliasBefore to kAliasAfter.
constexpr int64_t kDeletedVersion = 1;
constexpr int64_t kAliasBefore = 1;
constexpr int64_t kAliasAfter = 3;

// A bound on the cuts of one operation, so that a loop in the product cannot make the test run
// for ever; both operations make fewer than 20 durability calls.
constexpr int64_t kMaxEvents = 40;

enum class Operation { kCollect, kSetAlias };

const char* OperationName(Operation operation) {
  return operation == Operation::kCollect ? "gc" : "set_alias";
}

AuditedStore::Actor Actor() { return {kIdentity, "local"}; }

// ---- The child.

// One line, one write(2) to a file opened with O_APPEND: the page cache keeps it through SIGKILL.
void WriteProgress(int fd, const std::string& text) {
  const std::string line = text + "\n";
  const ssize_t written = ::write(fd, line.data(), line.size());
  (void)written;
}

// Opens the prepared store, arms the power cut and runs the operation. The wrapped store writes
// "entered METHOD" to the progress file as the AuditedStore calls it, so the parent knows which
// steps were acknowledged before the cut: "entered GarbageCollect" or "entered SetAlias" means
// BeginAudit returned; "entered FinishAudit" means the change itself returned. Returns an exit
// code (2: the armed durability call never came).
int RunChild(const std::string& store_dir, const std::string& operation, int64_t event,
             const std::string& progress_path) {
  auto fail = [](absl::string_view what, const absl::Status& status) {
    std::cerr << "child: " << what << ": " << status << std::endl;
    return 1;
  };
  const int progress =
      ::open(progress_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (progress < 0) {
    return fail(progress_path, absl::InternalError(absl::StrCat("open: ", std::strerror(errno))));
  }
  StoreOptions options;
  options.db_path = store_dir;
  options.create_if_missing = false;
  options.rocksdb_file_system = testing::NewSyncRecordingFileSystem();
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) return fail("opening the store", store.status());
  InstrumentedStore instrumented(store->get());
  instrumented.set_hook([progress](absl::string_view method) {
    WriteProgress(progress, absl::StrCat("entered ", method));
  });
  AuditedStore audited(instrumented, Actor());

  testing::ArmPowerCut(event);
  absl::Status done;
  if (operation == "gc") {
    done = audited.GarbageCollect(false).status();
  } else if (operation == "set_alias") {
    done = audited.SetAlias(kModel, kAlias, kAliasAfter).status();
  } else {
    return fail("operation", absl::InvalidArgumentError(operation));
  }
  if (!done.ok()) return fail(operation, done);
  const int64_t events = testing::DurabilityEventsSinceArmed();
  WriteProgress(progress, absl::StrCat("acknowledged after ", events, " durability events"));
  if (event == 0) {
    std::cerr << "power cut after the acknowledged operation" << std::endl;
    ::kill(::getpid(), SIGKILL);
  }
  std::cerr << "child: the operation finished after " << events
            << " durability events, before the armed one" << std::endl;
  return 2;
}

// ---- The parent.

// What the child's progress file says was acknowledged before the cut.
struct Progress {
  bool began = false;         // BeginAudit returned: the call's audit record is acknowledged.
  bool changed = false;       // the change itself returned (acknowledged by the store).
  bool acknowledged = false;  // the whole audited call returned.
  int64_t events = -1;        // durability calls the whole call made (when acknowledged).
};

Progress ReadProgress(const std::string& path, Operation operation) {
  Progress progress;
  const std::string inner =
      operation == Operation::kCollect ? "entered GarbageCollect" : "entered SetAlias";
  for (absl::string_view line :
       absl::StrSplit(testing::ReadFileOrEmpty(path), '\n', absl::SkipEmpty())) {
    if (line == inner) progress.began = true;
    if (line == "entered FinishAudit") progress.changed = true;
    if (absl::ConsumePrefix(&line, "acknowledged after ")) {
      progress.acknowledged = true;
      const std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
      if (!absl::SimpleAtoi(words[0], &progress.events)) progress.events = -1;
    }
  }
  return progress;
}

absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> OpenAfterCut(const std::string& dir) {
  StoreOptions options;
  options.db_path = dir;
  options.create_if_missing = false;
  return RocksDbCheckpointStore::Open(options);
}

// Bytes of every pack file in the store.
int64_t PackBytes(const std::string& store_dir) {
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(store_dir + "/packs")) {
    if (absl::EndsWith(entry.path().filename().string(), ".pack")) {
      bytes += static_cast<int64_t>(entry.file_size());
    }
  }
  return bytes;
}

// The audit log after a cut in a call audited as `action`: every record from before, unchanged,
// and at most one more, the call's: OK, or, when its outcome was never written, settled when the
// store reopened (OK "applied ... reconciled at open", or FAILED ABORTED "... reconciled at
// open"), never left PENDING; OK once the call was acknowledged. Returns that record if it is
// there.
std::optional<v1::AuditRecord> CheckAuditLog(CheckpointStore& store,
                                             const std::vector<v1::AuditRecord>& before,
                                             absl::string_view action, const Progress& progress) {
  absl::StatusOr<std::vector<v1::AuditRecord>> records = store.ListAudit(AuditQuery());
  EXPECT_OK(records.status());
  if (!records.ok()) return std::nullopt;
  EXPECT_GE(records->size(), before.size()) << "acknowledged audit records were lost";
  for (size_t i = 0; i < before.size() && i < records->size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals((*records)[i], before[i]))
        << "audit record " << before[i].sequence() << " was\n"
        << before[i].DebugString() << "and is now\n"
        << (*records)[i].DebugString();
  }
  EXPECT_LE(records->size(), before.size() + 1);
  if (records->size() <= before.size()) {
    EXPECT_FALSE(progress.began) << "BeginAudit returned, but its " << action
                                 << " record is gone after the power cut";
    return std::nullopt;
  }
  const v1::AuditRecord& record = records->back();
  EXPECT_EQ(record.sequence(), before.back().sequence() + 1);
  EXPECT_EQ(record.action(), action);
  EXPECT_EQ(record.identity(), kIdentity);
  EXPECT_TRUE(record.outcome() == v1::AuditRecord::OK ||
              (record.outcome() == v1::AuditRecord::FAILED &&
               record.error_code() == static_cast<int>(absl::StatusCode::kAborted) &&
               absl::StrContains(record.error_message(), "reconciled at open")))
      << record.DebugString();
  if (progress.acknowledged) {
    EXPECT_EQ(record.outcome(), v1::AuditRecord::OK)
        << "the " << action << " call was acknowledged, but its audit record is "
        << v1::AuditRecord::Outcome_Name(record.outcome());
  }
  return record;
}

// The store every cut of `operation` starts from, made without recording (its files are there
// before the child, so the cut takes them as durable): versions 1..3 committed through an
// AuditedStore, then version 1 deleted (gc) or alias best set to 1 (set_alias). Returns the audit
// log as it then stands.
std::vector<v1::AuditRecord> Prepare(const std::string& store_dir, Operation operation) {
  StoreOptions options;
  options.db_path = store_dir;
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  EXPECT_OK(store.status());
  if (!store.ok()) return {};
  AuditedStore audited(**store, Actor());
  for (int64_t seed = 1; seed <= kCommits; ++seed) {
    absl::StatusOr<int64_t> version = testing::CommitSeeded(audited, kModel, seed);
    EXPECT_OK(version.status());
    EXPECT_EQ(version.value_or(0), seed);
  }
  if (operation == Operation::kCollect) {
    EXPECT_OK(audited.DeleteVersion(kModel, kDeletedVersion, false).status());
  } else {
    EXPECT_OK(audited.SetAlias(kModel, kAlias, kAliasBefore).status());
  }
  absl::StatusOr<std::vector<v1::AuditRecord>> records = (*store)->ListAudit(AuditQuery());
  EXPECT_OK(records.status());
  return records.value_or(std::vector<v1::AuditRecord>());
}

class PowerCutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // What RunCut left: the store copy, cut; what the child had acknowledged; what the cut did; the
  // durability calls the child counted (the sync log's "event" lines).
  struct Cut {
    std::string store_dir;
    Progress progress;
    testing::PowerCut power_cut;
    std::string events_log;
  };

  // Runs the child of `operation` on a copy of the prepared store, to die before durability call
  // `event` (0: after the operation returned), then cuts the copy's files to what it synced.
  Cut RunCut(Operation operation, int64_t event) {
    Cut cut;
    const std::string dir = absl::StrCat(dir_, "/cut", event);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    cut.store_dir = dir + "/store";
    std::filesystem::copy(dir_ + "/prepared", cut.store_dir,
                          std::filesystem::copy_options::recursive);
    const std::string log = dir + "/sync.log";
    const testing::ChildResult child = testing::RunThisBinaryAsChild(
        {absl::StrCat(kChildStoreEnv, "=", cut.store_dir),
         absl::StrCat(kChildOperationEnv, "=", OperationName(operation)),
         absl::StrCat(kChildEventEnv, "=", event),
         absl::StrCat(kChildProgressEnv, "=", dir, "/progress"),
         absl::StrCat("CKPT_SYNC_LOG=", log)},
        dir, absl::Seconds(60));
    // The armed cut, not something else, must have ended the child.
    EXPECT_TRUE(WIFSIGNALED(child.wait_status) && WTERMSIG(child.wait_status) == SIGKILL)
        << "wait status " << child.wait_status << "; the child's stderr:\n"
        << child.stderr_text;
    EXPECT_TRUE(absl::StrContains(
        child.stderr_text, event == 0
                               ? std::string("power cut after the acknowledged operation")
                               : absl::StrCat("power cut before durability event ", event, ":")))
        << child.stderr_text;
    cut.progress = ReadProgress(dir + "/progress", operation);
    for (absl::string_view line :
         absl::StrSplit(testing::ReadFileOrEmpty(log), '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, "event\t")) absl::StrAppend(&cut.events_log, line, "\n");
    }
    absl::StatusOr<testing::PowerCut> power_cut = testing::CutToSynced(log);
    EXPECT_OK(power_cut.status());
    cut.power_cut = power_cut.value_or(testing::PowerCut());
    EXPECT_EQ(cut.power_cut.unrestorable, 0) << "the cut could not bring back a removed file";
    EXPECT_GT(cut.power_cut.directory_syncs, 0) << "no directory sync recorded: fsync was not "
                                                   "interposed";
    std::cout << OperationName(operation) << " cut " << event << ": " << cut.power_cut.files_tracked
              << " files tracked, " << cut.power_cut.files_removed << " removed, "
              << cut.power_cut.files_truncated << " truncated, " << cut.power_cut.names_restored
              << " names restored, " << cut.power_cut.bytes_dropped << " bytes dropped; "
              << (cut.progress.acknowledged ? "acknowledged"
                  : cut.progress.changed    ? "changed"
                  : cut.progress.began      ? "audit begun"
                                            : "nothing acknowledged")
              << std::endl;
    return cut;
  }

  std::string dir_;
};

// After a cut in GC: see the file comment. `reference_pack_bytes`: what an uninterrupted GC
// leaves.
void CheckCollected(const std::string& store_dir, const Progress& progress,
                    const std::vector<v1::AuditRecord>& before, int64_t reference_pack_bytes) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store, OpenAfterCut(store_dir));
  ASSERT_OK_AND_ASSIGN(const std::set<int64_t> listed, testing::ListedVersions(*store, kModel));
  EXPECT_EQ(listed, (std::set<int64_t>{2, 3}));
  for (int64_t version : {2, 3}) EXPECT_OK(testing::CheckSeeded(*store, kModel, version, version));
  EXPECT_OK(testing::VerifyWholeStore(*store));
  CheckAuditLog(*store, before, kAuditGarbageCollect, progress);

  // GC again: whatever the cut left (an orphaned copy, the old pack brought back) is reclaimed,
  // and the live chunks stay readable.
  ASSERT_OK(store->GarbageCollect(false).status());
  for (int64_t version : {2, 3}) {
    EXPECT_OK(testing::CheckSeeded(*store, kModel, version, version)) << "after GC";
  }
  EXPECT_OK(testing::VerifyWholeStore(*store)) << "after GC";
  EXPECT_EQ(PackBytes(store_dir), reference_pack_bytes)
      << "a GC after the cut leaves other pack bytes than an uninterrupted GC";
}

TEST_F(PowerCutTest, GarbageCollectionWithPackCompactionLosesNoReferencedChunkAtAnyCut) {
  const std::vector<v1::AuditRecord> before = Prepare(dir_ + "/prepared", Operation::kCollect);
  ASSERT_FALSE(before.empty());
  // The reference: GC uninterrupted, on a copy.
  int64_t reference_pack_bytes = 0;
  {
    std::filesystem::copy(dir_ + "/prepared", dir_ + "/reference",
                          std::filesystem::copy_options::recursive);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                         OpenAfterCut(dir_ + "/reference"));
    const int64_t packs_before = PackBytes(dir_ + "/reference");
    ASSERT_OK(store->GarbageCollect(false).status());
    reference_pack_bytes = PackBytes(dir_ + "/reference");
    // Version 1's own chunks are freed and its pack compacted to the chunk 2 and 3 share.
    ASSERT_LT(reference_pack_bytes, packs_before - testing::kWeightElements * 4);
  }

  // After the acknowledged GC first: it counts the durability calls.
  Cut acknowledged = RunCut(Operation::kCollect, 0);
  ASSERT_TRUE(acknowledged.progress.acknowledged);
  const int64_t events = acknowledged.progress.events;
  ASSERT_GT(events, 0);
  ASSERT_LE(events, kMaxEvents) << acknowledged.events_log;
  // The cuts land inside the compaction: its new pack's sync, the pack directory's sync, and the
  // old pack's unlink are among the calls.
  EXPECT_TRUE(absl::StrContains(acknowledged.events_log, "fdatasync\t") &&
              absl::StrContains(acknowledged.events_log, ".pack\n"))
      << acknowledged.events_log;
  EXPECT_TRUE(absl::StrContains(acknowledged.events_log, "/packs\n")) << acknowledged.events_log;
  EXPECT_TRUE(absl::StrContains(acknowledged.events_log, "unlink\t")) << acknowledged.events_log;
  {
    SCOPED_TRACE("power cut after the acknowledged GC");
    CheckCollected(acknowledged.store_dir, acknowledged.progress, before, reference_pack_bytes);
  }
  std::filesystem::remove_all(dir_ + "/cut0");

  for (int64_t event = 1; event <= events; ++event) {
    SCOPED_TRACE(absl::StrCat("power cut before durability event ", event));
    Cut cut = RunCut(Operation::kCollect, event);
    CheckCollected(cut.store_dir, cut.progress, before, reference_pack_bytes);
    std::filesystem::remove_all(absl::StrCat(dir_, "/cut", event));
  }
}

// GarbageCollect returned, reporting the dead pack's bytes reclaimed: after a power cut they stay
// reclaimed (the unlink is durable: its directory was synced), before any later GC runs.
TEST_F(PowerCutTest, SpaceAnAcknowledgedGarbageCollectionReclaimedStaysReclaimed) {
  ASSERT_FALSE(Prepare(dir_ + "/prepared", Operation::kCollect).empty());
  int64_t reference_pack_bytes = 0;
  {
    std::filesystem::copy(dir_ + "/prepared", dir_ + "/reference",
                          std::filesystem::copy_options::recursive);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store,
                         OpenAfterCut(dir_ + "/reference"));
    ASSERT_OK(store->GarbageCollect(false).status());
    reference_pack_bytes = PackBytes(dir_ + "/reference");
  }
  Cut acknowledged = RunCut(Operation::kCollect, 0);
  ASSERT_TRUE(acknowledged.progress.acknowledged);
  EXPECT_EQ(acknowledged.power_cut.names_restored, 0)
      << "the power cut brought back files the acknowledged GC had removed";
  EXPECT_EQ(PackBytes(acknowledged.store_dir), reference_pack_bytes)
      << "pack bytes the acknowledged GC reclaimed are back after the power cut";
}

// After a cut in SetAlias: see the file comment.
void CheckAliasMoved(const std::string& store_dir, const Progress& progress,
                     const std::vector<v1::AuditRecord>& before) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RocksDbCheckpointStore> store, OpenAfterCut(store_dir));
  for (int64_t version = 1; version <= kCommits; ++version) {
    EXPECT_OK(testing::CheckSeeded(*store, kModel, version, version));
  }
  ASSERT_OK_AND_ASSIGN(const v1::VersionRef alias_ref,
                       ParseVersionRef(absl::StrCat(kModel, "@", kAlias)));
  ASSERT_OK_AND_ASSIGN(const v1::Manifest manifest, store->GetManifest(alias_ref));
  const int64_t alias = manifest.version();
  EXPECT_TRUE(alias == kAliasBefore || alias == kAliasAfter) << alias;
  if (progress.changed) {
    EXPECT_EQ(alias, kAliasAfter) << "the store acknowledged the move, but the alias is back";
  }

  const std::optional<v1::AuditRecord> record =
      CheckAuditLog(*store, before, kAuditSetAlias, progress);
  if (alias == kAliasAfter) {
    EXPECT_TRUE(record.has_value()) << "the alias moved, but no audit record says so";
  }
  if (record.has_value()) {
    EXPECT_EQ(record->model(), kModel);
    EXPECT_EQ(record->alias(), kAlias);
    EXPECT_EQ(record->version(), kAliasAfter);
    if (record->outcome() == v1::AuditRecord::OK) {
      EXPECT_EQ(alias, kAliasAfter) << "the audit log says the alias moved, but it did not";
      // Finished by the call, or settled at the reopening from the alias's history event.
      if (!absl::StrContains(record->detail(), "reconciled at open")) {
        EXPECT_EQ(record->detail(),
                  absl::StrCat("alias ", kAlias, ": ", kAliasBefore, " -> ", kAliasAfter));
      }
    } else {
      EXPECT_EQ(alias, kAliasBefore) << "the audit log says not applied, but the alias moved";
    }
  }

  // The alias's history ends where the alias points.
  HistoryQuery query;
  query.model = kModel;
  query.alias = kAlias;
  ASSERT_OK_AND_ASSIGN(const std::vector<v1::RegistryEvent> history, store->ListHistory(query));
  ASSERT_FALSE(history.empty());
  EXPECT_EQ(history.back().kind(), v1::RegistryEvent::ALIAS_SET);
  EXPECT_EQ(history.back().version(), alias);
  EXPECT_EQ(history.size(), alias == kAliasAfter ? 2u : 1u);

  // The next audited call takes the next sequence number: none handed out before the cut is
  // handed out again.
  AuditedStore audited(*store, Actor());
  ASSERT_OK(audited.SetAlias(kModel, kAlias, 2).status());
  ASSERT_OK_AND_ASSIGN(const std::vector<v1::AuditRecord> after, store->ListAudit(AuditQuery()));
  ASSERT_GE(after.size(), 2u);
  EXPECT_EQ(after.back().sequence(), after[after.size() - 2].sequence() + 1);
  EXPECT_EQ(after.back().outcome(), v1::AuditRecord::OK);
  EXPECT_OK(testing::VerifyWholeStore(*store));
}

TEST_F(PowerCutTest, AuditedSetAliasIsAllOrNothingAndAuditedAtAnyCut) {
  const std::vector<v1::AuditRecord> before = Prepare(dir_ + "/prepared", Operation::kSetAlias);
  ASSERT_FALSE(before.empty());

  Cut acknowledged = RunCut(Operation::kSetAlias, 0);
  ASSERT_TRUE(acknowledged.progress.acknowledged);
  const int64_t events = acknowledged.progress.events;
  // At least BeginAudit's record, the alias batch and FinishAudit's record, each a synced write.
  EXPECT_GE(events, 3) << acknowledged.events_log;
  ASSERT_LE(events, kMaxEvents) << acknowledged.events_log;
  {
    SCOPED_TRACE("power cut after the acknowledged SetAlias");
    CheckAliasMoved(acknowledged.store_dir, acknowledged.progress, before);
  }
  std::filesystem::remove_all(dir_ + "/cut0");

  bool cut_after_audit_record = false, cut_after_alias_batch = false;
  for (int64_t event = 1; event <= events; ++event) {
    SCOPED_TRACE(absl::StrCat("power cut before durability event ", event));
    Cut cut = RunCut(Operation::kSetAlias, event);
    cut_after_audit_record |= cut.progress.began && !cut.progress.changed;
    cut_after_alias_batch |= cut.progress.changed && !cut.progress.acknowledged;
    CheckAliasMoved(cut.store_dir, cut.progress, before);
    std::filesystem::remove_all(absl::StrCat(dir_, "/cut", event));
  }
  // Not vacuous: some cuts came after BeginAudit returned and before the alias batch returned,
  // and some after the batch returned and before FinishAudit did.
  EXPECT_TRUE(cut_after_audit_record);
  EXPECT_TRUE(cut_after_alias_batch);
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  if (const char* store_dir = std::getenv(ckpt::kChildStoreEnv)) {
    const char* operation = std::getenv(ckpt::kChildOperationEnv);
    const char* event = std::getenv(ckpt::kChildEventEnv);
    const char* progress = std::getenv(ckpt::kChildProgressEnv);
    int64_t armed = -1;
    if (operation == nullptr || event == nullptr || progress == nullptr ||
        !absl::SimpleAtoi(event, &armed) || armed < 0) {
      std::cerr << "child: " << ckpt::kChildOperationEnv << ", " << ckpt::kChildEventEnv << " and "
                << ckpt::kChildProgressEnv << " must be set" << std::endl;
      return 1;
    }
    return ckpt::RunChild(store_dir, operation, armed, progress);
  }
  // The parent must never record nor arm a cut itself.
  ::unsetenv("CKPT_SYNC_LOG");
  ::unsetenv("CKPT_FAILPOINT");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
