#include "tools/ckpt/sync_command.h"

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/loader/export.h"
#include "libs/loader/local_loader.h"
#include "libs/registry/serving_sync.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"
#include "tools/ckpt/store_access.h"

namespace ckpt {

cli::CommandSpec SyncCommand() {
  return {
      "sync",
      "MODEL@ALIAS DIR",
      "Keep DIR/MODEL/VERSION/ (model file + metadata.json, checked against the store's "
      "hashes, renamed into place whole) and DIR/MODEL/CURRENT in step with an alias, for "
      "model servers: follows every move until killed (safe at any time), or syncs once.",
      2,
      2,
      {{"format", "safetensors|pt", "the model file: model.safetensors or model.pt", "safetensors"},
       {"keep", "N", "version directories kept, the current one included (0: all)", "2"},
       {"once", "", "sync the alias's current version and exit (for cron and scripts)", ""},
       {"loader", "HOST:PORT", "export through a loader service instead of this process", ""}}};
}

absl::Status RunSync(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(line.arguments()[0]));
  if (ref.ref_case() == v1::VersionRef::kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("sync follows an alias (MODEL@production, MODEL@latest), not a version "
                     "number; to write one version use ckpt export"));
  }
  ServingSyncOptions options;
  options.model = ref.model();
  options.alias = ref.alias().empty() ? std::string(kLatestAlias) : ref.alias();
  options.directory = line.arguments()[1];
  ASSIGN_OR_RETURN(options.format, ParseExportFormat(line.Get("format")));
  ASSIGN_OR_RETURN(int64_t keep, line.GetInt("keep"));
  if (keep < 0 || keep > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep must be between 0 (keep all) and 1000000; got ", keep));
  }
  options.keep = static_cast<int>(keep);
  // Sidecar logs want times: each line starts with one.
  options.log = [](absl::string_view text) {
    std::cerr << UtcTimeText(absl::ToUnixMicros(absl::Now())) << " " << text << "\n" << std::flush;
  };
  // The store is opened even with --loader: the sync watches the alias there.
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  std::unique_ptr<Loader> loader;
  if (line.Has("loader")) {
    ASSIGN_OR_RETURN(loader, ConnectLoader(line));
  } else {
    loader = std::make_unique<LocalLoader>(*store);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ServingSync> sync,
                   ServingSync::Create(*store, *loader, options));
  if (line.Has("once")) {
    ASSIGN_OR_RETURN(SyncedVersion synced, sync->SyncOnce());
    std::cout << synced.path << "\n";
    return absl::OkStatus();
  }
  return sync->Run();
}

}  // namespace ckpt
