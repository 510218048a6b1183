#ifndef CKPT_LIBS_STORE_TESTING_SYNC_RECORDING_FS_H_
#define CKPT_LIBS_STORE_TESTING_SYNC_RECORDING_FS_H_

// A simulated power failure for crash tests (testonly): the process under test records what it
// made durable, and after it died the test cuts every file back to that.
//
// A process killed with SIGKILL loses nothing the kernel already has: its page cache survives, so
// a commit that forgot to sync, or synced in the wrong order, still looks whole afterwards. A
// power failure keeps only what was synced. In the process under test:
//   - RocksDB's files go through NewSyncRecordingFileSystem() (StoreOptions::rocksdb_file_system),
//     which records each file it creates, each successful Sync/Fsync (with the bytes appended
//     before it), renames and deletions;
//   - pack files record the same from chunk_pack.cc in failpoint builds (internal/failpoint.h);
// all as lines of the log that $CKPT_SYNC_LOG names. After the process died, CutToSynced(log)
// truncates every file it created to its last synced length and deletes the ones never synced.
//
// What it does not model: directory entries. A created, renamed or removed name is taken as
// durable at once (the store syncs its directories, but this does not check that it does), and
// synced data is taken as intact (no torn sectors). Files RocksDB opens with NewRandomRWFile or
// LinkFile are not tracked (the store's database uses neither).
//
// Example:
//   // child, with CKPT_SYNC_LOG=/tmp/x/sync.log in its environment:
//   options.rocksdb_file_system = testing::NewSyncRecordingFileSystem();
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

// What CutToSynced did.
struct PowerCut {
  int files_tracked = 0;    // created by the process and still there.
  int files_removed = 0;    // never synced: gone.
  int files_truncated = 0;  // shortened to their last synced length.
  int64_t bytes_dropped = 0;
};

// Applies the log at `log_path` (see above) to the files it names. INVALID_ARGUMENT for a line it
// cannot parse; an errno status when a file cannot be truncated or removed.
absl::StatusOr<PowerCut> CutToSynced(const std::string& log_path);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_STORE_TESTING_SYNC_RECORDING_FS_H_
