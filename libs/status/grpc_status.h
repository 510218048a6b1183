#ifndef CKPT_LIBS_STATUS_GRPC_STATUS_H_
#define CKPT_LIBS_STATUS_GRPC_STATUS_H_

// grpc::Status <-> absl::Status, used by every service adapter and client.
// gRPC's and Abseil's canonical codes share their numbers, so codes map one to one.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ckpt {

grpc::Status ToGrpcStatus(const absl::Status& status);

absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ckpt

#endif  // CKPT_LIBS_STATUS_GRPC_STATUS_H_
