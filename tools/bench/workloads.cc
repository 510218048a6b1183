#include "tools/bench/workloads.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/full.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/format/torch_writer.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/checkpoint_contents.h"

namespace ckpt::bench {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// 23 random mantissa bits under exponent 0 give a float in [1, 2); shifting by 1.5 centres it.
float FloatFromBits(uint32_t bits) {
  const uint32_t pattern = 0x3F800000u | (bits >> 9);
  float value;
  std::memcpy(&value, &pattern, sizeof(value));
  return value - 1.5f;
}

absl::StatusOr<at::Tensor> RandomTensor(at::IntArrayRef shape, uint64_t seed) {
  ASSIGN_OR_RETURN(at::Tensor tensor,
                   CatchTorchErrors([&] { return at::empty(shape, at::kFloat); }));
  RETURN_IF_ERROR(FillRandom(tensor, seed));
  return tensor;
}

void CollectTensors(Workload& workload) {
  for (const StateDict::Entry& entry : workload.contents.model) {
    workload.tensors.push_back(entry.tensor);
  }
  if (workload.contents.optimizer.has_value()) {
    workload.contents.optimizer->ForEachTensor(
        [&](const std::string&, const at::Tensor& tensor) { workload.tensors.push_back(tensor); });
  }
  workload.bytes = 0;
  for (const at::Tensor& tensor : workload.tensors) workload.bytes += tensor.nbytes();
}

}  // namespace

absl::Status FillRandom(const at::Tensor& tensor, uint64_t seed) {
  if (tensor.scalar_type() != at::kFloat || !tensor.is_contiguous() || !tensor.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FillRandom wants a contiguous float32 CPU tensor, got ", tensor.toString()));
  }
  float* data = tensor.data_ptr<float>();
  const int64_t count = tensor.numel();
  uint64_t state = seed * 0xD1B54A32D192ED03ULL + 1;
  int64_t i = 0;
  for (; i + 1 < count; i += 2) {
    const uint64_t bits = SplitMix64(state);
    data[i] = FloatFromBits(static_cast<uint32_t>(bits));
    data[i + 1] = FloatFromBits(static_cast<uint32_t>(bits >> 32));
  }
  if (i < count) data[i] = FloatFromBits(static_cast<uint32_t>(SplitMix64(state)));
  return absl::OkStatus();
}

absl::StatusOr<Workload> MakeLargeWorkload(int64_t param_bytes) {
  constexpr int64_t kRows = 4096;
  constexpr int64_t kCols = 1024;
  const int64_t layers = std::max<int64_t>(1, param_bytes / (kRows * kCols * 4));
  Workload workload;
  workload.name = "large";
  std::vector<Value::Entry> state;
  std::vector<Value> param_ids;
  uint64_t seed = 1;
  int64_t index = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const std::pair<std::string, std::vector<int64_t>> params[] = {
        {absl::StrCat("layers.", layer, ".weight"), {kRows, kCols}},
        {absl::StrCat("layers.", layer, ".bias"), {kRows}},
    };
    for (const auto& [key, shape] : params) {
      ASSIGN_OR_RETURN(at::Tensor param, RandomTensor(shape, seed++));
      ASSIGN_OR_RETURN(at::Tensor exp_avg, RandomTensor(shape, seed++));
      ASSIGN_OR_RETURN(at::Tensor exp_avg_sq, RandomTensor(shape, seed++));
      RETURN_IF_ERROR(workload.contents.model.Insert(key, param));
      state.emplace_back(DictKey(index), Value::Dict({{"step", Value::Tensor(at::full({}, 100.0f))},
                                                      {"exp_avg", Value::Tensor(exp_avg)},
                                                      {"exp_avg_sq", Value::Tensor(exp_avg_sq)}}));
      param_ids.push_back(Value::Int(index));
      workload.contents.optimizer_param_names[index] = key;
      ++index;
    }
  }
  Value group = Value::Dict({
      {"lr", Value::Float(1e-3)},
      {"betas", Value::Tuple({Value::Float(0.9), Value::Float(0.999)})},
      {"eps", Value::Float(1e-8)},
      {"weight_decay", Value::Float(0)},
      {"amsgrad", Value::Bool(false)},
      {"maximize", Value::Bool(false)},
      {"foreach", Value::None()},
      {"capturable", Value::Bool(false)},
      {"params", Value::List(std::move(param_ids))},
  });
  workload.contents.optimizer = Value::Dict({{"state", Value::Dict(std::move(state))},
                                             {"param_groups", Value::List({std::move(group)})}});
  workload.python_root = Value::Dict({{"model", StateDictToValue(workload.contents.model)},
                                      {"optimizer", *workload.contents.optimizer}});
  CollectTensors(workload);
  return workload;
}

absl::StatusOr<Workload> MakeManySmallWorkload(int count) {
  Workload workload;
  workload.name = "many-small";
  std::mt19937_64 rng(42);
  // Element counts of 4 KiB .. 64 KiB of float32.
  std::uniform_int_distribution<int64_t> elements(1024, 16384);
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(at::Tensor tensor, RandomTensor({elements(rng)}, 1000 + i));
    RETURN_IF_ERROR(workload.contents.model.Insert(absl::StrCat("blocks.", i, ".weight"), tensor));
  }
  workload.python_root = StateDictToValue(workload.contents.model);
  CollectTensors(workload);
  return workload;
}

absl::StatusOr<Workload> MakeExportWorkload(int count, int64_t tensor_bytes) {
  constexpr int64_t kCols = 1024;
  const int64_t rows = std::max<int64_t>(1, tensor_bytes / (kCols * 4));
  Workload workload;
  workload.name = "export";
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(at::Tensor tensor, RandomTensor({rows, kCols}, 7000 + i));
    RETURN_IF_ERROR(workload.contents.model.Insert(absl::StrCat("layers.", i, ".weight"), tensor));
  }
  workload.python_root = StateDictToValue(workload.contents.model);
  CollectTensors(workload);
  return workload;
}

absl::StatusOr<FineTuneSeries> MakeFineTuneSeries(int64_t backbone_bytes, int64_t head_bytes,
                                                  int versions) {
  constexpr int64_t kCols = 1024;
  const int64_t layers = std::max<int64_t>(1, backbone_bytes / (kCols * kCols * 4));
  const int64_t head_rows = std::max<int64_t>(1, head_bytes / (kCols * 4));
  FineTuneSeries series;
  StateDict backbone;
  for (int64_t layer = 0; layer < layers; ++layer) {
    ASSIGN_OR_RETURN(at::Tensor weight, RandomTensor({kCols, kCols}, 5000 + layer));
    RETURN_IF_ERROR(backbone.Insert(absl::StrCat("backbone.", layer, ".weight"), weight));
  }
  series.backbone_bytes = backbone.TotalBytes();
  for (int v = 0; v < versions; ++v) {
    CheckpointContents contents;
    for (const StateDict::Entry& entry : backbone) {
      RETURN_IF_ERROR(contents.model.Insert(entry.key, entry.tensor));  // shared, not copied.
    }
    ASSIGN_OR_RETURN(at::Tensor head, RandomTensor({head_rows, kCols}, 9000 + v));
    RETURN_IF_ERROR(contents.model.Insert("head.weight", head));
    series.head_bytes = head.nbytes();
    contents.metadata.set_epoch(v);
    series.versions.push_back(std::move(contents));
  }
  return series;
}

absl::StatusOr<double> TimeLoopbackTcp(const Workload& workload,
                                       std::vector<at::Tensor>& destinations) {
  const auto error = [](absl::string_view what) {
    return absl::InternalError(
        absl::StrCat("loopback TCP baseline: ", what, ": ", std::strerror(errno)));
  };
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return error("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(listener);
    return error("bind/listen");
  }
  const int sender = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sender < 0 || connect(sender, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    if (sender >= 0) close(sender);
    close(listener);
    return error("connect");
  }
  const int receiver = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  close(listener);
  if (receiver < 0) {
    close(sender);
    return error("accept");
  }
  std::atomic<int> send_errno{0};
  const auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    for (const at::Tensor& tensor : workload.tensors) {
      const char* bytes = static_cast<const char*>(tensor.data_ptr());
      size_t left = tensor.nbytes();
      while (left > 0) {
        const ssize_t sent = send(sender, bytes, left, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) {
          send_errno.store(errno == 0 ? EPIPE : errno);
          return;
        }
        bytes += sent;
        left -= static_cast<size_t>(sent);
      }
    }
  });
  absl::Status received = absl::OkStatus();
  for (at::Tensor& destination : destinations) {
    char* bytes = static_cast<char*>(destination.data_ptr());
    size_t left = destination.nbytes();
    while (left > 0 && received.ok()) {
      const ssize_t got = recv(receiver, bytes, left, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        received = got == 0 ? absl::InternalError("loopback TCP baseline: the sender stopped early")
                            : error("recv");
        break;
      }
      bytes += got;
      left -= static_cast<size_t>(got);
    }
  }
  if (!received.ok()) shutdown(sender, SHUT_RDWR);  // unblocks the writer.
  writer.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(sender);
  close(receiver);
  RETURN_IF_ERROR(received);
  if (send_errno.load() != 0) {
    errno = send_errno.load();
    return error("send");
  }
  return seconds;
}

}  // namespace ckpt::bench
