#include "libs/store/change_log_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/io/atomic_file.h"
#include "libs/io/read_file.h"
#include "libs/status/status_macros.h"

namespace ckpt {

namespace {

constexpr absl::string_view kSuffix = ".changes";
constexpr absl::string_view kSnapshotSuffix = ".snapshot";
constexpr int64_t kEntryHeaderBytes = 12;  // sequence (8) + length (4).
// A record larger than this is refused: a length beyond it in a segment is damage, not a record.
constexpr uint32_t kMaxRecordBytes = uint32_t{1} << 31;

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(message);
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == EACCES || error == EPERM || error == EROFS) {
    return absl::PermissionDeniedError(message);
  }
  return absl::InternalError(message);
}

absl::Status SyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening ", path));
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (synced != 0) return ErrnoStatus(error, absl::StrCat("syncing ", path));
  return absl::OkStatus();
}

void PutLittleEndian(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t GetLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return value;
}

// Reads exactly `length` bytes at `offset`; false at a short read (the file ends first).
absl::StatusOr<bool> ReadExactly(int fd, int64_t offset, char* out, int64_t length,
                                 const std::string& path) {
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, out + done, static_cast<size_t>(length - done), offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("reading ", path));
    }
    if (n == 0) return false;
    done += n;
  }
  return true;
}

// One entry's header at `offset`: nullopt at the end of the file or at a cut-short header.
struct EntryHeader {
  int64_t sequence = 0;
  uint32_t length = 0;
};

absl::StatusOr<std::optional<EntryHeader>> ReadEntryHeader(int fd, int64_t offset,
                                                           const std::string& path) {
  char header[kEntryHeaderBytes];
  ASSIGN_OR_RETURN(bool whole, ReadExactly(fd, offset, header, kEntryHeaderBytes, path));
  if (!whole) return std::nullopt;
  EntryHeader entry;
  entry.sequence = static_cast<int64_t>(GetLittleEndian(header, 8));
  entry.length = static_cast<uint32_t>(GetLittleEndian(header + 8, 4));
  return entry;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DirectoryChangeLog>> DirectoryChangeLog::Open(
    const std::string& dir) {
  struct stat info;
  if (::stat(dir.c_str(), &info) != 0) {
    if (errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("looking at ", dir));
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("creating the change log directory ", dir));
    }
    const size_t slash = dir.find_last_of('/');
    RETURN_IF_ERROR(SyncPath(slash == std::string::npos ? "." : dir.substr(0, std::max<size_t>(slash, 1))));
  } else if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  auto log = std::unique_ptr<DirectoryChangeLog>(new DirectoryChangeLog(dir));
  RETURN_IF_ERROR(log->Recover());
  return log;
}

DirectoryChangeLog::~DirectoryChangeLog() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

std::string DirectoryChangeLog::Describe() const { return absl::StrCat("change log in ", dir_); }

int64_t DirectoryChangeLog::last_sequence() const {
  absl::MutexLock lock(&mu_);
  return last_sequence_;
}

absl::Status DirectoryChangeLog::Recover() {
  absl::MutexLock lock(&mu_);
  DIR* listing = ::opendir(dir_.c_str());
  if (listing == nullptr) return ErrnoStatus(errno, absl::StrCat("listing ", dir_));
  while (const dirent* entry = ::readdir(listing)) {
    const absl::string_view name = entry->d_name;
    if (!absl::EndsWith(name, kSuffix)) continue;
    const int64_t first = ChangeNumberFromName(name.substr(0, name.size() - kSuffix.size()));
    if (first < 1) continue;
    segments_.push_back(Segment{first, absl::StrCat(dir_, "/", name)});
  }
  ::closedir(listing);
  std::sort(segments_.begin(), segments_.end(),
            [](const Segment& a, const Segment& b) { return a.first < b.first; });
  if (segments_.empty()) return absl::OkStatus();

  // Only the last segment is walked (by headers; the last entry's frame is checked whole): the
  // others were closed after their last append was synced.
  const Segment& last = segments_.back();
  fd_ = ::open(last.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) return ErrnoStatus(errno, absl::StrCat("opening ", last.path));
  int64_t offset = 0;
  int64_t expected = last.first;
  int64_t last_start = -1;
  uint32_t last_length = 0;
  while (true) {
    ASSIGN_OR_RETURN(std::optional<EntryHeader> header, ReadEntryHeader(fd_, offset, last.path));
    if (!header.has_value()) break;
    if (header->sequence != expected || header->length > kMaxRecordBytes) {
      return absl::DataLossError(absl::StrCat(
          last.path, " is damaged at byte ", offset, ": an entry for change ", header->sequence,
          " of ", header->length, " bytes where change ", expected, " was due"));
    }
    struct stat file;
    if (::fstat(fd_, &file) != 0) return ErrnoStatus(errno, absl::StrCat("looking at ", last.path));
    if (offset + kEntryHeaderBytes + header->length > file.st_size) break;  // cut short.
    last_start = offset;
    last_length = header->length;
    offset += kEntryHeaderBytes + header->length;
    ++expected;
  }
  // The last whole entry must hold a sound frame; one that does not was being written when the
  // process died (its fdatasync never returned, so it was never acknowledged).
  if (last_start >= 0) {
    std::string frame(last_length, '\0');
    ASSIGN_OR_RETURN(bool whole, ReadExactly(fd_, last_start + kEntryHeaderBytes, frame.data(),
                                             last_length, last.path));
    if (!whole || !DecodeChangeFrame(frame, "").ok()) {
      offset = last_start;
      --expected;
    }
  }
  struct stat file;
  if (::fstat(fd_, &file) != 0) return ErrnoStatus(errno, absl::StrCat("looking at ", last.path));
  if (file.st_size != offset) {
    if (::ftruncate(fd_, offset) != 0 || ::fdatasync(fd_) != 0) {
      return ErrnoStatus(errno, absl::StrCat("truncating the torn end of ", last.path));
    }
  }
  size_ = offset;
  last_sequence_ = expected - 1;
  if (last_sequence_ < last.first - 1) last_sequence_ = last.first - 1;
  return absl::OkStatus();
}

absl::Status DirectoryChangeLog::StartSegment(int64_t first) {
  const std::string path = absl::StrCat(dir_, "/", ChangeName(first), kSuffix);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating ", path));
  if (absl::Status synced = SyncPath(dir_); !synced.ok()) {
    ::close(fd);
    ::unlink(path.c_str());
    return synced;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  size_ = 0;
  segments_.push_back(Segment{first, path});
  return absl::OkStatus();
}

absl::Status DirectoryChangeLog::Append(int64_t sequence, absl::string_view bytes) {
  if (bytes.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a change record of ", bytes.size(), " bytes is over the log's limit"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (sequence == last_sequence_ + 1) {
      if (fd_ < 0 || size_ >= kSegmentBytes) RETURN_IF_ERROR(StartSegment(sequence));
      std::string entry(kEntryHeaderBytes, '\0');
      PutLittleEndian(entry.data(), static_cast<uint64_t>(sequence), 8);
      PutLittleEndian(entry.data() + 8, bytes.size(), 4);
      entry.append(bytes.data(), bytes.size());
      int64_t done = 0;
      int error = 0;
      while (done < static_cast<int64_t>(entry.size())) {
        const ssize_t n = ::pwrite(fd_, entry.data() + done, entry.size() - done, size_ + done);
        if (n < 0) {
          if (errno == EINTR) continue;
          error = errno;
          break;
        }
        done += n;
      }
      if (error == 0 && ::fdatasync(fd_) != 0) error = errno;
      if (error != 0) {
        // Nothing of a failed append stays: the next one goes where this one began.
        if (::ftruncate(fd_, size_) != 0) {
          // The torn bytes stay until Open truncates them; the next append overwrites them.
        }
        return ErrnoStatus(error, absl::StrCat("appending change ", sequence, " to ",
                                               segments_.back().path));
      }
      size_ += static_cast<int64_t>(entry.size());
      last_sequence_ = sequence;
      return absl::OkStatus();
    }
    if (sequence > last_sequence_ + 1 || sequence < 1) {
      return absl::InvalidArgumentError(absl::StrCat("change ", sequence, " cannot follow change ",
                                                     last_sequence_, " in ", Describe()));
    }
  }
  // Taken: by these bytes (an earlier attempt) or by others.
  ASSIGN_OR_RETURN(std::vector<LoggedChange> existing, ReadAfter(sequence - 1, 1));
  if (!existing.empty() && existing[0].bytes == bytes) return absl::OkStatus();
  return absl::AlreadyExistsError(
      absl::StrCat("change ", sequence, " in ", Describe(), " holds another record"));
}

absl::StatusOr<std::vector<LoggedChange>> DirectoryChangeLog::ReadAfter(int64_t after,
                                                                        int max_count) const {
  if (max_count < 1) return absl::InvalidArgumentError("ReadAfter needs max_count >= 1");
  absl::MutexLock lock(&mu_);
  std::vector<LoggedChange> changes;
  if (after >= last_sequence_ || segments_.empty()) return changes;
  size_t segment = 0;
  int64_t offset = 0;
  if (position_.sequence == after) {
    segment = position_.segment;
    offset = position_.offset;
  } else {
    // The last segment whose first record is at or before after + 1.
    while (segment + 1 < segments_.size() && segments_[segment + 1].first <= after + 1) ++segment;
  }
  int64_t expected = after + 1;
  while (segment < segments_.size() && static_cast<int>(changes.size()) < max_count &&
         expected <= last_sequence_) {
    const Segment& current = segments_[segment];
    const bool appending = segment + 1 == segments_.size();
    int fd = appending ? fd_ : ::open(current.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening ", current.path));
    absl::Status status;
    while (static_cast<int>(changes.size()) < max_count && expected <= last_sequence_) {
      if (appending && offset >= size_) break;
      absl::StatusOr<std::optional<EntryHeader>> header = ReadEntryHeader(fd, offset, current.path);
      if (!header.ok()) {
        status = header.status();
        break;
      }
      if (!header->has_value()) break;  // the segment's end.
      if ((*header)->length > kMaxRecordBytes || (*header)->sequence > expected) {
        status = absl::DataLossError(absl::StrCat(
            current.path, " is damaged at byte ", offset, ": an entry for change ",
            (*header)->sequence, " where change ", expected, " was due"));
        break;
      }
      const int64_t sequence = (*header)->sequence;
      const int64_t next = offset + kEntryHeaderBytes + (*header)->length;
      if (sequence < expected) {  // before the range asked for.
        offset = next;
        continue;
      }
      LoggedChange change;
      change.sequence = sequence;
      change.bytes.resize((*header)->length);
      absl::StatusOr<bool> whole = ReadExactly(fd, offset + kEntryHeaderBytes, change.bytes.data(),
                                               (*header)->length, current.path);
      if (!whole.ok()) {
        status = whole.status();
        break;
      }
      if (!*whole) {
        status = absl::DataLossError(absl::StrCat(current.path, " ends inside change ", sequence));
        break;
      }
      changes.push_back(std::move(change));
      offset = next;
      ++expected;
    }
    if (!appending) ::close(fd);
    if (!status.ok()) return status;
    if (static_cast<int>(changes.size()) >= max_count || expected > last_sequence_) break;
    ++segment;
    offset = 0;
    if (segment < segments_.size() && segments_[segment].first != expected) {
      return absl::DataLossError(absl::StrCat("change ", expected, " is missing from ", Describe(),
                                              " (segment ", segments_[segment].path,
                                              " begins at change ", segments_[segment].first,
                                              ")"));
    }
  }
  if (expected <= last_sequence_ && static_cast<int>(changes.size()) < max_count) {
    return absl::DataLossError(
        absl::StrCat("change ", expected, " is missing from ", Describe(), " (its last is ",
                     last_sequence_, ")"));
  }
  position_ = ReadPosition{expected - 1, segment, offset};
  return changes;
}

std::string DirectoryChangeLog::SnapshotPath(int64_t sequence) const {
  return absl::StrCat(dir_, "/snapshots/", ChangeName(sequence), kSnapshotSuffix);
}

absl::StatusOr<std::vector<int64_t>> DirectoryChangeLog::ListSnapshots() const {
  std::vector<int64_t> numbers;
  const std::string dir = absl::StrCat(dir_, "/snapshots");
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    if (errno == ENOENT) return numbers;
    return ErrnoStatus(errno, absl::StrCat("listing ", dir));
  }
  while (const dirent* entry = ::readdir(listing)) {
    const absl::string_view name = entry->d_name;
    if (!absl::EndsWith(name, kSnapshotSuffix)) continue;
    const int64_t sequence =
        ChangeNumberFromName(name.substr(0, name.size() - kSnapshotSuffix.size()));
    if (sequence > 0) numbers.push_back(sequence);
  }
  ::closedir(listing);
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

absl::Status DirectoryChangeLog::PutSnapshot(int64_t sequence, absl::string_view bytes) {
  if (sequence < 1) return absl::InvalidArgumentError("change numbers start at 1");
  const std::string dir = absl::StrCat(dir_, "/snapshots");
  if (::mkdir(dir.c_str(), 0755) == 0) {
    RETURN_IF_ERROR(SyncPath(dir_));
  } else if (errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("creating ", dir));
  }
  RETURN_IF_ERROR(WriteFileAtomically(SnapshotPath(sequence), bytes));
  // The two newest stay: the one just written, and the one before in case this one turns bad.
  ASSIGN_OR_RETURN(std::vector<int64_t> numbers, ListSnapshots());
  bool removed = false;
  for (size_t i = 0; i + 2 < numbers.size(); ++i) {
    const std::string path = SnapshotPath(numbers[i]);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("removing ", path));
    }
    removed = true;
  }
  return removed ? SyncPath(dir) : absl::OkStatus();
}

absl::StatusOr<int64_t> DirectoryChangeLog::LatestSnapshot() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> numbers, ListSnapshots());
  return numbers.empty() ? 0 : numbers.back();
}

absl::StatusOr<std::string> DirectoryChangeLog::ReadSnapshot(int64_t sequence) const {
  return ReadSmallFile(SnapshotPath(sequence), "a snapshot of the change log",
                       /*max_bytes=*/uint64_t{1} << 40);
}

}  // namespace ckpt
