#include "services/trainer/trainer_service.h"

#include <algorithm>
#include <utility>

#include "libs/status/grpc_status.h"

namespace ckpt {

TrainerService::TrainerService(train::TrainerControl* control,
                               std::shared_ptr<const AccessPolicy> access, absl::Duration max_wait)
    : control_(control),
      access_(AccessPolicy::Resolve(std::move(access), "")),
      max_wait_(max_wait) {}

absl::Status TrainerService::Authorize(const grpc::ServerContext& context,
                                       absl::string_view method) const {
  return access_->Check(context, "trainer", method, "").status();
}

absl::Duration TrainerService::WaitBudget(const grpc::ServerContext& context) const {
  const absl::Time deadline = absl::FromChrono(context.deadline());
  return std::min(max_wait_, std::max(absl::ZeroDuration(), deadline - absl::Now()));
}

grpc::Status TrainerService::GetStatus(grpc::ServerContext* context,
                                       const v1::GetStatusRequest* request,
                                       v1::TrainerStatus* response) {
  if (absl::Status auth = Authorize(*context, "GetStatus"); !auth.ok()) return ToGrpcStatus(auth);
  *response = control_->status();
  return grpc::Status::OK;
}

grpc::Status TrainerService::CheckpointNow(grpc::ServerContext* context,
                                           const v1::CheckpointNowRequest* request,
                                           v1::CheckpointNowResponse* response) {
  if (absl::Status auth = Authorize(*context, "CheckpointNow"); !auth.ok()) {
    return ToGrpcStatus(auth);
  }
  absl::StatusOr<v1::VersionRef> version = control_->CheckpointNow(WaitBudget(*context));
  if (!version.ok()) return ToGrpcStatus(version.status());
  *response->mutable_version() = *std::move(version);
  return grpc::Status::OK;
}

grpc::Status TrainerService::Stop(grpc::ServerContext* context, const v1::StopRequest* request,
                                  v1::StopResponse* response) {
  if (absl::Status auth = Authorize(*context, "Stop"); !auth.ok()) return ToGrpcStatus(auth);
  absl::StatusOr<std::optional<v1::VersionRef>> final_version =
      control_->Stop(request->skip_checkpoint(), WaitBudget(*context));
  if (!final_version.ok()) return ToGrpcStatus(final_version.status());
  if (final_version->has_value()) *response->mutable_final_version() = **final_version;
  return grpc::Status::OK;
}

}  // namespace ckpt
