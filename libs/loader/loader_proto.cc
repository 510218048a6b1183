#include "libs/loader/loader_proto.h"

#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {

v1::KeyPolicy KeyPolicyToProto(const KeyPolicy& policy) {
  switch (policy.kind()) {
    case KeyPolicy::Kind::kAddPrefix:
      return v1::KEY_POLICY_ADD_PREFIX;
    case KeyPolicy::Kind::kOriginal:
      return v1::KEY_POLICY_ORIGINAL;
    case KeyPolicy::Kind::kCanonical:
      break;
  }
  return v1::KEY_POLICY_CANONICAL;
}

absl::StatusOr<std::vector<ExpectedTensor>> ExpectedTensorsFromProto(
    const google::protobuf::RepeatedPtrField<v1::ExpectedTensor>& expected) {
  std::vector<ExpectedTensor> out;
  out.reserve(expected.size());
  for (const v1::ExpectedTensor& tensor : expected) {
    ExpectedTensor& converted = out.emplace_back();
    converted.key = tensor.key();
    converted.shape.assign(tensor.shape().begin(), tensor.shape().end());
    if (tensor.dtype() != v1::DTYPE_UNSPECIFIED) {
      ASSIGN_OR_RETURN(converted.dtype, DTypeFromProto(tensor.dtype()));
    }
  }
  return out;
}

void ExpectedTensorsToProto(const std::vector<ExpectedTensor>& expected,
                            google::protobuf::RepeatedPtrField<v1::ExpectedTensor>& out) {
  for (const ExpectedTensor& tensor : expected) {
    v1::ExpectedTensor& converted = *out.Add();
    converted.set_key(tensor.key);
    for (int64_t d : tensor.shape) converted.add_shape(d);
    converted.set_dtype(static_cast<v1::DType>(tensor.dtype));
  }
}

v1::PreflightResponse PreflightReportToProto(const PreflightReport& report) {
  v1::PreflightResponse response;
  response.set_compatible(report.report.compatible());
  for (const std::string& key : report.report.missing_keys) response.add_missing_keys(key);
  for (const std::string& key : report.report.unexpected_keys) response.add_unexpected_keys(key);
  for (const ShapeMismatch& mismatch : report.report.shape_mismatches) {
    v1::ShapeMismatch& out = *response.add_shape_mismatches();
    out.set_key(mismatch.key);
    for (int64_t d : mismatch.checkpoint_shape) out.add_checkpoint_shape(d);
    for (int64_t d : mismatch.expected_shape) out.add_expected_shape(d);
  }
  for (const std::string& difference : report.dtype_differences) {
    response.add_dtype_differences(difference);
  }
  if (report.suggested_keys.has_value()) {
    response.set_has_suggestion(true);
    response.set_suggested_key_policy(KeyPolicyToProto(*report.suggested_keys));
    response.set_suggested_key_prefix(report.suggested_keys->prefix());
  }
  response.set_summary(report.summary);
  return response;
}

absl::StatusOr<PreflightReport> PreflightReportFromProto(const v1::PreflightResponse& response) {
  PreflightReport report;
  report.report.missing_keys.assign(response.missing_keys().begin(), response.missing_keys().end());
  report.report.unexpected_keys.assign(response.unexpected_keys().begin(),
                                       response.unexpected_keys().end());
  for (const v1::ShapeMismatch& mismatch : response.shape_mismatches()) {
    report.report.shape_mismatches.push_back(
        {mismatch.key(),
         {mismatch.checkpoint_shape().begin(), mismatch.checkpoint_shape().end()},
         {mismatch.expected_shape().begin(), mismatch.expected_shape().end()}});
  }
  report.dtype_differences.assign(response.dtype_differences().begin(),
                                  response.dtype_differences().end());
  // A server from before has_suggestion sent only non-canonical suggestions unmistakably.
  if (response.has_suggestion() || response.suggested_key_policy() != v1::KEY_POLICY_CANONICAL) {
    switch (response.suggested_key_policy()) {
      case v1::KEY_POLICY_CANONICAL:
        report.suggested_keys = KeyPolicy::Canonical();
        break;
      case v1::KEY_POLICY_ADD_PREFIX:
        report.suggested_keys = KeyPolicy::AddPrefix(response.suggested_key_prefix());
        break;
      case v1::KEY_POLICY_ORIGINAL:
        report.suggested_keys = KeyPolicy::Original();
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("PreflightResponse.suggested_key_policy: unknown value ",
                         response.suggested_key_policy()));
    }
  }
  report.summary = response.summary();
  return report;
}

}  // namespace ckpt
