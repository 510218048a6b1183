#ifndef CKPT_LIBS_LOADER_LOADER_PROTO_H_
#define CKPT_LIBS_LOADER_LOADER_PROTO_H_

// The wire forms of the Loader interface's Preflight (proto/ckpt/v1/loader.proto), converted in
// one place for both ends: the loader service (services/loader) and RemoteLoader (libs/client).
// (LoadTarget's are in load_target.h.)

#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "libs/loader/loader.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {

v1::KeyPolicy KeyPolicyToProto(const KeyPolicy& policy);

// The expected tensors of a PreflightRequest; INVALID_ARGUMENT for an unknown dtype.
absl::StatusOr<std::vector<ExpectedTensor>> ExpectedTensorsFromProto(
    const google::protobuf::RepeatedPtrField<v1::ExpectedTensor>& expected);
void ExpectedTensorsToProto(const std::vector<ExpectedTensor>& expected,
                            google::protobuf::RepeatedPtrField<v1::ExpectedTensor>& out);

v1::PreflightResponse PreflightReportToProto(const PreflightReport& report);
// INVALID_ARGUMENT for an unknown suggested key policy.
absl::StatusOr<PreflightReport> PreflightReportFromProto(const v1::PreflightResponse& response);

}  // namespace ckpt

#endif  // CKPT_LIBS_LOADER_LOADER_PROTO_H_
