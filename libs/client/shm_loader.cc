#include "libs/client/shm_loader.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/from_blob.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "libs/io/prefault.h"
#include "libs/loader/load_target.h"
#include "libs/loader/stream_digest.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {
namespace {

// A private mapping of part of a passed file; unmapped when the last tensor on it goes.
class Mapping {
 public:
  Mapping(void* base, size_t length) : base_(base), length_(length) {}
  ~Mapping() { munmap(base_, length_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return static_cast<char*>(base_); }

 private:
  void* const base_;
  const size_t length_;
};

void LogToStderr(absl::string_view line) { std::cerr << line << "\n"; }

// The peer's uid must be ours, root's or one the options trust: the answer decides every byte a
// consumer gets, and a socket path can be taken over by anyone who can write its directory.
absl::Status CheckServerUid(int socket_fd, const SharedMemoryLoaderOptions& options) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    return absl::InternalError(
        absl::StrCat("getsockopt(SO_PEERCRED) on '", options.socket_path, "': ", strerror(errno)));
  }
  if (peer.uid == getuid() || peer.uid == 0 ||
      std::find(options.trusted_server_uids.begin(), options.trusted_server_uids.end(), peer.uid) !=
          options.trusted_server_uids.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the process serving '", options.socket_path, "' runs as uid ", peer.uid,
      ", which this client does not trust (its own uid ", getuid(),
      ", root, or SharedMemoryLoaderOptions::trusted_server_uids): not loading from it"));
}

// One request, one answer (with its descriptors). UNAVAILABLE when the socket cannot be reached
// or breaks.
absl::Status Exchange(const SharedMemoryLoaderOptions& options, const v1::ShmRequest& request,
                      v1::ShmAnswer& answer, std::vector<UniqueFd>& fds) {
  const std::string& path = options.socket_path;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a usable Unix-domain socket path"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const std::string frame = request.SerializeAsString();
  if (frame.size() > kMaxShmRequestBytes) {
    // Busy-like: the gRPC loader takes requests this large.
    return absl::ResourceExhaustedError(absl::StrCat("a request of ", frame.size(),
                                                     " bytes is over the shared-memory socket's ",
                                                     kMaxShmRequestBytes));
  }
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket_fd.valid()) {
    return absl::InternalError(absl::StrCat("socket(AF_UNIX): ", strerror(errno)));
  }
  if (connect(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    // No file (another host, a loader without --shm_socket), nothing listening, or a mode
    // that shuts this uid out.
    return absl::UnavailableError(
        absl::StrCat("no shared-memory loader at '", path, "': connect: ", strerror(errno)));
  }
  RETURN_IF_ERROR(CheckServerUid(socket_fd.get(), options));
  RETURN_IF_ERROR(SetSocketTimeouts(socket_fd.get(), options.timeout));
  const auto broke = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("the shared-memory loader at '", path,
                                                    "': ", status.message()));
  };
  const absl::Status sent = SendFrame(socket_fd.get(), frame, {});
  if (!sent.ok() && !absl::IsUnavailable(sent)) return broke(sent);
  // A server that refuses this uid (or is at its connection limit) answers without reading the
  // request and closes, which can break the send: its answer is still there to read.
  std::string bytes;
  if (absl::Status received = ReceiveFrame(socket_fd.get(), kMaxShmFrameBytes, bytes, fds);
      !received.ok()) {
    return broke(sent.ok() ? received : sent);
  }
  if (!answer.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("the shared-memory loader at '", path,
                                            "' sent an answer that does not parse"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SharedMemoryLoader::Probe(const SharedMemoryLoaderOptions& options) {
  v1::ShmRequest hello;
  hello.set_hello(true);
  v1::ShmAnswer answer;
  std::vector<UniqueFd> fds;
  RETURN_IF_ERROR(Exchange(options, hello, answer, fds));
  if (answer.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedMemoryLoader>> SharedMemoryLoader::Connect(
    SharedMemoryLoaderOptions options, std::unique_ptr<Loader> grpc_loader) {
  if (grpc_loader == nullptr) {
    return absl::InvalidArgumentError(
        "SharedMemoryLoader needs the gRPC loader for Preflight, Export and fallback");
  }
  if (!options.log) options.log = LogToStderr;
  RETURN_IF_ERROR(Probe(options));
  return std::unique_ptr<SharedMemoryLoader>(
      new SharedMemoryLoader(std::move(options), std::move(grpc_loader)));
}

SharedMemoryLoader::SharedMemoryLoader(SharedMemoryLoaderOptions options,
                                       std::unique_ptr<Loader> grpc_loader)
    : options_(std::move(options)), grpc_loader_(std::move(grpc_loader)) {}

SharedMemoryLoaderCounters SharedMemoryLoader::counters() const {
  SharedMemoryLoaderCounters counters;
  counters.shm_loads = shm_loads_.load();
  counters.fallback_loads = fallback_loads_.load();
  counters.mapped_bytes = mapped_bytes_.load();
  return counters;
}

absl::StatusOr<LoadedState> SharedMemoryLoader::Load(const v1::VersionRef& ref,
                                                     const LoadTarget& target) const {
  // The device first: an unusable target fails before the loader is asked.
  RETURN_IF_ERROR(ResolveTorchDevice(target.device).status());
  v1::ShmRequest request;
  v1::LoadRequest& load = *request.mutable_load();
  *load.mutable_ref() = ref;
  *load.mutable_target() = LoadTargetToProto(target);
  load.set_send_digests(true);
  v1::ShmAnswer answer;
  std::vector<UniqueFd> fds;
  absl::Status exchanged = Exchange(options_, request, answer, fds);
  if (exchanged.ok() && answer.code() == static_cast<int>(absl::StatusCode::kResourceExhausted)) {
    exchanged = absl::ResourceExhaustedError(answer.message());  // busy: same as unreachable.
  }
  if (!exchanged.ok()) {
    // Unreachable, busy (at its connection limit) or too slow: the gRPC loader can serve it.
    // Anything else (a refused uid, a bad request) is the answer.
    if (!absl::IsUnavailable(exchanged) && !absl::IsResourceExhausted(exchanged) &&
        !absl::IsDeadlineExceeded(exchanged)) {
      return exchanged;
    }
    // Loads only read: the gRPC loader serves the same answer.
    if (!fallback_logged_.exchange(true)) {
      options_.log(absl::StrCat(exchanged.message(), "; loading over gRPC instead"));
    }
    fallback_loads_.fetch_add(1);
    return grpc_loader_->Load(ref, target);
  }
  if (answer.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  }
  ASSIGN_OR_RETURN(LoadedState state, Assemble(answer, fds, target));
  shm_loads_.fetch_add(1);
  return state;
}

absl::StatusOr<LoadedState> SharedMemoryLoader::Assemble(const v1::ShmAnswer& answer,
                                                         std::vector<UniqueFd>& fds,
                                                         const LoadTarget& target) const {
  const v1::Manifest& manifest = answer.manifest();
  const std::string where = FormatVersionRef(manifest.model(), manifest.version());
  const auto bad = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("the shared-memory answer for ", where, " is inconsistent: ", what));
  };
  if (answer.fd_count() != static_cast<int>(fds.size())) {
    return bad(absl::StrCat(fds.size(), " descriptors arrived, it names ", answer.fd_count()));
  }
  const int model_count = manifest.tensors_size();
  const int count = model_count + manifest.state_tensors_size();
  if (answer.tensors_size() != count) {
    return bad(absl::StrCat(answer.tensors_size(), " layouts for ", count, " tensors"));
  }
  const auto meta_at = [&](int i) -> const v1::TensorMeta& {
    return i < model_count ? manifest.tensors(i) : manifest.state_tensors(i - model_count);
  };
  // The extent each descriptor's tensors span, to map it once.
  std::vector<int64_t> low(fds.size(), std::numeric_limits<int64_t>::max());
  std::vector<int64_t> high(fds.size(), 0);
  for (int i = 0; i < count; ++i) {
    const v1::ShmTensorLayout& layout = answer.tensors(i);
    const v1::TensorMeta& meta = meta_at(i);
    if (layout.length() < 0 || layout.length() != meta.byte_length()) {
      return bad(absl::StrCat("tensor '", meta.key(), "' lies in ", layout.length(),
                              " bytes, its byte_length is ", meta.byte_length()));
    }
    if (layout.length() == 0) continue;
    if (layout.fd() < 0 || layout.fd() >= static_cast<int>(fds.size()) || layout.offset() < 0 ||
        layout.offset() > std::numeric_limits<int64_t>::max() - layout.length()) {
      return bad(absl::StrCat("tensor '", meta.key(), "' lies at descriptor ", layout.fd(),
                              " offset ", layout.offset()));
    }
    low[layout.fd()] = std::min(low[layout.fd()], layout.offset());
    high[layout.fd()] = std::max(high[layout.fd()], layout.offset() + layout.length());
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  std::vector<std::shared_ptr<Mapping>> mappings(fds.size());
  std::vector<int64_t> mapped_from(fds.size(), 0);
  for (size_t k = 0; k < fds.size(); ++k) {
    if (high[k] == 0) continue;
    struct stat file;
    if (fstat(fds[k].get(), &file) != 0) {
      return absl::InternalError(absl::StrCat("fstat of a passed descriptor: ", strerror(errno)));
    }
    // Bytes past the end of a file mapping are SIGBUS on first touch: refused here.
    if (file.st_size < high[k]) {
      return bad(absl::StrCat("descriptor ", k, " holds ", file.st_size,
                              " bytes, its tensors reach byte ", high[k]));
    }
    const int64_t start = low[k] / page * page;
    const size_t length = static_cast<size_t>(high[k] - start);
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fds[k].get(), start);
    if (base == MAP_FAILED) {
      return absl::InternalError(
          absl::StrCat("mapping ", length, " bytes of a passed descriptor: ", strerror(errno)));
    }
    mappings[k] = std::make_shared<Mapping>(base, length);
    mapped_from[k] = start;
    fds[k].Reset();  // the mapping keeps the file.
  }
  std::vector<at::Tensor> tensors(count);
  const bool on_cpu = target.device.type == "cpu";
  int64_t mapped_bytes = 0;
  for (int i = 0; i < count; ++i) {
    const v1::ShmTensorLayout& layout = answer.tensors(i);
    const v1::TensorMeta& meta = meta_at(i);
    ASSIGN_OR_RETURN(const DType dtype, DTypeFromProto(meta.dtype()));
    ASSIGN_OR_RETURN(const c10::ScalarType scalar_type, ToScalarType(dtype));
    // A sparse tensor arrives as its parts' bytes and is rebuilt once they are checked.
    const std::vector<int64_t> shape =
        meta.has_sparse() ? std::vector<int64_t>{meta.byte_length()}
                          : std::vector<int64_t>(meta.shape().begin(), meta.shape().end());
    const at::TensorOptions options =
        at::TensorOptions().dtype(meta.has_sparse() ? at::kByte : scalar_type);
    ASSIGN_OR_RETURN(ReceivedTensorCheck check, ReceivedTensorCheck::Create(meta, where));
    at::Tensor tensor;
    if (layout.length() == 0) {
      RETURN_IF_ERROR(CatchTorchErrors([&] { tensor = at::empty(shape, options); }));
    } else {
      const std::shared_ptr<Mapping>& mapping = mappings[layout.fd()];
      char* data = mapping->data() + (layout.offset() - mapped_from[layout.fd()]);
      // Hashing touches every page: mapped in one call, not a fault per 4 KiB.
      PrefaultForRead(data, static_cast<size_t>(layout.length()));
      RETURN_IF_ERROR(check.Add(absl::string_view(data, layout.length())));
      RETURN_IF_ERROR(CatchTorchErrors([&] {
        tensor = at::from_blob(
            data, shape, [owner = mapping](void*) mutable { owner.reset(); }, options);
      }));
      mapped_bytes += layout.length();
    }
    if (static_cast<int64_t>(tensor.nbytes()) != meta.byte_length()) {
      return bad(absl::StrCat("tensor '", meta.key(), "': byte_length ", meta.byte_length(),
                              " disagrees with its dtype and shape (", tensor.nbytes(), " bytes)"));
    }
    ASSIGN_OR_RETURN(const bool by_chunks, check.Complete());
    if (!by_chunks) {
      if (!layout.has_digest()) {
        return bad(absl::StrCat("tensor '", meta.key(), "' has neither chunk refs nor a digest"));
      }
      RETURN_IF_ERROR(check.CheckDigest(layout.digest()));
    }
    if (meta.has_sparse()) {
      ASSIGN_OR_RETURN(tensor, SparseTensorFromBytes(
                                   meta, absl::string_view(static_cast<const char*>(tensor.data_ptr()),
                                                           tensor.nbytes())));
    }
    if (!on_cpu) {
      ASSIGN_OR_RETURN(tensor, PlaceTensor(tensor, target.device, DTypePolicy::Keep()));
    }
    tensors[i] = std::move(tensor);
  }
  mapped_bytes_.fetch_add(mapped_bytes);

  LoadedState state;
  for (int i = 0; i < model_count; ++i) {
    RETURN_IF_ERROR(state.model.Insert(manifest.tensors(i).key(), std::move(tensors[i]),
                                       manifest.tensors(i).original_device()));
  }
  absl::flat_hash_map<std::string, int> state_index;
  for (int j = 0; j < manifest.state_tensors_size(); ++j) {
    state_index.emplace(manifest.state_tensors(j).key(), model_count + j);
  }
  const auto resolve = [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
    auto it = state_index.find(std::string(key));
    if (it == state_index.end()) {
      return absl::DataLossError(absl::StrCat(where, ": value tree references state tensor '", key,
                                              "', which the manifest lacks"));
    }
    return tensors[it->second];
  };
  if (manifest.has_optimizer_state()) {
    ASSIGN_OR_RETURN(state.optimizer, ValueFromProto(manifest.optimizer_state(), resolve));
  }
  if (manifest.has_scheduler_state()) {
    ASSIGN_OR_RETURN(state.scheduler, ValueFromProto(manifest.scheduler_state(), resolve));
  }
  state.manifest = manifest;
  return state;
}

absl::StatusOr<PreflightReport> SharedMemoryLoader::Preflight(
    const v1::VersionRef& ref, const std::vector<ExpectedTensor>& expected,
    const LoadTarget& target) const {
  return grpc_loader_->Preflight(ref, expected, target);
}

absl::StatusOr<ExportResult> SharedMemoryLoader::Export(const v1::VersionRef& ref,
                                                        const ExportOptions& options,
                                                        const std::string& path) const {
  return grpc_loader_->Export(ref, options, path);
}

absl::StatusOr<std::unique_ptr<Loader>> OpenLoaderClient(const LoaderClientOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteLoader> remote, RemoteLoader::Connect(options));
  if (options.shm_socket.empty()) return remote;
  SharedMemoryLoaderOptions shm;
  shm.socket_path = options.shm_socket;
  shm.timeout = options.shm_timeout;
  shm.log = options.log ? options.log : LogToStderr;
  if (absl::Status probed = SharedMemoryLoader::Probe(shm); !probed.ok()) {
    shm.log(absl::StrCat("shared-memory loading is off (", probed.message(),
                         "); loading over gRPC from ", remote->address()));
    return std::unique_ptr<Loader>(std::move(remote));
  }
  return std::unique_ptr<Loader>(new SharedMemoryLoader(std::move(shm), std::move(remote)));
}

}  // namespace ckpt
