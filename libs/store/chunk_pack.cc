#include "libs/store/chunk_pack.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "libs/io/atomic_file.h"
#include "libs/store/change_log_directory.h"
#include "libs/store/internal/failpoint.h"
#include "libs/status/status_macros.h"

namespace ckpt {
namespace {

// Descriptors kept open for reading; beyond this, packs not removed are closed and reopened by
// name when read again (one pack per upload: a long-lived store has thousands).
constexpr size_t kMaxCachedDescriptors = 256;
// PackWriter starts writeback of every this many appended bytes.
constexpr int64_t kWritebackStepBytes = int64_t{8} << 20;

// Pack appends leave this much of the filesystem free: 1/32 of its size, 2..256 MiB. Deleting
// versions and garbage collection are RocksDB writes (WAL, MANIFEST, OPTIONS, audit records), so
// a store whose packs took the last byte could not free space through its own commands
// (`ckpt rm` failed with RESOURCE_EXHAUSTED from the WAL); the failing import is refused here
// instead, cleanly, before RocksDB ever meets ENOSPC.
int64_t ReserveBytes(const struct statvfs& fs) {
  const int64_t total = static_cast<int64_t>(fs.f_blocks) * static_cast<int64_t>(fs.f_frsize);
  return std::clamp<int64_t>(total / 32, int64_t{2} << 20, int64_t{256} << 20);
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string LocationText(const PackLocation& location) {
  return absl::StrCat("pack ", PackFileName(location.pack_id), " bytes ", location.offset, "..",
                      location.offset + location.length);
}

}  // namespace

PackFd::~PackFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<PackDirectory>> PackDirectory::Open(const std::string& dir) {
  struct stat info;
  if (::stat(dir.c_str(), &info) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, "looking at pack directory", dir);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "creating pack directory", dir);
    }
    absl::Status synced = SyncDirectory(ParentOf(dir));
    if (!synced.ok()) return synced;
  } else if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", dir, "' is not a directory"));
  }
  return std::unique_ptr<PackDirectory>(new PackDirectory(dir));
}

std::string PackDirectory::Describe() const { return absl::StrCat("pack files in ", dir_); }

std::optional<std::string> PackDirectory::LocalFilePath(uint64_t pack_id) const {
  return absl::StrCat(dir_, "/", PackFileName(pack_id));
}

absl::StatusOr<std::unique_ptr<ChunkWriter>> PackDirectory::NewPack(uint64_t pack_id) {
  const std::string path = absl::StrCat(dir_, "/", PackFileName(pack_id));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat("pack file ", path, " already exists"));
    }
    return ErrnoToStatus(errno, "creating pack file", path);
  }
  CKPT_RECORD_FILE_CREATED(path);  // failpoint builds only: for simulated power failures.
  return std::make_unique<PackWriter>(path, dir_, pack_id, fd);
}

absl::StatusOr<std::shared_ptr<PackFd>> PackDirectory::OpenPack(uint64_t pack_id) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(pack_id);
    if (it != open_.end()) return it->second;
  }
  const std::string path = absl::StrCat(dir_, "/", PackFileName(pack_id));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::DataLossError(absl::StrCat("pack file ", path, " is missing"));
    }
    return ErrnoToStatus(errno, "opening pack file", path);
  }
  auto opened = std::make_shared<PackFd>(fd);
  std::shared_ptr<PackFd> evicted;  // closed outside the lock (a reader may still hold it).
  absl::MutexLock lock(&mu_);
  if (open_.size() >= kMaxCachedDescriptors) {
    // Evict one pack that is not removed: it can be opened again by name.
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      const uint64_t candidate = it->first;
      if (std::none_of(removed_.begin(), removed_.end(),
                       [&](const auto& removed) { return removed.first == candidate; })) {
        evicted = std::move(it->second);
        open_.erase(it);
        break;
      }
    }
  }
  // Another reader may have opened it meanwhile; keep one descriptor per pack.
  return open_.try_emplace(pack_id, std::move(opened)).first->second;
}

absl::Status PackDirectory::CheckExtent(const PackFd& fd, const PackLocation& location) const {
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) {
    return ErrnoToStatus(errno, "looking at", LocationText(location));
  }
  if (location.offset < 0 || location.length < 0 ||
      location.offset + location.length > static_cast<int64_t>(info.st_size)) {
    return absl::DataLossError(absl::StrCat(LocationText(location), " lies beyond the end of the ",
                                            info.st_size, "-byte file"));
  }
  return absl::OkStatus();
}

absl::Status PackDirectory::Read(const PackLocation& location, char* destination) const {
  absl::StatusOr<std::shared_ptr<PackFd>> fd = OpenPack(location.pack_id);
  if (!fd.ok()) return fd.status();
  int64_t done = 0;
  while (done < location.length) {
    const ssize_t got =
        ::pread((*fd)->get(), destination + done, static_cast<size_t>(location.length - done),
                static_cast<off_t>(location.offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "reading", LocationText(location));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(LocationText(location), ": the file ends after ",
                                              location.offset + done, " bytes"));
    }
    done += got;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<MappedPackRegion>> PackDirectory::MapWhole(uint64_t pack_id) const {
  absl::StatusOr<std::shared_ptr<PackFd>> fd = OpenPack(pack_id);
  if (!fd.ok()) return fd.status();
  struct stat info;
  if (::fstat((*fd)->get(), &info) != 0) {
    return ErrnoToStatus(errno, "looking at pack", PackFileName(pack_id));
  }
  const size_t length = info.st_size > 0 ? static_cast<size_t>(info.st_size) : 1;
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, (*fd)->get(), 0);
  if (base == MAP_FAILED) return ErrnoToStatus(errno, "mapping pack", PackFileName(pack_id));
  return std::make_shared<MappedPackRegion>(base, length, static_cast<int64_t>(info.st_size));
}

absl::StatusOr<std::vector<PackInfo>> PackDirectory::List() const {
  DIR* listing = ::opendir(dir_.c_str());
  if (listing == nullptr) return ErrnoToStatus(errno, "listing pack directory", dir_);
  std::vector<PackInfo> packs;
  while (const dirent* entry = ::readdir(listing)) {
    const std::optional<uint64_t> pack_id = PackIdFromFileName(entry->d_name);
    if (!pack_id.has_value()) continue;
    struct stat info;
    const std::string path = absl::StrCat(dir_, "/", entry->d_name);
    if (::stat(path.c_str(), &info) != 0) continue;  // removed meanwhile.
    PackInfo& pack = packs.emplace_back();
    pack.pack_id = *pack_id;
    pack.size = static_cast<int64_t>(info.st_size);
  }
  ::closedir(listing);
  return packs;
}

absl::Status PackDirectory::Remove(uint64_t pack_id, uint64_t generation) {
  // Opened first, so that readers holding a location in it can still read it; a pack that cannot
  // be opened is not unlinked either.
  absl::StatusOr<std::shared_ptr<PackFd>> fd = OpenPack(pack_id);
  if (!fd.ok()) return fd.status();
  const std::string path = absl::StrCat(dir_, "/", PackFileName(pack_id));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "removing pack file", path);
  }
  CKPT_RECORD_FILE_REMOVED(path);
  // The unlink is durable only once the directory is: without this, a power cut after GC
  // returned brings the pack back and the space GC reported reclaimed with it
  // (rocksdb_checkpoint_store_power_cut_test).
  if (absl::Status synced = SyncDirectory(dir_); !synced.ok()) return synced;
  absl::MutexLock lock(&mu_);
  removed_.emplace_back(pack_id, generation);
  // Evicted meanwhile? Keep this descriptor instead.
  open_.try_emplace(pack_id, *std::move(fd));
  return absl::OkStatus();
}

int PackDirectory::ReleaseRemoved(uint64_t up_to) {
  std::vector<std::shared_ptr<PackFd>> released;  // closed outside the lock.
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> kept;
  for (const auto& [pack_id, generation] : removed_) {
    if (generation > up_to) {
      kept.emplace_back(pack_id, generation);
      continue;
    }
    auto it = open_.find(pack_id);
    if (it == open_.end()) continue;
    released.push_back(std::move(it->second));
    open_.erase(it);
  }
  removed_.swap(kept);
  return 0;
}

absl::StatusOr<int64_t> PackWriter::Append(absl::string_view bytes, int64_t alignment) {
  if (!failed_.ok()) return failed_;
  int64_t offset = size_;
  if (alignment > 1 && offset % alignment != 0) offset += alignment - offset % alignment;
  struct statvfs fs;
  if (::fstatvfs(fd_.get(), &fs) == 0) {
    const int64_t free_bytes =
        static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    const int64_t reserve = ReserveBytes(fs);
    if (free_bytes - static_cast<int64_t>(bytes.size()) < reserve) {
      failed_ = absl::ResourceExhaustedError(absl::StrCat(
          "appending ", bytes.size(), " bytes to pack file ", path_, ": the filesystem has ",
          free_bytes, " bytes free and the store keeps ", reserve,
          " free for deleting versions and garbage collection; free space (`ckpt rm`, then "
          "`ckpt gc`) or move the store to a larger disk"));
      return failed_;
    }
  }
  // Padding is a hole: pwrite past the end leaves zeros without writing them.
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t wrote = ::pwrite(fd_.get(), bytes.data() + done, bytes.size() - done,
                                   static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (wrote < 0) {
      if (errno == EINTR) continue;
      failed_ = ErrnoToStatus(errno, "appending to pack file", path_);
      return failed_;
    }
    done += static_cast<size_t>(wrote);
  }
  size_ = offset + static_cast<int64_t>(bytes.size());
  // Start the disk writing what is appended so far, in steps, so that the commit's fdatasync
  // waits for the last step only, and the disk works while the upload still hashes and copies
  // (RocksDB's bytes_per_sync does the same for its files). Asynchronous and best effort: an
  // I/O error here also fails the fdatasync in Sync.
  if (size_ - writeback_from_ >= kWritebackStepBytes) {
    ::sync_file_range(fd_.get(), static_cast<off_t>(writeback_from_),
                      static_cast<off_t>(size_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
    writeback_from_ = size_;
  }
  return offset;
}

absl::Status PackWriter::Sync() {
  if (!failed_.ok()) return failed_;
  if (::fdatasync(fd_.get()) != 0) {
    // After a failed fsync the kernel may have dropped the dirty pages: never trust this pack
    // again.
    failed_ = ErrnoToStatus(errno, "syncing pack file", path_);
    return failed_;
  }
  if (!entry_synced_) {
    absl::Status synced = SyncDirectory(dir_);
    if (!synced.ok()) return synced;
    entry_synced_ = true;
  }
  CKPT_RECORD_FILE_SYNCED(path_, size_);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChangeLog>> PackDirectory::OpenChangeLog() {
  const size_t slash = dir_.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : dir_.substr(0, slash);
  ASSIGN_OR_RETURN(std::unique_ptr<DirectoryChangeLog> log,
                   DirectoryChangeLog::Open(absl::StrCat(parent.empty() ? "/" : parent, "/changes")));
  return std::unique_ptr<ChangeLog>(std::move(log));
}

}  // namespace ckpt
