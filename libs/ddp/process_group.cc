#include "libs/ddp/process_group.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "c10/util/Exception.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "torch/csrc/distributed/c10d/Types.hpp"
#include "torch/version.h"

// USE_C10D_GLOO (Bazel always; CMake when Gloo's headers compile against this LibTorch: a pip
// wheel ships none, and Debian's older ones may not fit its ProcessGroupGloo.hpp) declares
// ProcessGroupGloo. Without it this build has NCCL only, and asking for gloo says so.
#ifdef USE_C10D_GLOO
#define CKPT_DDP_HAVE_GLOO 1
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#endif

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

#ifdef CKPT_DDP_HAVE_GLOO
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
#endif  // CKPT_DDP_HAVE_GLOO

#if TORCH_VERSION_MAJOR >= 2
// From PyTorch 2.0, Gloo and NCCL are c10d::Backends and a c10d::ProcessGroup dispatches to the
// backend registered for a tensor's device type. (Not exercised by the Debian 1.13 build here;
// tools/gpu_check.sh builds this path against a pip PyTorch.)
c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, const std::string& name,
    std::chrono::milliseconds timeout, const std::vector<c10::DeviceType>& device_types,
    c10d::ProcessGroup::BackendType backend_type,
    const c10::intrusive_ptr<c10d::Backend>& backend) {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 6
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, world_size, c10::make_intrusive<c10d::ProcessGroup::Options>(name, timeout));
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(backend_type);
#endif
  for (const c10::DeviceType device_type : device_types) {
    group->setBackend(device_type, backend_type, backend);
  }
  return group;
}
#endif

c10::intrusive_ptr<c10d::ProcessGroup> MakeGloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                const RendezvousOptions& options) {
#ifndef CKPT_DDP_HAVE_GLOO
  TORCH_CHECK(false,
              "this build has no Gloo backend: the LibTorch it was built against came without "
              "Gloo headers that compile (tools/cmake reports it at configure time); use backend "
              "\"nccl\" with CUDA, or rebuild where libgloo-dev fits this LibTorch");
#else
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(GlooDevice(options.master_addr));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size,
                                                          gloo_options);
#if TORCH_VERSION_MAJOR >= 2
  // Gloo also moves CUDA tensors (through host memory) when the rank computes on a GPU.
  std::vector<c10::DeviceType> device_types = {c10::DeviceType::CPU};
  if (options.device_type == c10::DeviceType::CUDA) device_types.push_back(c10::DeviceType::CUDA);
  return WrapBackend(store, options.rank, options.world_size, "gloo", options.timeout, device_types,
                     c10d::ProcessGroup::BackendType::GLOO, gloo);
#else
  return gloo;
#endif
#endif  // CKPT_DDP_HAVE_GLOO
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
                     {c10::DeviceType::CUDA}, c10d::ProcessGroup::BackendType::NCCL, nccl);
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

// Makes cuda:<local rank> this process's current device before the group exists, as torchrun-
// launched PyTorch does with torch.cuda.set_device(local_rank): NCCL's communicators, streams and
// any tensor created without a device index then land on the rank's own GPU, not on GPU 0.
void UseRankCudaDevice(const RendezvousOptions& options, const c10::Device& device) {
  TORCH_CHECK(at::hasCUDA(),
              "device cuda requested, but this LibTorch has no CUDA (or no GPU is visible); "
              "build against a CUDA LibTorch (--config=cuda, docs/gpu.md, \"Building with CUDA (Bazel)\") or use "
              "device cpu with backend gloo");
  c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
  const int gpus = cuda.deviceCount();
  TORCH_CHECK(device.index() < gpus, "rank ", options.rank, " (local rank ", device.index(),
              ") needs its own GPU cuda:", static_cast<int>(device.index()), ", but only ", gpus,
              " CUDA device(s) are visible; start at most ", gpus,
              " ranks per node (NCCL cannot share one GPU between ranks)");
  cuda.setDevice(device);
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
  TORCH_CHECK(
      options.device_type == c10::DeviceType::CPU || options.device_type == c10::DeviceType::CUDA,
      "device must be cpu or cuda, got ", options.device_type);
  TORCH_CHECK(options.backend != "nccl" || options.device_type == c10::DeviceType::CUDA,
              "backend \"nccl\" moves only CUDA tensors; set the device to cuda (or use gloo)");
  TORCH_CHECK(options.local_rank >= -1, "local_rank must be >= 0 (or -1: the rank), got ",
              options.local_rank);
#ifndef CKPT_DDP_HAVE_NCCL
  // Fail before the rendezvous, so a misconfigured job does not first wait for its peers.
  if (options.backend == "nccl") MakeNccl(c10::intrusive_ptr<c10d::Store>(), options);
#endif

  const c10::Device device = RankDevice(options);
  if (device.is_cuda()) UseRankCudaDevice(options, device);

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
    handle.comm = Communicator(options.backend == "gloo" ? MakeGloo(handle.store, options)
                                                         : MakeNccl(handle.store, options),
                               device);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "creating the ", options.backend, " process group failed for ", where,
                " (timeout ", options.timeout.count(), " ms): ", e.what());
  }
  return handle;
}

c10::Device RankDevice(const RendezvousOptions& options) {
  if (options.device_type == c10::DeviceType::CPU) return c10::Device(c10::DeviceType::CPU);
  const int index = options.local_rank >= 0 ? options.local_rank : options.rank;
  return c10::Device(options.device_type, static_cast<c10::DeviceIndex>(index));
}

std::optional<RendezvousOptions> RendezvousOptionsFromEnvironment() {
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
  const char* local_text = std::getenv("LOCAL_RANK");
  options.local_rank = local_text == nullptr ? options.rank
                                             : ParseIntVariable("LOCAL_RANK", local_text, 0,
                                                                std::numeric_limits<int>::max());
  return options;
}

}  // namespace ckpt::ddp
