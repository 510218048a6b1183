#include "libs/store/testing/sync_recording_fs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/io/atomic_file.h"
#include "libs/store/internal/failpoint.h"

namespace ckpt::testing {
namespace {

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
    // A renamed file rewritten from its start: what it held before counts as never synced.
    failpoint::RecordRenamed(old_path, path);
    failpoint::RecordCreated(path);
    *result = std::make_unique<SyncRecordingFile>(std::move(file), path, 0);
    return status;
  }

  rocksdb::IOStatus RenameFile(const std::string& from, const std::string& to,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->RenameFile(from, to, options, dbg);
    if (status.ok()) failpoint::RecordRenamed(from, to);
    return status;
  }

  rocksdb::IOStatus DeleteFile(const std::string& path, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus status = target()->DeleteFile(path, options, dbg);
    if (status.ok()) failpoint::RecordRemoved(path);
    return status;
  }
};

constexpr int64_t kNeverSynced = -1;

}  // namespace

std::shared_ptr<rocksdb::FileSystem> NewSyncRecordingFileSystem() {
  return std::make_shared<SyncRecordingFileSystem>();
}

absl::StatusOr<PowerCut> CutToSynced(const std::string& log_path) {
  std::ifstream log(log_path);
  if (!log) return ErrnoToStatus(errno, "opening the sync log", log_path);
  // path -> bytes durable (kNeverSynced: none, not even the name's contents), for every file the
  // process created and did not remove. Other files were there before it and are left alone.
  std::map<std::string, int64_t> durable;
  std::string line;
  int line_number = 0;
  while (std::getline(log, line)) {
    ++line_number;
    const std::vector<std::string> fields = absl::StrSplit(line, '\t');
    auto bad_line = [&] {
      return absl::InvalidArgumentError(
          absl::StrCat(log_path, " line ", line_number, ": cannot parse '", line, "'"));
    };
    if (fields[0] == "created" && fields.size() == 2) {
      durable[fields[1]] = kNeverSynced;
    } else if (fields[0] == "synced" && fields.size() == 3) {
      int64_t length = 0;
      if (!absl::SimpleAtoi(fields[2], &length) || length < 0) return bad_line();
      int64_t& known = durable[fields[1]];
      known = std::max(known, length);
    } else if (fields[0] == "renamed" && fields.size() == 3) {
      auto from = durable.find(fields[1]);
      if (from == durable.end()) {
        durable.erase(fields[2]);  // an untracked file replaced it: leave the name alone.
      } else {
        const int64_t length = from->second;
        durable.erase(from);
        durable[fields[2]] = length;
      }
    } else if (fields[0] == "removed" && fields.size() == 2) {
      durable.erase(fields[1]);
    } else {
      return bad_line();
    }
  }
  PowerCut cut;
  for (const auto& [path, length] : durable) {
    struct stat info;
    if (::stat(path.c_str(), &info) != 0) {
      if (errno == ENOENT) continue;  // removed by a path the log does not see.
      return ErrnoToStatus(errno, "looking at", path);
    }
    ++cut.files_tracked;
    if (length == kNeverSynced) {
      if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "removing", path);
      ++cut.files_removed;
      cut.bytes_dropped += info.st_size;
    } else if (info.st_size > length) {
      if (::truncate(path.c_str(), length) != 0) return ErrnoToStatus(errno, "truncating", path);
      ++cut.files_truncated;
      cut.bytes_dropped += info.st_size - length;
    }
  }
  return cut;
}

}  // namespace ckpt::testing
