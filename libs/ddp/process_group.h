#ifndef CKPT_LIBS_DDP_PROCESS_GROUP_H_
#define CKPT_LIBS_DDP_PROCESS_GROUP_H_

// Rendezvous over c10d: joining a process group the way torchrun-launched PyTorch does.
//
// libs/ddp depends on LibTorch only (it also builds with CMake against a pip PyTorch), so errors
// are thrown as c10::Error with a message that names what was expected and what was found;
// callers at a ckpt library boundary convert with ckpt::CatchTorchErrors (libs/status).
//
// Example (every rank runs this; rank 0 hosts the TCPStore):
//   ckpt::ddp::RendezvousOptions options;
//   options.master_port = 29500;
//   options.rank = rank;
//   options.world_size = 2;
//   ckpt::ddp::ProcessGroupHandle pg = ckpt::ddp::InitProcessGroup(options);
//   std::string run_id = pg.comm.BroadcastString(MakeRunId());
//   double mean_loss = pg.comm.AllReduceMean(local_loss);
//
// Every collective goes through pg.comm (libs/ddp/communicator.h), which puts its tensors on the
// group's device.

#include <chrono>
#include <optional>
#include <string>

#include "c10/core/DeviceType.h"
#include "c10/util/intrusive_ptr.h"
#include "libs/ddp/communicator.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace ckpt::ddp {

struct RendezvousOptions {
  // Host of rank 0's TCPStore server. A loopback address also makes Gloo use loopback.
  std::string master_addr = "127.0.0.1";
  // TCP port rank 0 listens on (the TCPStore server). 0 (the OS picks) is allowed only for
  // world_size 1, since the other ranks could not know the port.
  int master_port = 29500;
  // This process's rank in [0, world_size).
  int rank = 0;
  // Number of processes in the group, >= 1.
  int world_size = 1;
  // "gloo" (CPU or CUDA tensors) or "nccl" (CUDA tensors; only in a build with NCCL).
  std::string backend = "gloo";
  // Where this rank computes and its collectives run: the CPU, or CUDA device cuda:<local_rank>
  // (required by "nccl"). With CUDA, InitProcessGroup makes that device current first.
  c10::DeviceType device_type = c10::DeviceType::CPU;
  // This process's index among the ranks on its node (torchrun's LOCAL_RANK); -1: same as rank.
  int local_rank = -1;
  // Bound on the rendezvous (all ranks connecting) and on every collective.
  std::chrono::milliseconds timeout{60000};
};

// A joined process group. Copyable; the store and the group live while any copy does.
struct ProcessGroupHandle {
  c10::intrusive_ptr<c10d::Store> store;  // the TCPStore
  // The group and its device (cpu, or cuda:<local_rank>): the only way to issue collectives.
  Communicator comm;
  int rank = 0;
  int world_size = 1;
  std::string backend;
};

// Joins the group described by `options`: with CUDA, makes cuda:<local_rank> the current device
// (as torch.cuda.set_device); then rank 0 starts the TCPStore server, every rank connects and the
// backend connects all ranks to each other. Blocks until all world_size ranks have joined or
// options.timeout passes. Throws c10::Error for invalid options (bad rank, port, backend; "nccl"
// in a build without NCCL or without CUDA; a local rank with no GPU of its own) and when the
// rendezvous fails or times out.
ProcessGroupHandle InitProcessGroup(const RendezvousOptions& options);

// Reads the torchrun environment: MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500),
// WORLD_SIZE, RANK, and LOCAL_RANK (default RANK). Returns nullopt when RANK or WORLD_SIZE is
// unset (not a distributed launch); throws c10::Error when a variable is set but malformed (not
// an integer, out of range, RANK >= WORLD_SIZE).
std::optional<RendezvousOptions> RendezvousOptionsFromEnvironment();

// The device a rank of `options` computes on: cpu, or cuda:<local_rank>.
c10::Device RankDevice(const RendezvousOptions& options);

}  // namespace ckpt::ddp

#endif  // CKPT_LIBS_DDP_PROCESS_GROUP_H_
