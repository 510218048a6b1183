#ifndef CKPT_LIBS_STORE_TESTING_SYNC_RECORDING_FS_H_
#define CKPT_LIBS_STORE_TESTING_SYNC_RECORDING_FS_H_

// A simulated power failure for crash tests (testonly): the process under test records what it
// made durable, and after it died the test cuts every file and directory entry back to that.
//
// A process killed with SIGKILL loses nothing the kernel already has: its page cache survives, so
// a commit that forgot to sync, or synced in the wrong order, still looks whole afterwards. A
// power failure keeps only what was synced: a file's bytes once the file was fsynced, and a name
// created, renamed or removed in a directory once that directory was fsynced. In the process
// under test, as lines of the log that $CKPT_SYNC_LOG names:
//   - RocksDB's files go through NewSyncRecordingFileSystem() (StoreOptions::rocksdb_file_system),
//     which records each file it creates and each successful Sync/Fsync with the bytes appended
//     before it;
//   - pack files record the same from chunk_pack.cc in failpoint builds (internal/failpoint.h);
//   - linking this library interposes fsync(2), fdatasync(2), unlink(2) and rename(2) for the
//     whole process (RocksDB's and the store's calls alike): an fsync of a directory is recorded,
//     a rename is recorded, and a file about to be unlinked or replaced by a rename is first
//     hard-linked into a graveyard beside the log, so that a removal the power failure undoes can
//     be undone here too. Without $CKPT_SYNC_LOG they only pass the call to the kernel.
// After the process died, CutToSynced(log) gives every name it touched the binding its directory
// last synced (a removal or rename not yet synced is undone, a file whose name was never synced
// is gone) and cuts every file to the bytes last synced (a name synced over never-synced data
// leaves an empty file).
//
// Crash points without failpoints in the product: ArmPowerCut(n) kills the process with SIGKILL
// just before its n-th durability call (fsync, fdatasync, unlink, rename) from then on, so a test
// can run an operation once to count them and then cut power before each in turn.
//
// What it does not model: directories themselves (a directory created by the process is taken as
// durable), torn sectors (synced data is intact), data that reached the disk without a sync (the
// cut keeps none of it), and links (LinkFile) or NewRandomRWFile (the store uses neither). Files
// that were there before the process are taken as durable as they were.
//
// Example:
//   // child, with CKPT_SYNC_LOG=/tmp/x/sync.log in its environment:
//   options.rocksdb_file_system = testing::NewSyncRecordingFileSystem();
//   testing::ArmPowerCut(3);  // dies before its third durability call from here
//   // parent, after the child died:
//   ASSERT_OK_AND_ASSIGN(testing::PowerCut cut, testing::CutToSynced("/tmp/x/sync.log"));

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rocksdb/file_system.h"

namespace ckpt::testing {

// The default file system, recording into $CKPT_SYNC_LOG (through failpoint::Record*; nothing is
// recorded when the variable is unset).
std::shared_ptr<rocksdb::FileSystem> NewSyncRecordingFileSystem();

// Counts this process's durability calls (fsync, fdatasync, unlink, rename) from now on, each
// recorded in $CKPT_SYNC_LOG as an "event" line naming the call and its file; when `event` >= 1,
// writes "power cut before durability event N: CALL PATH" to stderr and dies with SIGKILL just
// before the `event`-th. 0 only counts. Needs $CKPT_SYNC_LOG.
void ArmPowerCut(int64_t event);

// The durability calls counted since ArmPowerCut.
int64_t DurabilityEventsSinceArmed();

// What CutToSynced did.
struct PowerCut {
  int files_tracked = 0;      // names the process touched that the cut left in place.
  int files_removed = 0;      // names whose creation (or rename here) was never synced: gone.
  int files_truncated = 0;    // shortened to their last synced length (0 if never synced).
  int names_restored = 0;     // removed or renamed away without a directory sync: back.
  int unrestorable = 0;       // names the cut should bring back, but no copy was kept: absent.
  int64_t bytes_dropped = 0;  // bytes the cut took out of files that stayed or went.
  int directory_syncs = 0;    // directory fsyncs the log records.
};

// Applies the log at `log_path` (see above) to the files it names. INVALID_ARGUMENT for a line it
// cannot parse; an errno status when a file cannot be truncated, linked or removed.
absl::StatusOr<PowerCut> CutToSynced(const std::string& log_path);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_STORE_TESTING_SYNC_RECORDING_FS_H_
