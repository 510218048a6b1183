#include "libs/store/testing/sync_recording_fs.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/io/atomic_file.h"
#include "libs/status/status_macros.h"
#include "libs/store/internal/failpoint.h"

namespace ckpt::testing {
namespace {

// ---- In the process under test: the log, the graveyard and the armed power cut.

// The kernel's calls, which the interposed functions at the end of this file forward to (fsync()
// here would be the interposed one again).
int RealSync(int fd, bool data_only) {
  return static_cast<int>(::syscall(data_only ? SYS_fdatasync : SYS_fsync, fd));
}
int RealUnlink(const char* path) {
  return static_cast<int>(::syscall(SYS_unlinkat, AT_FDCWD, path, 0));
}
int RealRename(const char* from, const char* to) {
#ifdef SYS_renameat
  return static_cast<int>(::syscall(SYS_renameat, AT_FDCWD, from, AT_FDCWD, to));
#else
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 0));
#endif
}

// Raw write(2) to stderr: nothing buffered that the SIGKILL right after could lose.
void WriteToStderr(const std::string& message) {
  const ssize_t written = ::write(STDERR_FILENO, message.data(), message.size());
  (void)written;
}

// $CKPT_SYNC_LOG opened for appending (a descriptor of its own beside failpoint.cc's: appends
// through either land whole, in the order they were made), the graveyard beside it, and the
// armed power cut. Read once, on the first durability call.
struct Recorder {
  int log_fd = -1;  // -1: $CKPT_SYNC_LOG is unset; record nothing.
  std::string graveyard;
  std::atomic<int64_t> graves{0};
  std::atomic<int64_t> armed_at{-1};  // -1: not counting; 0: counting only.
  std::atomic<int64_t> events{0};
};

Recorder& GetRecorder() {
  static Recorder* recorder = [] {
    auto* made = new Recorder();
    const char* path = std::getenv("CKPT_SYNC_LOG");
    if (path == nullptr) return made;
    made->log_fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (made->log_fd < 0) {
      // Without the log the cut would miss what this process did: stop rather than mislead.
      WriteToStderr(
          absl::StrCat("CKPT_SYNC_LOG=", path, ": cannot open: ", std::strerror(errno), "\n"));
      ::_exit(2);
    }
    made->graveyard = absl::StrCat(path, ".graveyard");
    return made;
  }();
  return *recorder;
}

void Append(const Recorder& recorder, const std::string& line) {
  if (::write(recorder.log_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    WriteToStderr(absl::StrCat("CKPT_SYNC_LOG: write failed: ", line));
    ::_exit(2);
  }
}

std::string AbsolutePath(const char* path) {
  if (path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

// The path `fd` was opened by, as the kernel names it.
std::string PathOfDescriptor(int fd) {
  char target[PATH_MAX];
  const ssize_t length =
      ::readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), target, sizeof(target) - 1);
  if (length <= 0) return absl::StrCat("fd ", fd);
  return std::string(target, static_cast<size_t>(length));
}

// Counts a durability call when armed, and dies just before the armed one.
void BeforeDurabilityCall(Recorder& recorder, const char* call, const std::string& path) {
  const int64_t armed = recorder.armed_at.load();
  if (armed < 0) return;
  const int64_t event = recorder.events.fetch_add(1) + 1;
  Append(recorder, absl::StrCat("event\t", event, "\t", call, "\t", path, "\n"));
  if (event != armed) return;
  WriteToStderr(
      absl::StrCat("power cut before durability event ", event, ": ", call, " ", path, "\n"));
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached: SIGKILL cannot be caught.
}

// Hard-links the regular file at `path`, about to be unlinked or replaced, into the graveyard, so
// that a cut which undoes the removal can bring it back.
void Preserve(Recorder& recorder, const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return;
  ::mkdir(recorder.graveyard.c_str(), 0755);  // EEXIST after the first.
  const std::string grave = absl::StrCat(recorder.graveyard, "/", recorder.graves.fetch_add(1));
  // Without the link the cut cannot undo this removal; it says so (PowerCut::unrestorable).
  if (::link(path.c_str(), grave.c_str()) == 0) {
    Append(recorder, absl::StrCat("preserved\t", path, "\t", grave, "\n"));
  }
}

// The interposed calls (extern "C" at the end of this file) forward here.
int RecordedSync(int fd, bool data_only) {
  Recorder& recorder = GetRecorder();
  if (recorder.log_fd < 0) return RealSync(fd, data_only);
  struct stat info;
  const bool directory = ::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode);
  const std::string path = PathOfDescriptor(fd);
  BeforeDurabilityCall(recorder, data_only ? "fdatasync" : "fsync", path);
  const int result = RealSync(fd, data_only);
  if (result == 0 && directory) Append(recorder, absl::StrCat("dirsynced\t", path, "\n"));
  return result;
}

int RecordedUnlink(const char* path) {
  Recorder& recorder = GetRecorder();
  if (recorder.log_fd < 0) return RealUnlink(path);
  const std::string absolute = AbsolutePath(path);
  BeforeDurabilityCall(recorder, "unlink", absolute);
  Preserve(recorder, absolute);
  const int result = RealUnlink(path);
  if (result == 0) Append(recorder, absl::StrCat("removed\t", absolute, "\n"));
  return result;
}

int RecordedRename(const char* from, const char* to) {
  Recorder& recorder = GetRecorder();
  if (recorder.log_fd < 0) return RealRename(from, to);
  const std::string absolute_from = AbsolutePath(from), absolute_to = AbsolutePath(to);
  BeforeDurabilityCall(recorder, "rename", absl::StrCat(absolute_from, " -> ", absolute_to));
  Preserve(recorder, absolute_to);  // replaced, if it exists.
  const int result = RealRename(from, to);
  if (result == 0) {
    Append(recorder, absl::StrCat("renamed\t", absolute_from, "\t", absolute_to, "\n"));
  }
  return result;
}

}  // namespace

void ArmPowerCut(int64_t event) {
  Recorder& recorder = GetRecorder();
  recorder.events.store(0);
  recorder.armed_at.store(std::max<int64_t>(event, 0));
  if (recorder.log_fd >= 0) Append(recorder, absl::StrCat("armed\t", event, "\n"));
}

int64_t DurabilityEventsSinceArmed() { return GetRecorder().events.load(); }

namespace {

// ---- RocksDB's files.

// Counts the bytes appended, and records the count at each successful Sync/Fsync. The count is
// taken before the sync starts: bytes appended by another thread meanwhile are not claimed.
class SyncRecordingFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  SyncRecordingFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::string path, uint64_t size)
      : FSWritableFileOwnerWrapper(std::move(file)), path_(std::move(path)), size_(size) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->Append(data, options, dbg);
    if (status.ok()) size_ += data.size();
    return status;
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->Append(data, options, info, dbg);
    if (status.ok()) size_ += data.size();
    return status;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->PositionedAppend(data, offset, options, dbg);
    if (status.ok()) GrowTo(offset + data.size());
    return status;
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->PositionedAppend(data, offset, options, info, dbg);
    if (status.ok()) GrowTo(offset + data.size());
    return status;
  }
  rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->Truncate(size, options, dbg);
    if (status.ok()) size_ = size;
    return status;
  }
  rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    const uint64_t covered = size_;
    rocksdb::IOStatus status = target()->Sync(options, dbg);
    if (status.ok()) failpoint::RecordSynced(path_, static_cast<int64_t>(covered));
    return status;
  }
  rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                          rocksdb::IODebugContext* dbg) override {
    const uint64_t covered = size_;
    rocksdb::IOStatus status = target()->Fsync(options, dbg);
    if (status.ok()) failpoint::RecordSynced(path_, static_cast<int64_t>(covered));
    return status;
  }

 private:
  void GrowTo(uint64_t end) {
    uint64_t now = size_.load();
    while (end > now && !size_.compare_exchange_weak(now, end)) {
    }
  }

  const std::string path_;
  std::atomic<uint64_t> size_;
};

// Records the files RocksDB creates; their renames and removals, and the syncs of its directories,
// are recorded by the interposed calls below.
class SyncRecordingFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  SyncRecordingFileSystem() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

  const char* Name() const override { return "SyncRecordingFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& path, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus status = target()->NewWritableFile(path, options, &file, dbg);
    if (!status.ok()) return status;
    failpoint::RecordCreated(path);
    *result = std::make_unique<SyncRecordingFile>(std::move(file), path, 0);
    return status;
  }

  rocksdb::IOStatus ReopenWritableFile(const std::string& path, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus status = target()->ReopenWritableFile(path, options, &file, dbg);
    if (!status.ok()) return status;
    const uint64_t size = file->GetFileSize(rocksdb::IOOptions(), dbg);
    *result = std::make_unique<SyncRecordingFile>(std::move(file), path, size);
    return status;
  }

  rocksdb::IOStatus ReuseWritableFile(const std::string& path, const std::string& old_path,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus status = target()->ReuseWritableFile(path, old_path, options, &file, dbg);
    if (!status.ok()) return status;
    // A renamed file (the rename itself is recorded by the interposed rename) rewritten from its
    // start: what it held before counts as never synced.
    failpoint::RecordCreated(path);
    *result = std::make_unique<SyncRecordingFile>(std::move(file), path, 0);
    return status;
  }
};

// ---- After the process died: the cut.

constexpr int64_t kNeverSynced = -1;
// A file that was there before the process: taken as durable as it is.
constexpr int64_t kWhole = std::numeric_limits<int64_t>::max();

// One file's contents (an inode, whatever names it has): how many of its bytes are durable, and
// a graveyard link that still holds it after its last name went.
struct Contents {
  int64_t durable = kNeverSynced;
  std::string copy;
};

// What a name is bound to: an index into the contents, or kAbsent. `durable` is the binding its
// directory last synced.
constexpr int kAbsent = -1;
struct Binding {
  int current = kAbsent;
  int durable = kAbsent;
};

// The log replayed: every name the process touched, its bindings, and the contents they name.
class SyncLogModel {
 public:
  absl::Status Replay(const std::string& log_path, PowerCut& cut) {
    std::ifstream log(log_path);
    if (!log) return ErrnoToStatus(errno, "opening the sync log", log_path);
    std::string line;
    int line_number = 0;
    while (std::getline(log, line)) {
      ++line_number;
      const std::vector<std::string> fields = absl::StrSplit(line, '\t');
      const std::string& kind = fields[0];
      auto bad_line = [&] {
        return absl::InvalidArgumentError(
            absl::StrCat(log_path, " line ", line_number, ": cannot parse '", line, "'"));
      };
      if (kind == "created" && fields.size() == 2) {
        Binding& name = Touch(fields[1], /*existed=*/false);
        name.current = NewContents(kNeverSynced);
        Changed(fields[1]);
      } else if (kind == "synced" && fields.size() == 3) {
        int64_t length = 0;
        if (!absl::SimpleAtoi(fields[2], &length) || length < 0) return bad_line();
        const Binding& name = Touch(fields[1], /*existed=*/true);
        if (name.current != kAbsent && contents_[name.current].durable != kWhole) {
          contents_[name.current].durable = std::max(contents_[name.current].durable, length);
        }
      } else if (kind == "preserved" && fields.size() == 3) {
        const Binding& name = Touch(fields[1], /*existed=*/true);
        if (name.current != kAbsent) contents_[name.current].copy = fields[2];
      } else if (kind == "renamed" && fields.size() == 3) {
        Binding& from = Touch(fields[1], /*existed=*/true);
        // Had the target existed, the interposed rename would have preserved (touched) it first.
        Binding& to = Touch(fields[2], /*existed=*/false);
        to.current = from.current;
        from.current = kAbsent;
        Changed(fields[1]);
        Changed(fields[2]);
      } else if (kind == "removed" && fields.size() == 2) {
        Touch(fields[1], /*existed=*/true).current = kAbsent;
        Changed(fields[1]);
      } else if (kind == "dirsynced" && fields.size() == 2) {
        ++cut.directory_syncs;
        auto it = unsynced_.find(CanonicalDirectory(fields[1]));
        if (it == unsynced_.end()) continue;
        for (const std::string& path : it->second) {
          Binding& name = names_[path];
          name.durable = name.current;
        }
        unsynced_.erase(it);
      } else if ((kind == "event" && fields.size() == 4) ||
                 (kind == "armed" && fields.size() == 2)) {
        // Where the process was: for the test, not the cut.
      } else {
        return bad_line();
      }
    }
    return absl::OkStatus();
  }

  // Makes the files what their durable bindings say, staging contents in `stage` (a fresh
  // directory on the same file system) so that no name is overwritten before it was read.
  absl::Status Apply(const std::string& stage, PowerCut& cut) {
    std::error_code ignored;
    std::filesystem::remove_all(stage, ignored);
    if (::mkdir(stage.c_str(), 0755) != 0) return ErrnoToStatus(errno, "creating", stage);
    // Where each contents is now: under a current name, or in the graveyard.
    std::map<int, std::string> found;
    for (const auto& [path, name] : names_) {
      if (name.current != kAbsent) found.emplace(name.current, path);
    }
    std::set<int> staged;
    for (const auto& [path, name] : names_) {
      if (name.durable == kAbsent || name.durable == name.current ||
          staged.count(name.durable) == 1) {
        continue;
      }
      auto it = found.find(name.durable);
      const std::string& source = it != found.end() ? it->second : contents_[name.durable].copy;
      const std::string staged_path = absl::StrCat(stage, "/", name.durable);
      if (source.empty() || ::link(source.c_str(), staged_path.c_str()) != 0) {
        if (!source.empty() && errno != ENOENT) return ErrnoToStatus(errno, "staging", source);
        ++cut.unrestorable;
        continue;
      }
      staged.insert(name.durable);
    }
    for (const auto& [path, name] : names_) {
      if (name.durable == name.current) continue;
      struct stat info;
      if (::lstat(path.c_str(), &info) == 0) {
        if (name.durable == kAbsent) cut.bytes_dropped += info.st_size;
        if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "removing", path);
      } else if (errno != ENOENT) {
        return ErrnoToStatus(errno, "looking at", path);
      }
      if (name.durable == kAbsent) {
        if (name.current != kAbsent) ++cut.files_removed;
        continue;
      }
      if (staged.count(name.durable) == 0) continue;  // counted as unrestorable above.
      const std::string staged_path = absl::StrCat(stage, "/", name.durable);
      if (::link(staged_path.c_str(), path.c_str()) != 0) {
        return ErrnoToStatus(errno, "restoring", path);
      }
      ++cut.names_restored;
    }
    for (const auto& [path, name] : names_) {
      if (name.durable == kAbsent) continue;
      struct stat info;
      if (::stat(path.c_str(), &info) != 0) {
        if (errno == ENOENT) continue;  // removed by a path the log does not see.
        return ErrnoToStatus(errno, "looking at", path);
      }
      ++cut.files_tracked;
      const int64_t durable = std::max<int64_t>(contents_[name.durable].durable, 0);
      if (info.st_size > durable) {
        if (::truncate(path.c_str(), durable) != 0) {
          return ErrnoToStatus(errno, "truncating", path);
        }
        ++cut.files_truncated;
        cut.bytes_dropped += info.st_size - durable;
      }
    }
    std::filesystem::remove_all(stage, ignored);
    return absl::OkStatus();
  }

 private:
  int NewContents(int64_t durable) {
    contents_.push_back(Contents{durable, ""});
    return static_cast<int>(contents_.size()) - 1;
  }

  // The binding of `path`, first seen now: bound, as it was before the process, to a file taken
  // as durable (`existed`) or to nothing.
  Binding& Touch(const std::string& path, bool existed) {
    auto [it, first] = names_.try_emplace(Canonical(path));
    if (first && existed) {
      it->second.current = it->second.durable = NewContents(kWhole);
    }
    return it->second;
  }

  // A name in the directory of `path` changed: durable at the directory's next sync.
  void Changed(const std::string& path) {
    unsynced_[CanonicalDirectory(DirectoryOf(path))].insert(Canonical(path));
  }

  static std::string DirectoryOf(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
  }

  // The log names a file as the process spelled it and a directory as the kernel does; both are
  // compared with the directory resolved (every directory still exists).
  std::string CanonicalDirectory(const std::string& directory) {
    auto [it, first] = canonical_.try_emplace(directory);
    if (first) {
      char resolved[PATH_MAX];
      it->second = ::realpath(directory.c_str(), resolved) != nullptr ? resolved : directory;
    }
    return it->second;
  }

  std::string Canonical(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return absl::StrCat(CanonicalDirectory(DirectoryOf(path)), "/",
                        slash == std::string::npos ? path : path.substr(slash + 1));
  }

  std::vector<Contents> contents_;
  std::map<std::string, Binding> names_;
  std::map<std::string, std::set<std::string>> unsynced_;  // directory -> names changed since.
  std::map<std::string, std::string> canonical_;
};

}  // namespace

std::shared_ptr<rocksdb::FileSystem> NewSyncRecordingFileSystem() {
  return std::make_shared<SyncRecordingFileSystem>();
}

absl::StatusOr<PowerCut> CutToSynced(const std::string& log_path) {
  PowerCut cut;
  SyncLogModel model;
  RETURN_IF_ERROR(model.Replay(log_path, cut));
  RETURN_IF_ERROR(model.Apply(log_path + ".stage", cut));
  return cut;
}

}  // namespace ckpt::testing

// ---- The interposed calls: this definition of each is found before the C library's, for every
// caller in the process (RocksDB's shared library included). They forward to the kernel, and
// record in $CKPT_SYNC_LOG when it is set.

extern "C" {

int fsync(int fd) { return ckpt::testing::RecordedSync(fd, /*data_only=*/false); }

int fdatasync(int fd) { return ckpt::testing::RecordedSync(fd, /*data_only=*/true); }

int unlink(const char* path) __THROW { return ckpt::testing::RecordedUnlink(path); }

int rename(const char* from, const char* to) __THROW {
  return ckpt::testing::RecordedRename(from, to);
}

}  // extern "C"
