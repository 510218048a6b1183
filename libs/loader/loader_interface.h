#ifndef CKPT_LIBS_LOADER_LOADER_INTERFACE_H_
#define CKPT_LIBS_LOADER_LOADER_INTERFACE_H_

// Loader: a stored version served to a consumer in its own shape -- one interface whether the
// work happens in this process (LocalLoader, over a CheckpointStore) or in a loader service
// (RemoteLoader, libs/client/remote_loader.h). Callers such as `ckpt export` / `ckpt check`
// hold a Loader and never branch on where it runs, so both paths give the same answers.
//
// Thread-safety: implementations allow concurrent calls.
//
// Example:
//   std::unique_ptr<Loader> loader = std::make_unique<LocalLoader>(*store);   // or RemoteLoader
//   ASSIGN_OR_RETURN(PreflightReport report,
//                    loader->Preflight(ref, ExpectedTensorsOf(net), LoadTarget()));
//   if (report.report.compatible()) { ASSIGN_OR_RETURN(LoadedState state, loader->Load(ref, {})); }

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libs/loader/export.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

class Loader {
 public:
  virtual ~Loader() = default;

  // `ref` adapted to `target`: errors as Load in loader.h.
  virtual absl::StatusOr<LoadedState> Load(const v1::VersionRef& ref,
                                           const LoadTarget& target) const = 0;

  // How `expected` (a consumer's keys, shapes and optionally dtypes) compares with the subset of
  // `ref` that `target` selects, keys under target.keys. Moves no tensor bytes. NOT_FOUND for a
  // missing version; INVALID_ARGUMENT for a subset naming keys the version lacks.
  virtual absl::StatusOr<PreflightReport> Preflight(const v1::VersionRef& ref,
                                                    const std::vector<ExpectedTensor>& expected,
                                                    const LoadTarget& target) const = 0;

  // Writes the export of `ref` to `path` atomically (export.h says what it holds). Errors as
  // ExportToFile.
  virtual absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref,
                                              const ExportOptions& options,
                                              const std::string& path) const = 0;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_LOADER_INTERFACE_H_
