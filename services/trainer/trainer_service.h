#ifndef CKPT_SERVICES_TRAINER_TRAINER_SERVICE_H_
#define CKPT_SERVICES_TRAINER_TRAINER_SERVICE_H_

// TrainerService: the ckpt.v1.Trainer gRPC API of a running trainer (served by rank 0 with
// --control_listen). A thin adapter over libs/train's TrainerControl:
//   GetStatus      the loop's last published status;
//   CheckpointNow  blocks until a checkpoint taken at the next step boundary is committed;
//   Stop           stops after the current step (checkpoint first unless skip_checkpoint) and
//                  returns the final version.
// Blocking calls honour the client's deadline (capped at `max_wait`). Every call is checked by
// the AccessPolicy: GetStatus needs the reader role, CheckpointNow and Stop the writer role.
//
// Thread-safety: gRPC calls it from its threads; TrainerControl is thread-safe.

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "libs/auth/access_policy.h"
#include "libs/train/trainer_control.h"
#include "proto/ckpt/v1/trainer.grpc.pb.h"

namespace ckpt {

class TrainerService final : public v1::Trainer::Service {
 public:
  TrainerService(train::TrainerControl* control, std::shared_ptr<const AccessPolicy> access,
                 absl::Duration max_wait = absl::Hours(1));

  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::TrainerStatus* response) override;
  grpc::Status CheckpointNow(grpc::ServerContext* context, const v1::CheckpointNowRequest* request,
                             v1::CheckpointNowResponse* response) override;
  grpc::Status Stop(grpc::ServerContext* context, const v1::StopRequest* request,
                    v1::StopResponse* response) override;

 private:
  absl::Duration WaitBudget(const grpc::ServerContext& context) const;

  train::TrainerControl* const control_;
  // OK when the caller may call `method`.
  absl::Status Authorize(const grpc::ServerContext& context, absl::string_view method) const;

  const std::shared_ptr<const AccessPolicy> access_;
  const absl::Duration max_wait_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICES_TRAINER_TRAINER_SERVICE_H_
