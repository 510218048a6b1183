#include "libs/loader/load_target.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/status/status_macros.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {

absl::StatusOr<LoadTarget> LoadTargetFromProto(const v1::LoadTarget& proto) {
  LoadTarget target;
  if (!proto.device().empty()) {
    ASSIGN_OR_RETURN(target.device, ParseDevice(proto.device()));
  }
  if (proto.cast_floating_to() != v1::DTYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(proto.cast_floating_to()));
    ASSIGN_OR_RETURN(target.dtype, DTypePolicy::CastFloatingTo(dtype));
  }
  switch (proto.key_policy()) {
    case v1::KEY_POLICY_CANONICAL:
      target.keys = KeyPolicy::Canonical();
      break;
    case v1::KEY_POLICY_ADD_PREFIX:
      target.keys =
          KeyPolicy::AddPrefix(proto.key_prefix().empty() ? "module." : proto.key_prefix());
      break;
    case v1::KEY_POLICY_ORIGINAL:
      target.keys = KeyPolicy::Original();
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("LoadTarget.key_policy: unknown value ", proto.key_policy()));
  }
  target.include_keys.assign(proto.include_keys().begin(), proto.include_keys().end());
  target.include_prefixes.assign(proto.include_prefixes().begin(), proto.include_prefixes().end());
  target.include_optimizer = proto.include_optimizer_state();
  target.include_scheduler = proto.include_scheduler_state();
  target.include_extra = proto.include_extra_state();
  return target;
}

v1::LoadTarget LoadTargetToProto(const LoadTarget& target) {
  v1::LoadTarget proto;
  proto.set_device(target.device.ToString());
  if (target.dtype.floating_target().has_value()) {
    proto.set_cast_floating_to(static_cast<v1::DType>(*target.dtype.floating_target()));
  }
  switch (target.keys.kind()) {
    case KeyPolicy::Kind::kCanonical:
      proto.set_key_policy(v1::KEY_POLICY_CANONICAL);
      break;
    case KeyPolicy::Kind::kAddPrefix:
      proto.set_key_policy(v1::KEY_POLICY_ADD_PREFIX);
      proto.set_key_prefix(target.keys.prefix());
      break;
    case KeyPolicy::Kind::kOriginal:
      proto.set_key_policy(v1::KEY_POLICY_ORIGINAL);
      break;
  }
  for (const std::string& key : target.include_keys) proto.add_include_keys(key);
  for (const std::string& prefix : target.include_prefixes) proto.add_include_prefixes(prefix);
  proto.set_include_optimizer_state(target.include_optimizer);
  proto.set_include_scheduler_state(target.include_scheduler);
  proto.set_include_extra_state(target.include_extra);
  return proto;
}

}  // namespace ckpt
