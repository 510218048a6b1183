#include "libs/registry/serving_sync.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/message.h"
#include "libs/format/checkpoint_file.h"
#include "libs/io/atomic_file.h"
#include "libs/io/backoff.h"
#include "libs/io/proto_json.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kCurrentFile[] = "CURRENT";
constexpr char kLockFile[] = ".lock";
constexpr char kMetadataFile[] = "metadata.json";
constexpr char kTemporaryPrefix[] = ".tmp-";
// How long Run() waits for a watch update before looking at pending retries.
constexpr absl::Duration kPollInterval = absl::Seconds(1);

bool IsVersionName(const std::string& name, int64_t* version) {
  return !name.empty() && std::all_of(name.begin(), name.end(), absl::ascii_isdigit) &&
         absl::SimpleAtoi(name, version) && *version > 0;
}

std::string RandomSuffix() {
  static thread_local std::mt19937_64 generator(std::random_device{}());
  return absl::StrFormat("%016x", generator());
}

// Errors that a later attempt may not see: the store or loader restarting, a watch cut off, a
// full disk being cleaned, a transient read error.
bool IsRetryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

// Errors of a watch that retrying cannot fix.
bool WatchRefusedForGood(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<nlohmann::ordered_json> ProtoJson(const google::protobuf::Message& message) {
  ASSIGN_OR_RETURN(const std::string text, ProtoToJson(message));
  return nlohmann::ordered_json::parse(text);
}

std::string Seconds(absl::Duration duration) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(duration));
}

// Removes `path` and everything under it; errors are left for the next cleanup.
void RemoveTree(const std::string& path) {
  std::error_code error;
  fs::remove_all(path, error);
}

}  // namespace

std::string ServingFileName(ExportFormat format) {
  return format == ExportFormat::kTorch ? "model.pt" : "model.safetensors";
}

absl::Status CheckExportAgainstManifest(const std::string& path, const v1::Manifest& manifest) {
  ASSIGN_OR_RETURN(CheckpointFile file, ReadCheckpointFile(path));
  if (!file.root.is_dict()) {
    return absl::DataLossError(absl::StrCat(path, ": holds no state dict"));
  }
  const std::string version = FormatVersionRef(manifest.model(), manifest.version());
  std::map<std::string, const Value*> written;
  for (const Value::Entry& entry : file.root.entries()) {
    if (entry.first.is_int() || !entry.second.is_tensor()) {
      return absl::DataLossError(
          absl::StrCat(path, ": entry ", entry.first.DebugString(), " is not a named tensor"));
    }
    written[entry.first.string_key()] = &entry.second;
  }
  if (written.size() != static_cast<size_t>(manifest.tensors_size())) {
    return absl::DataLossError(absl::StrCat(path, " holds ", written.size(), " tensors; ", version,
                                            " has ", manifest.tensors_size()));
  }
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    auto it = written.find(meta.key());
    if (it == written.end()) {
      return absl::DataLossError(
          absl::StrCat(path, " lacks tensor '", meta.key(), "' of ", version));
    }
    const at::Tensor& tensor = it->second->tensor();
    const std::vector<int64_t> shape(meta.shape().begin(), meta.shape().end());
    if (tensor.sizes().vec() != shape) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", meta.key(), "' has shape [",
                                              absl::StrJoin(tensor.sizes().vec(), ", "), "], ",
                                              version, " has [", absl::StrJoin(shape, ", "), "]"));
    }
    const DType stored = static_cast<DType>(meta.dtype());
    // Dtypes LibTorch 1.13 lacks (float8) are read back as their raw bytes: only those compare.
    if (ToScalarType(stored).ok()) {
      ASSIGN_OR_RETURN(DType read, FromScalarType(tensor.scalar_type()));
      if (read != stored) {
        return absl::DataLossError(absl::StrCat(path, ": tensor '", meta.key(), "' is ",
                                                DTypeName(read), ", ", version, " has ",
                                                DTypeName(stored)));
      }
    }
    if (meta.content_hash().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(version, " records no content hash for '",
                                                        meta.key(), "': cannot check the export"));
    }
    std::string bytes;
    {
      ASSIGN_OR_RETURN(const at::Tensor stored_bytes, StoredBytes(tensor));  // sparse: its parts.
      bytes.assign(static_cast<const char*>(stored_bytes.data_ptr()), stored_bytes.nbytes());
    }
    // Stores from before chunked content hashes recorded SHA-256 of the bytes (chunk_hasher.h).
    if (ContentHashOfBytes(bytes) != meta.content_hash() && Sha256(bytes) != meta.content_hash()) {
      return absl::DataLossError(absl::StrCat(path, ": the bytes of tensor '", meta.key(),
                                              "' do not hash to the content hash ", version,
                                              " records (", HexEncode(meta.content_hash()), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServingSync>> ServingSync::Create(CheckpointStore& store,
                                                                 const Loader& loader,
                                                                 ServingSyncOptions options) {
  RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.alias != kLatestAlias) RETURN_IF_ERROR(ValidateAliasName(options.alias));
  if (options.directory.empty()) {
    return absl::InvalidArgumentError("a serving sync needs a directory");
  }
  if (options.keep < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep must be >= 0 (0 keeps every version); got ", options.keep));
  }
  const std::string model_dir = (fs::path(options.directory) / options.model).string();
  std::error_code error;
  fs::create_directories(model_dir, error);
  if (error) {
    return ErrnoToStatus(error.value(), "creating the serving directory", model_dir);
  }
  const std::string lock_path = (fs::path(model_dir) / kLockFile).string();
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return ErrnoToStatus(errno, "opening", lock_path);
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int flock_errno = errno;
    close(lock_fd);
    if (flock_errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another sync holds ", lock_path, "; one sync per serving directory and model"));
    }
    return ErrnoToStatus(flock_errno, "locking", lock_path);
  }
  std::unique_ptr<ServingSync> sync(
      new ServingSync(store, loader, std::move(options), model_dir, lock_fd));
  sync->RemoveTemporaries();
  // What an earlier run left current, so that pruning spares it until the first sync.
  std::ifstream current_file(fs::path(model_dir) / kCurrentFile);
  std::string current_text;
  int64_t current = 0;
  if (current_file >> current_text && IsVersionName(current_text, &current) &&
      fs::is_directory(fs::path(model_dir) / current_text, error)) {
    absl::MutexLock lock(&sync->mu_);
    sync->current_ = current;
  }
  return sync;
}

ServingSync::ServingSync(CheckpointStore& store, const Loader& loader, ServingSyncOptions options,
                         std::string model_dir, int lock_fd)
    : store_(store),
      loader_(loader),
      options_(std::move(options)),
      model_dir_(std::move(model_dir)),
      lock_fd_(lock_fd) {}

ServingSync::~ServingSync() {
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock.
}

int64_t ServingSync::current_version() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

void ServingSync::Log(absl::string_view line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << line << "\n" << std::flush;
  }
}

void ServingSync::Stop() {
  absl::MutexLock lock(&mu_);
  if (!stopping_.HasBeenNotified()) stopping_.Notify();
  if (watch_ != nullptr) watch_->Cancel();
}

bool ServingSync::SleepUnlessStopped(absl::Duration duration) {
  return stopping_.WaitForNotificationWithTimeout(duration);
}

void ServingSync::RemoveTemporaries() {
  std::error_code error;
  // Our .tmp- export directories, and AtomicFileWriter's "CURRENT.tmp-XXXXXX" of a CURRENT whose
  // write was cut short.
  const std::string current_temporary = absl::StrCat(kCurrentFile, ".tmp-");
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kTemporaryPrefix) || absl::StartsWith(name, current_temporary)) {
      RemoveTree(entry.path().string());
    }
  }
}

absl::StatusOr<std::optional<int64_t>> ServingSync::ResolveTarget() {
  v1::VersionRef ref;
  ref.set_model(options_.model);
  ref.set_alias(options_.alias);
  absl::StatusOr<v1::Manifest> manifest = store_.GetManifest(ref);
  if (absl::IsNotFound(manifest.status())) return std::nullopt;
  if (!manifest.ok()) return manifest.status();
  return manifest->version();
}

absl::StatusOr<SyncedVersion> ServingSync::SyncOnce() {
  ASSIGN_OR_RETURN(std::optional<int64_t> target, ResolveTarget());
  if (!target.has_value()) {
    return absl::NotFoundError(
        absl::StrCat(options_.model, "@", options_.alias, " does not exist: nothing to sync"));
  }
  return SyncVersion(*target);
}

absl::StatusOr<SyncedVersion> ServingSync::SyncVersion(int64_t version) {
  const absl::Time start = absl::Now();
  SyncedVersion synced;
  synced.version = version;
  synced.path = (fs::path(model_dir_) / absl::StrCat(version)).string();
  std::error_code error;
  if (!fs::exists(fs::path(synced.path) / ServingFileName(options_.format), error)) {
    RETURN_IF_ERROR(Export(version, synced.path));
    synced.exported = true;
  }
  RETURN_IF_ERROR(WriteCurrent(version));
  {
    absl::MutexLock lock(&mu_);
    current_ = version;
  }
  Prune(version);
  RemoveTemporaries();
  Log(absl::StrCat("synced ", options_.model, "@", options_.alias, " -> version ", version,
                   synced.exported ? absl::StrCat(" in ", Seconds(absl::Now() - start))
                                   : std::string(" (already on disk)")));
  return synced;
}

absl::Status ServingSync::Export(int64_t version, const std::string& final_dir) {
  const v1::VersionRef ref = MakeVersionRef(options_.model, version);
  ASSIGN_OR_RETURN(v1::Manifest manifest, store_.GetManifest(ref));
  const std::string temporary =
      (fs::path(model_dir_) / absl::StrCat(kTemporaryPrefix, version, "-", RandomSuffix()))
          .string();
  std::error_code error;
  if (!fs::create_directory(temporary, error)) {
    return ErrnoToStatus(error ? error.value() : EEXIST, "creating", temporary);
  }
  // Whatever fails below, the .tmp- directory goes.
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      if (!path.empty()) RemoveTree(path);
    }
  } cleanup{temporary};

  const std::string file_name = ServingFileName(options_.format);
  const std::string file = (fs::path(temporary) / file_name).string();
  ExportOptions export_options;
  export_options.format = options_.format;
  ASSIGN_OR_RETURN(ExportResult exported, loader_.Export(ref, export_options, file));
  absl::Status checked = CheckExportAgainstManifest(file, manifest);
  if (!checked.ok()) {
    return absl::Status(checked.code(), absl::StrCat("the export of ", FormatVersionRef(ref),
                                                     " does not match the store, not installed: ",
                                                     checked.message()));
  }

  nlohmann::ordered_json metadata;
  metadata["model"] = options_.model;
  metadata["version"] = version;
  metadata["alias"] = options_.alias;
  metadata["format"] = std::string(ExportFormatName(options_.format));
  metadata["file"] = file_name;
  metadata["file_bytes"] = exported.file_bytes;
  const absl::Time now = absl::Now();
  metadata["synced_at"] = absl::FormatTime("%Y-%m-%d%ET%H:%M:%E6SZ", now, absl::UTCTimeZone());
  metadata["synced_unix_micros"] = absl::ToUnixMicros(now);
  metadata["aliases"] =
      std::vector<std::string>(manifest.aliases().begin(), manifest.aliases().end());
  ASSIGN_OR_RETURN(metadata["metadata"], ProtoJson(manifest.metadata()));
  ASSIGN_OR_RETURN(metadata["annotations"], ProtoJson(manifest.annotations()));
  metadata["tensor_count"] = manifest.tensors_size();
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const v1::TensorMeta& meta : manifest.tensors()) {
    tensors.push_back({{"key", meta.key()},
                       {"dtype", std::string(DTypeName(static_cast<DType>(meta.dtype())))},
                       {"shape", std::vector<int64_t>(meta.shape().begin(), meta.shape().end())},
                       {"content_hash", HexEncode(meta.content_hash())}});
  }
  metadata["tensors"] = std::move(tensors);
  metadata["left_out"] = exported.left_out;
  // Both files were written through AtomicFileWriter, which fsyncs each and this directory.
  RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(temporary) / kMetadataFile).string(), metadata.dump(2) + "\n"));
  RETURN_IF_ERROR(SyncDirectory(temporary));

  if (fs::exists(final_dir, error)) {
    // Synced before in another format: swap the complete new directory in at once, then remove
    // the old one (now under the temporary name).
    if (renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      return ErrnoToStatus(errno, "exchanging", final_dir);
    }
  } else if (rename(temporary.c_str(), final_dir.c_str()) != 0) {
    return ErrnoToStatus(errno, "renaming into", final_dir);
  }
  return SyncDirectory(model_dir_);
}

absl::Status ServingSync::WriteCurrent(int64_t version) {
  return WriteFileAtomically((fs::path(model_dir_) / kCurrentFile).string(),
                             absl::StrCat(version, "\n"));
}

void ServingSync::Prune(int64_t keep_version) {
  if (options_.keep == 0) return;
  std::vector<int64_t> versions;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir_, error)) {
    int64_t version = 0;
    if (entry.is_directory(error) && IsVersionName(entry.path().filename().string(), &version)) {
      versions.push_back(version);
    }
  }
  std::sort(versions.begin(), versions.end());
  size_t remaining = versions.size();
  for (int64_t version : versions) {
    if (remaining <= static_cast<size_t>(options_.keep)) break;
    if (version == keep_version) continue;
    const std::string path = (fs::path(model_dir_) / absl::StrCat(version)).string();
    // Out of sight first, so no reader finds a half-removed version directory.
    const std::string doomed = (fs::path(model_dir_) / absl::StrCat(kTemporaryPrefix, "removed-",
                                                                    version, "-", RandomSuffix()))
                                   .string();
    if (rename(path.c_str(), doomed.c_str()) != 0) {
      Log(absl::StrCat("could not remove ", path, ": ",
                       ErrnoToStatus(errno, "renaming", path).message()));
      continue;
    }
    RemoveTree(doomed);
    --remaining;
    Log(absl::StrCat("removed ", path, " (keeping ", options_.keep, ")"));
  }
}

absl::StatusOr<std::optional<int64_t>> ServingSync::TargetAfter(const v1::WatchResponse& update,
                                                                std::optional<int64_t> target) {
  const bool latest = options_.alias == kLatestAlias;
  // An update that is no event is the state, even when its oneof is unset: a state without models
  // is an empty message (the default Watch sends it so), which proto does not mark as set.
  if (!update.has_event()) {
    for (const v1::ModelInfo& model : update.state().models()) {
      if (model.name() != options_.model) continue;
      if (latest) {
        return model.latest_version() > 0 ? std::optional<int64_t>(model.latest_version())
                                          : std::nullopt;
      }
      auto it = model.aliases().find(options_.alias);
      if (it == model.aliases().end()) return std::nullopt;
      return it->second;
    }
    return std::nullopt;
  }
  const v1::RegistryEvent& event = update.event();
  switch (event.kind()) {
    case v1::RegistryEvent::ALIAS_SET:
      if (!latest && event.alias() == options_.alias) return event.version();
      return target;
    case v1::RegistryEvent::ALIAS_DELETED:
      if (!latest && event.alias() == options_.alias) return std::nullopt;
      return target;
    case v1::RegistryEvent::VERSION_COMMITTED:
      if (latest) return event.version();
      return target;
    case v1::RegistryEvent::VERSION_DELETED:
      // Deleting the version an alias points at removes the alias (force); "latest" falls back to
      // the newest version left. Either way the store knows best.
      if (target.has_value() && event.version() == *target) return ResolveTarget();
      return target;
    case v1::RegistryEvent::MODEL_RENAMED:
      if (event.model() == options_.model) {
        Log(absl::StrCat(options_.model, " was renamed to ", event.new_name(),
                         "; this sync follows the name ", options_.model,
                         " and keeps what it synced"));
        return std::nullopt;
      }
      return target;
    case v1::RegistryEvent::MODEL_DELETED:
      return std::nullopt;
    default:
      return target;
  }
}

absl::Status ServingSync::Run() {
  const std::string followed = absl::StrCat(options_.model, "@", options_.alias);
  v1::WatchRequest request;
  request.add_models(options_.model);
  request.add_aliases(options_.alias);
  // Waits are scheduled (SleepUnlessStopped, retry_at), never slept by the Backoff itself; no
  // deadline: a sync follows its alias until stopped.
  Backoff backoff(BackoffPolicy{options_.initial_backoff, options_.max_backoff, 2.0, 0.2});
  auto next_backoff = [&]() { return *backoff.Next(); };
  while (!stopping_.HasBeenNotified()) {
    // A fresh watch each time (no resume token): its state is the truth, whatever was missed.
    absl::StatusOr<std::unique_ptr<RegistryWatch>> opened = store_.Watch(request);
    if (!opened.ok()) {
      if (WatchRefusedForGood(opened.status())) return opened.status();
      const absl::Duration wait = next_backoff();
      Log(absl::StrCat("watching ", followed, ": ", opened.status().ToString(), "; retrying in ",
                       Seconds(wait)));
      if (SleepUnlessStopped(wait)) break;
      continue;
    }
    std::unique_ptr<RegistryWatch> watch = *std::move(opened);
    {
      absl::MutexLock lock(&mu_);
      watch_ = watch.get();
      if (stopping_.HasBeenNotified()) watch->Cancel();
    }
    std::optional<int64_t> target;
    bool have_state = false;
    // The version that last failed for good (0: none), not retried until the target moves.
    int64_t given_up = 0;
    std::optional<absl::Time> retry_at;
    absl::Status ended;
    while (!stopping_.HasBeenNotified()) {
      absl::StatusOr<std::optional<v1::WatchResponse>> update =
          watch->Next(absl::Now() + kPollInterval);
      if (!update.ok()) {
        ended = update.status();
        break;
      }
      bool attempt = false;
      if (update->has_value()) {
        const std::optional<int64_t> before = target;
        absl::StatusOr<std::optional<int64_t>> after = TargetAfter(**update, target);
        if (!after.ok()) {
          ended = after.status();
          break;
        }
        target = *after;
        const bool is_state = !(*update)->has_event();
        if (is_state) {
          have_state = true;
          backoff.Reset();
          if (!target.has_value()) {
            Log(absl::StrCat(followed, " does not exist (yet); waiting for it"));
          }
        } else if (before.has_value() && !target.has_value()) {
          Log(absl::StrCat(followed, " no longer points anywhere; still serving version ",
                           current_version()));
        }
        const bool changed = target != before || is_state;
        if (changed) {
          given_up = 0;
          // A new target is tried at once; an unchanged one waits for its retry time.
          attempt = have_state && target.has_value() && (*target != current_version() || is_state);
        }
      }
      if (!attempt && retry_at.has_value() && absl::Now() >= *retry_at) {
        attempt = target.has_value();
      }
      if (!attempt || *target == given_up) continue;
      retry_at.reset();
      absl::StatusOr<SyncedVersion> synced = SyncVersion(*target);
      if (synced.ok()) {
        backoff.Reset();
        continue;
      }
      if (IsRetryable(synced.status())) {
        const absl::Duration wait = next_backoff();
        retry_at = absl::Now() + wait;
        Log(absl::StrCat("syncing ", followed, " -> version ", *target, ": ",
                         synced.status().ToString(), "; retrying in ", Seconds(wait)));
      } else {
        given_up = *target;
        Log(absl::StrCat("syncing ", followed, " -> version ", *target, ": ",
                         synced.status().ToString(), "; waiting for the alias to move"));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      watch_ = nullptr;
    }
    watch.reset();
    if (stopping_.HasBeenNotified()) break;
    if (WatchRefusedForGood(ended)) return ended;
    const absl::Duration wait = next_backoff();
    Log(absl::StrCat("the watch of ", followed, " ended: ", ended.ToString(), "; reopening in ",
                     Seconds(wait)));
    if (SleepUnlessStopped(wait)) break;
  }
  return absl::OkStatus();
}

}  // namespace ckpt
