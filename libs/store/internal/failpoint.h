#ifndef CKPT_LIBS_STORE_INTERNAL_FAILPOINT_H_
#define CKPT_LIBS_STORE_INTERNAL_FAILPOINT_H_

// Crash points and a record of what was made durable, for crash-consistency tests
// (rocksdb_checkpoint_store_crash_consistency_test.cc). Compiled into test builds only: the macros
// expand to nothing unless the translation unit is built with CKPT_FAILPOINTS defined, which only
// the testonly `*_failpoints` targets in libs/store/BUILD do, so the production store holds no
// failpoint code at all.
//
// In a failpoint build:
//   - CKPT_FAILPOINT("commit.after_pack_sync") kills the process at once with SIGKILL (no
//     destructors, no flush, no atexit) when the environment variable CKPT_FAILPOINT names it,
//     as `NAME` (its first hit) or `NAME:N` (its N-th hit in this process). Before dying it writes
//     "failpoint NAME fired" to stderr with one write(2), so the parent can tell which point
//     killed it.
//   - CKPT_RECORD_FILE_CREATED / _SYNCED / _REMOVED append a line to the file the environment
//     variable CKPT_SYNC_LOG names (nothing when unset): the file created, durably synced up to a
//     length, or removed. A test reads the log after the process died and cuts every file back to
//     what was synced, as a power failure would (testing/sync_recording_fs.h).
//
// A record is appended after the operation it reports succeeded, so a crash between the two makes
// the test cut more than a power failure could, never less. Each record is one write(2) to a file
// opened with O_APPEND: the page cache keeps it when the process is killed.
//
// Example:
//   RETURN_IF_ERROR(pack_->Sync());
//   CKPT_FAILPOINT("commit.after_pack_sync");

#include <cstdint>
#include <string>

namespace ckpt::failpoint {

// Declarations only; defined by the testonly :failpoint target.

// Dies with SIGKILL if CKPT_FAILPOINT arms `name` and this is the hit it names.
void Hit(const char* name);

// Records in $CKPT_SYNC_LOG (when set) that `path` was created empty, that its first `length`
// bytes are durable, that it was renamed to `to`, or that it was removed.
void RecordCreated(const std::string& path);
void RecordSynced(const std::string& path, int64_t length);
void RecordRenamed(const std::string& from, const std::string& to);
void RecordRemoved(const std::string& path);

}  // namespace ckpt::failpoint

#if defined(CKPT_FAILPOINTS)
#define CKPT_FAILPOINT(name) ::ckpt::failpoint::Hit(name)
#define CKPT_RECORD_FILE_CREATED(path) ::ckpt::failpoint::RecordCreated(path)
#define CKPT_RECORD_FILE_SYNCED(path, length) ::ckpt::failpoint::RecordSynced(path, length)
#define CKPT_RECORD_FILE_REMOVED(path) ::ckpt::failpoint::RecordRemoved(path)
#else
#define CKPT_FAILPOINT(name) \
  do {                       \
  } while (false)
#define CKPT_RECORD_FILE_CREATED(path) \
  do {                                 \
  } while (false)
#define CKPT_RECORD_FILE_SYNCED(path, length) \
  do {                                        \
  } while (false)
#define CKPT_RECORD_FILE_REMOVED(path) \
  do {                                 \
  } while (false)
#endif

#endif  // CKPT_LIBS_STORE_INTERNAL_FAILPOINT_H_
