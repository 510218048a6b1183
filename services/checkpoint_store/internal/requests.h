#ifndef CKPT_SERVICES_CHECKPOINT_STORE_INTERNAL_REQUESTS_H_
#define CKPT_SERVICES_CHECKPOINT_STORE_INTERNAL_REQUESTS_H_

// What the store service's handlers (store_service.cc, store_service_download.cc,
// store_service_history.cc) read from requests, and answer, the same way.

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"
#include "libs/rpc/wire_constants.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt::store_service_internal {

// How a call ends that its client cancelled (or whose deadline passed) before it was served.
inline grpc::Status Cancelled() {
  return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
}

// What a request says about why it changes the store; AuditedStore adds who.
inline ChangeAttribution Because(const std::string& reason) {
  return ChangeAttribution{"", reason};
}

// The page size a request asks for: 0 is the default, more than the maximum is capped.
inline absl::StatusOr<int> PageSize(int requested) {
  if (requested < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size is ", requested, "; use 0 for the default (", kDefaultPageSize, ")"));
  }
  return requested == 0 ? kDefaultPageSize : std::min(requested, kMaxPageSize);
}

}  // namespace ckpt::store_service_internal

#endif  // CKPT_SERVICES_CHECKPOINT_STORE_INTERNAL_REQUESTS_H_
