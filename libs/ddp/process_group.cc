#include "libs/ddp/process_group.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "c10/util/Exception.h"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "torch/csrc/distributed/c10d/Types.hpp"
#include "torch/version.h"

// A CUDA build of LibTorch defines USE_C10D_NCCL when c10d was built with NCCL; our Bazel CUDA
// config defines CKPT_WITH_NCCL. Either one means ProcessGroupNCCL is there to link against.
#if defined(CKPT_WITH_NCCL) || defined(USE_C10D_NCCL)
#define CKPT_DDP_HAVE_NCCL 1
#include "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
#endif

namespace ckpt::ddp {
namespace {

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Where Gloo listens for its peers. GLOO_SOCKET_IFNAME wins (as in PyTorch); a loopback master
// means a single-host job, so loopback works even on machines whose hostname does not resolve;
// otherwise the address the hostname resolves to, as torch.distributed does by default.
std::shared_ptr<::gloo::transport::Device> GlooDevice(const std::string& master_addr) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
      interface != nullptr && *interface != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (IsLoopback(master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

#if TORCH_VERSION_MAJOR >= 2
// From PyTorch 2.0, Gloo and NCCL are c10d::Backends and a c10d::ProcessGroup dispatches to the
// backend registered for a tensor's device type. (Not exercised by the Debian 1.13 build here;
// tools/gpu_check.sh builds this path against a pip PyTorch.)
c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, const std::string& name,
    std::chrono::milliseconds timeout, c10::DeviceType device_type,
    c10d::ProcessGroup::BackendType backend_type,
    const c10::intrusive_ptr<c10d::Backend>& backend) {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 6
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, world_size, c10::make_intrusive<c10d::ProcessGroup::Options>(name, timeout));
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(backend_type);
#endif
  group->setBackend(device_type, backend_type, backend);
  return group;
}
#endif

c10::intrusive_ptr<c10d::ProcessGroup> MakeGloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                const RendezvousOptions& options) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(GlooDevice(options.master_addr));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size,
                                                          gloo_options);
#if TORCH_VERSION_MAJOR >= 2
  return WrapBackend(store, options.rank, options.world_size, "gloo", options.timeout,
                     c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
#else
  return gloo;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> MakeNccl(const c10::intrusive_ptr<c10d::Store>& store,
                                                const RendezvousOptions& options) {
#ifdef CKPT_DDP_HAVE_NCCL
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options.rank, options.world_size,
                                                          nccl_options);
#if TORCH_VERSION_MAJOR >= 2
  return WrapBackend(store, options.rank, options.world_size, "nccl", options.timeout,
                     c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
#else
  return nccl;
#endif
#else
  TORCH_CHECK(false,
              "process group backend \"nccl\" requested, but this build has no NCCL; "
              "rebuild with --config=cuda (or use backend \"gloo\")");
#endif
}

// Parses a whole decimal integer in [min_value, max_value]; `name` is the variable for errors.
int ParseIntVariable(const char* name, const char* text, int min_value, int max_value) {
  TORCH_CHECK(text != nullptr && *text != '\0', "environment variable ", name,
              " is set but empty; expected an integer");
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK(errno == 0 && end != text && *end == '\0', "environment variable ", name, "=\"", text,
              "\" is not an integer");
  TORCH_CHECK(value >= min_value && value <= max_value, "environment variable ", name, "=", value,
              " is out of range; expected [", min_value, ", ", max_value, "]");
  return static_cast<int>(value);
}

at::TensorOptions CollectiveTensorOptions(const c10d::ProcessGroup& group) {
  // NCCL only moves CUDA tensors; a device without an index means the current CUDA device.
  if (group.getBackendName() == "nccl") return at::TensorOptions().device(at::kCUDA);
  return at::TensorOptions().device(at::kCPU);
}

}  // namespace

ProcessGroupHandle InitProcessGroup(const RendezvousOptions& options) {
  TORCH_CHECK(options.world_size >= 1, "world_size must be >= 1, got ", options.world_size);
  TORCH_CHECK(options.rank >= 0 && options.rank < options.world_size, "rank must be in [0, ",
              options.world_size, "), got ", options.rank);
  TORCH_CHECK(options.master_port >= 0 && options.master_port <= 65535,
              "master_port must be in [0, 65535], got ", options.master_port);
  TORCH_CHECK(options.master_port != 0 || options.world_size == 1,
              "master_port 0 (pick a free port) works only for world_size 1; with world_size ",
              options.world_size, " the other ranks need to know rank 0's port");
  TORCH_CHECK(options.backend == "gloo" || options.backend == "nccl",
              "unknown process group backend \"", options.backend,
              "\"; expected \"gloo\" or "
              "\"nccl\"");
  TORCH_CHECK(!options.master_addr.empty(), "master_addr is empty");
  TORCH_CHECK(options.timeout.count() > 0, "timeout must be positive, got ",
              options.timeout.count(), " ms");
#ifndef CKPT_DDP_HAVE_NCCL
  // Fail before the rendezvous, so a misconfigured job does not first wait for its peers.
  if (options.backend == "nccl") MakeNccl(c10::intrusive_ptr<c10d::Store>(), options);
#endif

  ProcessGroupHandle handle;
  handle.rank = options.rank;
  handle.world_size = options.world_size;
  handle.backend = options.backend;
  const std::string where = "rank " + std::to_string(options.rank) + " of " +
                            std::to_string(options.world_size) + " with master " +
                            options.master_addr + ":" + std::to_string(options.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(options.master_port);
    store_options.isServer = options.rank == 0;
    store_options.numWorkers = static_cast<std::size_t>(options.world_size);
    store_options.waitWorkers = true;
    store_options.timeout = options.timeout;
    handle.store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rendezvous failed for ", where, " (timeout ", options.timeout.count(),
                " ms): could not join the TCPStore: ", e.what());
  }
  try {
    handle.group = options.backend == "gloo" ? MakeGloo(handle.store, options)
                                             : MakeNccl(handle.store, options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "creating the ", options.backend, " process group failed for ", where,
                " (timeout ", options.timeout.count(), " ms): ", e.what());
  }
  return handle;
}

std::optional<RendezvousOptions> RendezvousOptionsFromEnvironment(int* local_rank) {
  const char* rank_text = std::getenv("RANK");
  const char* world_text = std::getenv("WORLD_SIZE");
  if (rank_text == nullptr || world_text == nullptr) return std::nullopt;
  RendezvousOptions options;
  options.world_size =
      ParseIntVariable("WORLD_SIZE", world_text, 1, std::numeric_limits<int>::max());
  options.rank = ParseIntVariable("RANK", rank_text, 0, std::numeric_limits<int>::max());
  TORCH_CHECK(options.rank < options.world_size, "environment variable RANK=", options.rank,
              " must be less than WORLD_SIZE=", options.world_size);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr) {
    TORCH_CHECK(*addr != '\0', "environment variable MASTER_ADDR is set but empty");
    options.master_addr = addr;
  }
  if (const char* port = std::getenv("MASTER_PORT"); port != nullptr) {
    options.master_port = ParseIntVariable("MASTER_PORT", port, 0, 65535);
  }
  if (local_rank != nullptr) {
    const char* local_text = std::getenv("LOCAL_RANK");
    *local_rank = local_text == nullptr ? options.rank
                                        : ParseIntVariable("LOCAL_RANK", local_text, 0,
                                                           std::numeric_limits<int>::max());
  }
  return options;
}

std::string BroadcastString(c10d::ProcessGroup& group, const std::string& value_on_root, int root) {
  TORCH_CHECK(root >= 0 && root < group.getSize(), "BroadcastString root must be in [0, ",
              group.getSize(), "), got ", root);
  const at::TensorOptions device = CollectiveTensorOptions(group);
  c10d::BroadcastOptions options;
  options.rootRank = root;
  // Two broadcasts: the length first, so every rank can size its receive buffer.
  const bool is_root = group.getRank() == root;
  std::vector<at::Tensor> length = {
      at::full({1}, is_root ? static_cast<int64_t>(value_on_root.size()) : int64_t{0},
               device.dtype(at::kLong))};
  group.broadcast(length, options)->wait();
  const int64_t size = length[0].cpu().item<int64_t>();
  if (size == 0) return std::string();
  at::Tensor bytes = at::empty({size}, at::TensorOptions().dtype(at::kByte));
  if (is_root) std::memcpy(bytes.data_ptr(), value_on_root.data(), value_on_root.size());
  std::vector<at::Tensor> payload = {bytes.to(device.device())};
  group.broadcast(payload, options)->wait();
  const at::Tensor received = payload[0].cpu().contiguous();
  return std::string(static_cast<const char*>(received.data_ptr()), static_cast<size_t>(size));
}

double AllReduceMean(c10d::ProcessGroup& group, double value) {
  std::vector<at::Tensor> tensors = {
      at::full({1}, value, CollectiveTensorOptions(group).dtype(at::kDouble))};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  group.allreduce(tensors, options)->wait();
  return tensors[0].cpu().item<double>() / group.getSize();
}

void Barrier(c10d::ProcessGroup& group) { group.barrier()->wait(); }

}  // namespace ckpt::ddp
