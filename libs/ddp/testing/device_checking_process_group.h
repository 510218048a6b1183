#ifndef CKPT_LIBS_DDP_TESTING_DEVICE_CHECKING_PROCESS_GROUP_H_
#define CKPT_LIBS_DDP_TESTING_DEVICE_CHECKING_PROCESS_GROUP_H_

// CPU tests that fail where a real NCCL group would: a collective handed a tensor that did not
// go to the group's device.
//
// On a CPU-only build every tensor lives on the CPU, so comparing devices proves nothing: today's
// code and code that forgets to move a tensor to cuda:<local rank> look the same. This wrapper
// keeps the tensors on the CPU but tracks which of them were placed for a declared device:
//   - its TensorPlacement (given to the Communicator) "moves" a tensor to the declared device by
//     copying it into fresh CPU memory that it records as placed (a tensor already placed is
//     returned as it is, as Tensor::to returns a tensor already on the device);
//   - the process group it wraps around a real one (Gloo) refuses every collective on a tensor
//     whose memory was not placed that way, with an error naming the device, as NCCL refuses a
//     CPU tensor. Views of placed tensors (narrow, view) share their memory and pass.
// So code that builds a collective's tensor itself (group.allreduce on a fresh at::tensor), or
// writes into a placed copy expecting the original to change, fails here as it would on a GPU.
//
// Example (each rank of a test):
//   ProcessGroupHandle pg = testing::WithDeclaredDevice(InitProcessGroup(options),
//                                                       at::Device(at::kCUDA, pg.rank));
//   DistributedDataParallel ddp(model, pg.comm);  // CPU model; collectives checked

#include "c10/core/Device.h"
#include "libs/ddp/process_group.h"

namespace ckpt::ddp::testing {

// `handle` with its communicator's group wrapped (collectives refuse unplaced tensors) and its
// placement declaring `declared` (e.g. cuda:1) while keeping tensors on the CPU.
ProcessGroupHandle WithDeclaredDevice(ProcessGroupHandle handle, c10::Device declared);

}  // namespace ckpt::ddp::testing

#endif  // CKPT_LIBS_DDP_TESTING_DEVICE_CHECKING_PROCESS_GROUP_H_
