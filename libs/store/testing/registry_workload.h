#ifndef CKPT_LIBS_STORE_TESTING_REGISTRY_WORKLOAD_H_
#define CKPT_LIBS_STORE_TESTING_REGISTRY_WORKLOAD_H_

// Every kind of change a store records, and everything a user can read back of it, for the
// tests that lose a store's index and rebuild it from its change log (issue #53): equal dumps
// before and after mean nothing was lost, reordered or changed.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt::testing {

// Through an AuditedStore over `store` (so the audit log fills too): a model created with
// details, four seeded commits of it and two of a second model (chunks shared between them),
// aliases set, moved and deleted, annotations, a details update, a forced version delete,
// retention keeping the newest two, and a garbage collection. `round` (1, 2, ...) varies the
// seeds and names, so calling it again adds to the same store.
absl::Status MakeEveryKindOfChange(CheckpointStore& store, int round = 1);

// Everything a user reads of `store`, as text: ListModels, every model's ListVersions and each
// version's manifest (aliases and annotations in it), the whole history and audit log, and the
// whole store's Verify (every chunk re-hashed). Two stores with equal dumps hold the same
// registry, the same bytes under the same names, in the same order.
absl::StatusOr<std::string> DumpRegistry(CheckpointStore& store);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_STORE_TESTING_REGISTRY_WORKLOAD_H_
