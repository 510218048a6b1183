#ifndef CKPT_LIBS_REGISTRY_SERVING_SYNC_H_
#define CKPT_LIBS_REGISTRY_SERVING_SYNC_H_

// ServingSync: keeps a directory that model servers read in step with an alias of the registry
// ("resnet@production"), so promoting or rolling back a version in the store is all it takes to
// change what is served. `ckpt sync` runs one as a sidecar next to a server.
//
// Layout under `directory` (one ServingSync per model directory, enforced by a lock file):
//   DIR/<model>/<version>/model.safetensors   (or model.pt): the version's model state dict
//   DIR/<model>/<version>/metadata.json       model, version, alias, format, file bytes,
//                                             version metadata (lineage included), annotations,
//                                             every tensor's key, dtype, shape and content hash,
//                                             when it was synced
//   DIR/<model>/CURRENT                       the version the alias points at, "7\n"
//   DIR/<model>/.lock                         held by the running ServingSync
//   DIR/<model>/.tmp-*                        work in progress (removed at start and after syncs)
//
// A version directory appears whole or not at all: the version is exported (through a Loader:
// in this process over the store, or by a loader service) into a .tmp- directory, every tensor of
// the written file is read back and its bytes hashed against the store's content hashes (a
// mismatch is DATA_LOSS and nothing is renamed), files and directory are fsynced, and only then
// is it renamed to DIR/<model>/<version>/. CURRENT is replaced atomically after that, so a server
// that follows CURRENT never sees a version whose files are incomplete. Killing the process at
// any point is safe: the next start removes what it left in .tmp- directories and CURRENT.tmp-*.
//
// Version directories beyond `keep` are removed, oldest version numbers first, never the one
// CURRENT names (each is renamed into .tmp- first, so a reader never sees half a directory).
// When the alias is deleted (or its version deleted with it) nothing on disk changes: servers
// keep serving what CURRENT names until the alias points somewhere again.
//
// Following: Run() watches the model (CheckpointStore::Watch, filtered to the alias), recomputes
// the target on the initial state and on each ALIAS_SET / ALIAS_DELETED / VERSION_DELETED event
// (VERSION_COMMITTED for the alias "latest"), and syncs it. A watch that ends with a retryable
// error (UNAVAILABLE: the store restarting; CANCELLED / RESOURCE_EXHAUSTED: cut off; ...) is
// reopened from a fresh state with exponential backoff; a sync that fails with one is retried
// likewise. A version that cannot be exported at all (e.g. a dtype the format cannot hold) is
// logged and skipped until the alias moves.
//
// Thread-safety: Run() and SyncOnce() from one thread at a time; Stop() from any thread.
//
// Example:
//   LocalLoader loader(*store);
//   ServingSyncOptions options;
//   options.model = "resnet";
//   options.alias = "production";
//   options.directory = "/srv/models";
//   ASSIGN_OR_RETURN(std::unique_ptr<ServingSync> sync,
//                    ServingSync::Create(*store, loader, options));
//   RETURN_IF_ERROR(sync->Run());  // until sync->Stop()

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "libs/loader/export.h"
#include "libs/loader/loader_interface.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

struct ServingSyncOptions {
  std::string model;
  // The alias to follow; "latest" follows the newest version.
  std::string alias;
  // The serving root; DIR/<model> is created when missing.
  std::string directory;
  ExportFormat format = ExportFormat::kSafetensors;
  // Version directories kept on disk, the current one included; 0 keeps every one. Default 2:
  // the current version and the one before it, so a rollback is served without an export.
  int keep = 2;
  // Backoff between retries after a retryable error: doubles from initial to max.
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(30);
  // Progress and error lines ("synced resnet@production -> version 7 in 1.2 s"). Empty: stderr.
  std::function<void(absl::string_view line)> log;
};

// What SyncOnce / SyncVersion did.
struct SyncedVersion {
  int64_t version = 0;
  std::string path;       // DIR/<model>/<version>
  bool exported = false;  // false: it was on disk already.
};

// "model.safetensors" / "model.pt".
std::string ServingFileName(ExportFormat format);

// Checks every model tensor of `manifest` against the file at `path` (an export of it with
// canonical keys and dtypes kept): the file holds exactly those keys, and each tensor's shape,
// dtype and bytes match (the bytes hashed as the store hashes them, compared with the manifest's
// content hashes). DATA_LOSS naming the first tensor that differs; errors of reading the file.
absl::Status CheckExportAgainstManifest(const std::string& path, const v1::Manifest& manifest);

class ServingSync {
 public:
  // Validates `options` (INVALID_ARGUMENT for a bad model or alias name, an empty directory or a
  // negative keep), creates DIR/<model>, takes its lock (FAILED_PRECONDITION when another sync
  // holds it) and removes stale .tmp- directories. `store` and `loader` must outlive the sync.
  static absl::StatusOr<std::unique_ptr<ServingSync>> Create(CheckpointStore& store,
                                                             const Loader& loader,
                                                             ServingSyncOptions options);
  ~ServingSync();  // releases the lock.
  ServingSync(const ServingSync&) = delete;
  ServingSync& operator=(const ServingSync&) = delete;

  // Syncs the version the alias points at now. NOT_FOUND when the model or alias does not exist;
  // errors of SyncVersion.
  absl::StatusOr<SyncedVersion> SyncOnce();

  // Makes DIR/<model>/<version>/ present (exported and checked when missing), points CURRENT at
  // it and removes version directories beyond `keep`. NOT_FOUND for a missing version; DATA_LOSS
  // when the written file does not match the store; the Loader's export errors; filesystem errors
  // (RESOURCE_EXHAUSTED for a full disk, PERMISSION_DENIED, UNAVAILABLE).
  absl::StatusOr<SyncedVersion> SyncVersion(int64_t version);

  // Follows the alias until Stop() (see above), then returns OK. Returns an error only when the
  // store refuses the watch for good (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED,
  // UNIMPLEMENTED).
  absl::Status Run();

  // Makes Run() return soon. Thread-safe; idempotent.
  void Stop();

  // The version CURRENT names; 0 before the first sync.
  int64_t current_version() const;

 private:
  ServingSync(CheckpointStore& store, const Loader& loader, ServingSyncOptions options,
              std::string model_dir, int lock_fd);

  // The target after `update`; `target` is the one before it.
  absl::StatusOr<std::optional<int64_t>> TargetAfter(const v1::WatchResponse& update,
                                                     std::optional<int64_t> target);
  // The version the alias points at now, asked of the store; nullopt when it does not exist.
  absl::StatusOr<std::optional<int64_t>> ResolveTarget();
  absl::Status Export(int64_t version, const std::string& final_dir);
  absl::Status WriteCurrent(int64_t version);
  void Prune(int64_t keep_version);
  void RemoveTemporaries();
  void Log(absl::string_view line) const;
  // Waits `duration` or until Stop(); true when stopping.
  bool SleepUnlessStopped(absl::Duration duration);

  CheckpointStore& store_;
  const Loader& loader_;
  const ServingSyncOptions options_;
  const std::string model_dir_;  // DIR/<model>
  const int lock_fd_;
  absl::Notification stopping_;
  mutable absl::Mutex mu_;
  RegistryWatch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;  // the one Run() reads, for Stop().
  int64_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_REGISTRY_SERVING_SYNC_H_
