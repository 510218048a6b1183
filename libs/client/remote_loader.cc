#include "libs/client/remote_loader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/io/atomic_file.h"
#include "libs/io/backoff.h"
#include "libs/io/prefault.h"
#include "libs/io/xxh3.h"
#include "libs/loader/loader_proto.h"
#include "libs/loader/stream_digest.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/tensor_data_message.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/status/torch_status.h"
#include "libs/store/version_ref.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"
#include "libs/tensor/side_stream_copies.h"
#include "libs/tensor/sparse_layout.h"
#include "libs/tensor/value_proto.h"

namespace ckpt {
namespace {

// A CPU tensor for `meta`'s dtype and shape, checked against its byte_length; in pinned memory
// when it goes on to an accelerator.
absl::StatusOr<at::Tensor> EmptyTensorFor(const v1::TensorMeta& meta, absl::string_view where,
                                          bool pinned) {
  if (meta.has_sparse()) {  // its parts' bytes, rebuilt into the sparse tensor when complete.
    return CatchTorchErrors([&] {
      return at::empty({meta.byte_length()}, at::TensorOptions().dtype(at::kByte));
    });
  }
  ASSIGN_OR_RETURN(const DType dtype, DTypeFromProto(meta.dtype()));
  ASSIGN_OR_RETURN(const c10::ScalarType scalar_type, ToScalarType(dtype));
  at::Tensor tensor;
  RETURN_IF_ERROR(CatchTorchErrors([&] {
    const std::vector<int64_t> shape(meta.shape().begin(), meta.shape().end());
    tensor = pinned ? EmptyPinned(shape, scalar_type)
                    : at::empty(shape, at::TensorOptions().dtype(scalar_type));
  }));
  if (static_cast<int64_t>(tensor.nbytes()) != meta.byte_length()) {
    return absl::DataLossError(
        absl::StrCat("tensor '", meta.key(), "' of ", where, ": byte_length ", meta.byte_length(),
                     " disagrees with its dtype and shape (", tensor.nbytes(), " bytes)"));
  }
  // Filled from the network next: large (freshly mapped) memory is mapped in one call rather
  // than a page fault per 4 KiB during the copies (libs/io/prefault.h).
  if (!pinned && meta.byte_length() >= (int64_t{1} << 20)) {
    PrefaultForWrite(tensor.data_ptr(), tensor.nbytes());
  }
  return tensor;
}

// The accelerator device tensors go to, with its index ("cuda" is the current CUDA device);
// nullopt for the CPU.
absl::StatusOr<std::optional<c10::Device>> AcceleratorOf(const DeviceSpec& spec) {
  ASSIGN_OR_RETURN(c10::Device device, ResolveTorchDevice(spec));
  if (device.is_cpu()) return std::optional<c10::Device>();
  if (device.has_index()) return std::optional<c10::Device>(device);
  return CatchTorchErrors([&] {
    return std::optional<c10::Device>(c10::impl::VirtualGuardImpl(device.type()).getDevice());
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteLoader>> RemoteLoader::Connect(
    const RemoteLoaderOptions& options) {
  if (options.streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote loader options: streams must be at least 1, got ", options.streams));
  }
  // Load and Export are streams the client restarts itself; Preflight only reads.
  ASSIGN_OR_RETURN(
      std::shared_ptr<ClientChannel> channel,
      ClientChannel::Open(options,
                          {std::string(v1::Loader::service_full_name()), "loader", {"Preflight"}}));
  return std::unique_ptr<RemoteLoader>(new RemoteLoader(std::move(channel), options.streams));
}

RemoteLoader::RemoteLoader(std::shared_ptr<ClientChannel> channel, int streams)
    : channel_(std::move(channel)),
      streams_(streams),
      stub_(v1::Loader::NewStub(channel_->channel())),
      load_method_(kLoadMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_->channel()) {}

RemoteLoaderCounters RemoteLoader::counters() const {
  RemoteLoaderCounters counters;
  counters.load_streams = load_streams_.load();
  counters.resumed_streams = resumed_streams_.load();
  counters.tensor_bytes = tensor_bytes_.load();
  return counters;
}

// One Load: the manifest the first stream served, and every tensor's buffer and check, shared by
// the load's streams (several at once, resumptions after one broke). Each tensor belongs to one
// stream at a time, so its slot is only touched by that stream's thread.
class RemoteLoader::LoadRun {
 public:
  LoadRun(const RemoteLoader& loader, const v1::VersionRef& ref, const LoadTarget& target,
          std::optional<c10::Device> accelerator)
      : loader_(loader),
        channel_(*loader.channel_),
        where_(FormatVersionRef(ref)),
        deadline_(absl::Now() + channel_.options().stream_deadline),
        target_(target),
        accelerator_(accelerator) {
    *request_.mutable_ref() = ref;
    *request_.mutable_target() = LoadTargetToProto(target);
    request_.set_send_digests(true);  // for the tensors the server casts.
  }

  absl::StatusOr<LoadedState> Run(int streams) {
    if (streams == 1) {
      // One stream for everything, as to any loader; only a resumption names tensors.
      RETURN_IF_ERROR(RunGroup(std::nullopt));
      return Assemble();
    }
    RETURN_IF_ERROR(RunGroup(std::vector<int>()));  // the manifest alone.
    std::vector<std::vector<int>> groups = Partition(streams);
    std::vector<absl::Status> results(groups.size());
    std::vector<std::thread> threads;
    for (size_t g = 1; g < groups.size(); ++g) {
      threads.emplace_back([&, g] { results[g] = RunGroupOrAbort(groups[g]); });
    }
    if (!groups.empty()) results[0] = RunGroupOrAbort(groups[0]);
    for (std::thread& thread : threads) thread.join();
    {
      absl::MutexLock lock(&mu_);
      if (!first_error_.ok()) return first_error_;
    }
    for (const absl::Status& result : results) RETURN_IF_ERROR(result);
    return Assemble();
  }

 private:
  // What one tensor of the load has received so far.
  struct Slot {
    at::Tensor cpu;     // the bytes as they arrive.
    at::Tensor placed;  // on target.device, once verified.
    int64_t received = 0;
    bool complete = false;
    bool verified = false;
    std::optional<ReceivedTensorCheck> check;
  };

  const v1::TensorMeta& MetaAt(int i) const {
    const v1::Manifest& manifest = *manifest_;
    return i < model_count_ ? manifest.tensors(i) : manifest.state_tensors(i - model_count_);
  }

  // Takes the first stream's manifest as the load's.
  absl::Status Adopt(v1::Manifest manifest) {
    manifest_ = std::move(manifest);
    model_count_ = manifest_->tensors_size();
    count_ = model_count_ + manifest_->state_tensors_size();
    slots_ = std::vector<Slot>(count_);
    version_ = FormatVersionRef(manifest_->model(), manifest_->version());
    // Every later stream asks for this version by number: an alias moved meanwhile must not
    // mix two versions in one state.
    request_.mutable_ref()->set_model(manifest_->model());
    request_.mutable_ref()->set_version(manifest_->version());
    if (accelerator_) {
      RETURN_IF_ERROR(
          CatchTorchErrors([&] { staging_ = std::make_unique<SideStreamCopies>(*accelerator_); }));
    }
    return absl::OkStatus();
  }

  // Buffers for tensors `indexes` that have none yet (in the thread of the stream receiving
  // them, so large ones are faulted in concurrently).
  absl::Status Allocate(const std::vector<int>& indexes) {
    for (int i : indexes) {
      if (slots_[i].cpu.defined() || slots_[i].verified) continue;
      ASSIGN_OR_RETURN(slots_[i].cpu, EmptyTensorFor(MetaAt(i), where_, staging_ != nullptr));
    }
    return absl::OkStatus();
  }

  // Groups of about equal bytes (largest tensor first into the lightest group), each in manifest
  // order; no empty group.
  std::vector<std::vector<int>> Partition(int streams) const {
    std::vector<int> order(count_);
    for (int i = 0; i < count_; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return MetaAt(a).byte_length() > MetaAt(b).byte_length();
    });
    std::vector<std::vector<int>> groups(std::min(streams, count_));
    std::vector<int64_t> bytes(groups.size(), 0);
    for (int i : order) {
      const size_t lightest = std::min_element(bytes.begin(), bytes.end()) - bytes.begin();
      groups[lightest].push_back(i);
      bytes[lightest] += MetaAt(i).byte_length();
    }
    for (std::vector<int>& group : groups) std::sort(group.begin(), group.end());
    return groups;
  }

  absl::Status Place(int i) {
    Slot& slot = slots_[i];
    if (MetaAt(i).has_sparse()) {
      ASSIGN_OR_RETURN(const at::Tensor sparse,
                       SparseTensorFromBytes(
                           MetaAt(i), absl::string_view(static_cast<const char*>(slot.cpu.data_ptr()),
                                                        slot.cpu.nbytes())));
      ASSIGN_OR_RETURN(slot.placed, PlaceTensor(sparse, target_.device, DTypePolicy::Keep()));
      slot.cpu = at::Tensor();
      slot.verified = true;
      return absl::OkStatus();
    }
    if (staging_) {
      absl::MutexLock lock(&staging_mu_);
      ASSIGN_OR_RETURN(slot.placed,
                       CatchTorchErrors([&] { return staging_->CopyToDevice(slot.cpu); }));
    } else {
      ASSIGN_OR_RETURN(slot.placed, PlaceTensor(slot.cpu, target_.device, DTypePolicy::Keep()));
    }
    slot.cpu = at::Tensor();  // PyTorch's pinned allocator keeps it until its copy is done.
    slot.verified = true;
    return absl::OkStatus();
  }

  // After tensor i's last byte: places it when its chunks verified it.
  absl::Status OnComplete(int i) {
    slots_[i].complete = true;
    ASSIGN_OR_RETURN(const bool by_chunks, slots_[i].check->Complete());
    if (!by_chunks) return absl::OkStatus();  // its TensorDigest comes next.
    return Place(i);
  }

  // A break worth resuming: the loader (or the way to it) went away.
  static bool Resumable(const absl::Status& status) { return absl::IsUnavailable(status); }

  // RunGroup, and the first error stops the load's other streams.
  absl::Status RunGroupOrAbort(const std::vector<int>& group) {
    absl::Status status = RunGroup(group);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (!aborted_) {
        aborted_ = true;
        first_error_ = status;
        for (grpc::ClientContext* context : active_) context->TryCancel();
      }
    }
    return status;
  }

  // Streams the tensors of `group` (every tensor when nullopt and no manifest yet) until all
  // are verified, resuming after breaks (see the header).
  absl::Status RunGroup(const std::optional<std::vector<int>>& group) {
    Backoff backoff = channel_.RetryBackoff(deadline_);
    int failures = 0;
    for (bool first = true;; first = false) {
      std::optional<std::vector<int>> only;
      if (group.has_value() || manifest_.has_value()) {
        only.emplace();
        if (group.has_value()) {
          for (int i : *group) {
            if (!slots_[i].verified) only->push_back(i);
          }
        } else {
          for (int i = 0; i < count_; ++i) {
            if (!slots_[i].verified) only->push_back(i);
          }
        }
        // Nothing left (a resumed group whose last tensor was verified as the stream broke).
        if (!first && only->empty() && manifest_.has_value()) return absl::OkStatus();
      }
      if (!first) loader_.resumed_streams_.fetch_add(1);
      bool progressed = false;
      absl::Status status = RunStream(only, &progressed);
      if (status.ok() || !Resumable(status)) return status;
      {
        absl::MutexLock lock(&mu_);
        if (aborted_) return status;
      }
      if (progressed) {
        failures = 0;
        backoff.Reset();
      } else {
        if (++failures > channel_.options().max_retries) return status;
        if (!backoff.Wait()) return status;
      }
      // A fleet's round-robin has dropped a loader whose connection broke; one loader must be
      // back first.
      RETURN_IF_ERROR(channel_.WaitUntilConnected(deadline_));
    }
  }

  // One Load stream for `only` (every tensor when nullopt). `progressed` is set once a tensor
  // was verified, which a resumption keeps.
  absl::Status RunStream(const std::optional<std::vector<int>>& only, bool* progressed) {
    v1::LoadRequest request = request_;
    if (only.has_value()) {
      request.mutable_only_tensors()->mutable_indexes()->Add(only->begin(), only->end());
    }
    std::unique_ptr<grpc::ClientContext> context = channel_.NewContext(deadline_);
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return absl::CancelledError("another stream of the load failed");
      active_.push_back(context.get());
    }
    loader_.load_streams_.fetch_add(1);
    // A raw reader, as generated stubs make theirs (there is no public way to read a server
    // stream as ByteBuffers synchronously): each message's bytes are copied once, from gRPC's
    // slices into their tensor (libs/rpc/tensor_data_message).
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channel_.channel().get(), loader_.load_method_, context.get(), request));
    std::optional<std::string> unverified;  // a tensor no checksum came for.
    std::vector<int> wanted;
    absl::Status received = Receive(*stream, only, progressed, &unverified, &wanted);
    absl::Status status;
    if (!received.ok()) {
      context->TryCancel();
      stream->Finish();
      status = received;
    } else {
      status = channel_.FromCall(stream->Finish());
    }
    {
      absl::MutexLock lock(&mu_);
      active_.erase(std::find(active_.begin(), active_.end(), context.get()));
    }
    RETURN_IF_ERROR(status);
    if (unverified.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", *unverified, "' of ", where_,
          " arrived with neither chunk refs nor a TensorDigest to check it by: the loader "
          "server predates checksums to the consumer; upgrade it"));
    }
    for (int i : wanted) {
      if (!slots_[i].verified) {
        return absl::DataLossError(
            absl::StrCat("the Load stream of ", where_, " ended before every tensor arrived"));
      }
    }
    return absl::OkStatus();
  }

  // Reads one stream. An error return cancels it; OK leaves the verdict to Finish and the
  // completeness check. `wanted` receives the tensors this stream was to send.
  absl::Status Receive(grpc::ClientReader<grpc::ByteBuffer>& stream,
                       const std::optional<std::vector<int>>& only, bool* progressed,
                       std::optional<std::string>* unverified, std::vector<int>* wanted) {
    grpc::ByteBuffer response;
    TensorDataResponseReader decoder;
    if (!stream.Read(&response)) return absl::OkStatus();  // Finish has the error.
    v1::Manifest manifest;
    absl::StatusOr<ResponsePart> first = decoder.Read<v1::LoadResponse>(response, &manifest);
    if (!first.ok() || *first != ResponsePart::kManifest) {
      return absl::DataLossError(
          absl::StrCat("the Load stream of ", where_, " did not start with a manifest",
                       first.ok() ? "" : absl::StrCat(": ", first.status().message())));
    }
    if (!manifest_.has_value()) {
      RETURN_IF_ERROR(Adopt(std::move(manifest)));
    } else if (!google::protobuf::util::MessageDifferencer::Equals(manifest, *manifest_)) {
      return absl::DataLossError(
          absl::StrCat("a Load stream of ", version_,
                       " served a manifest that differs from the first "
                       "stream's (loaders serving different stores, or the version changed)"));
    }
    if (only.has_value()) {
      *wanted = *only;
    } else {
      wanted->resize(count_);
      for (int i = 0; i < count_; ++i) (*wanted)[i] = i;
    }
    std::vector<bool> in_stream(count_, false);
    for (int i : *wanted) {
      if (i < 0 || i >= count_) {
        return absl::DataLossError(absl::StrCat("a resumed Load of ", version_,
                                                " names tensor index ", i, " of ", count_));
      }
      in_stream[i] = true;
      // Bytes of a tensor cut off by an earlier stream are received again from the first.
      Slot& slot = slots_[i];
      slot.received = 0;
      slot.complete = false;
      ASSIGN_OR_RETURN(slot.check, ReceivedTensorCheck::Create(MetaAt(i), version_));
    }
    RETURN_IF_ERROR(Allocate(*wanted));
    // Every byte is checked before its tensor is placed: against the store's chunk digests
    // when it travels as stored, else against the TensorDigest that follows its bytes.
    const auto outside = [&](int i) {
      return absl::DataLossError(absl::StrCat(
          "the Load stream of ", where_, " sent tensor index ", i, " of ", count_,
          ", which it was not asked for",
          only.has_value() ? " (a loader built before LoadRequest.only_tensors sends every "
                             "tensor: upgrade it, or load with one stream)"
                           : ""));
    };
    v1::Manifest second_manifest;
    while (stream.Read(&response)) {
      absl::StatusOr<ResponsePart> part =
          decoder.Read<v1::LoadResponse>(response, &second_manifest);
      if (!part.ok()) {
        return absl::DataLossError(absl::StrCat("the Load stream of ", where_,
                                                " sent a bad message: ", part.status().message()));
      }
      if (*part == ResponsePart::kNeither) {
        // A TensorDigest (the reader knows manifests and data only): small, parsed whole.
        v1::LoadResponse other;
        RETURN_IF_ERROR(ParseFromByteBuffer(response, "LoadResponse", &other));
        if (!other.has_digest()) {
          return absl::DataLossError(absl::StrCat(
              "the Load stream of ", where_, " sent a message with no part this client knows"));
        }
        const int i = other.digest().tensor_index();
        if (i < 0 || i >= count_ || slots_[i].verified) {
          return absl::DataLossError(absl::StrCat("the Load stream of ", where_,
                                                  " sent an unexpected TensorDigest for "
                                                  "tensor index ",
                                                  i, " of ", count_));
        }
        if (!in_stream[i]) return outside(i);
        if (!slots_[i].complete && MetaAt(i).byte_length() == 0) RETURN_IF_ERROR(OnComplete(i));
        RETURN_IF_ERROR(slots_[i].check->CheckDigest(other.digest()));
        RETURN_IF_ERROR(Place(i));
        *progressed = true;
        continue;
      }
      if (*part != ResponsePart::kData) {
        return absl::DataLossError(
            absl::StrCat("the Load stream of ", where_, " sent a second manifest"));
      }
      const TensorDataView& data = decoder.data();
      const int i = data.tensor_index;
      if (i < 0 || i >= count_) {
        return absl::DataLossError(absl::StrCat("the Load stream of ", where_,
                                                " sent bytes of tensor index ", i, " of ", count_));
      }
      if (!in_stream[i] || slots_[i].verified) return outside(i);
      Slot& slot = slots_[i];
      const v1::TensorMeta& meta = MetaAt(i);
      if (data.offset != slot.received || data.offset + data.size > meta.byte_length()) {
        return absl::DataLossError(
            absl::StrCat("the Load stream of ", where_, " sent bytes ", data.offset, "..",
                         data.offset + data.size, " of tensor '", meta.key(), "' (",
                         meta.byte_length(), " bytes) after ", slot.received));
      }
      char* destination = static_cast<char*>(slot.cpu.data_ptr()) + data.offset;
      for (absl::string_view piece : data.pieces) {
        RETURN_IF_ERROR(slot.check->Add(piece));
        std::memcpy(destination, piece.data(), piece.size());
        destination += piece.size();
      }
      slot.received += data.size;
      loader_.tensor_bytes_.fetch_add(data.size, std::memory_order_relaxed);
      if (slot.received == meta.byte_length()) {
        RETURN_IF_ERROR(OnComplete(i));
        if (slots_[i].verified) *progressed = true;
      }
    }
    for (int i : *wanted) {
      Slot& slot = slots_[i];
      // An incomplete stream: Finish says why (a server error, the deadline), else DATA_LOSS.
      if (slot.received != MetaAt(i).byte_length()) return absl::OkStatus();
      if (!slot.complete) RETURN_IF_ERROR(OnComplete(i));  // tensors of zero bytes.
      if (!slot.verified && MetaAt(i).byte_length() == 0) {
        // Zero bytes sent as stored: no chunk refs and no digest, and nothing to damage (a cast
        // one's TensorDigest, had it come, came before the stream ended).
        RETURN_IF_ERROR(Place(i));
      }
      if (!slot.verified) {
        // Finish may say why (the stream broke before the digest); else the server is one
        // that sends no checksums, and its bytes are not taken unchecked.
        *unverified = MetaAt(i).key();
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  // The LoadedState of every verified tensor.
  absl::StatusOr<LoadedState> Assemble() {
    if (!manifest_.has_value() || manifest_->model().empty()) {
      return absl::DataLossError(
          absl::StrCat("the Load stream of ", where_, " ended before every tensor arrived"));
    }
    for (int i = 0; i < count_; ++i) {
      if (!slots_[i].verified) {
        return absl::DataLossError(
            absl::StrCat("the Load of ", where_, " ended without tensor '", MetaAt(i).key(), "'"));
      }
    }
    // The caller's stream (the device's current one) may use the tensors from here on.
    if (staging_) RETURN_IF_ERROR(CatchTorchErrors([&] { staging_->OrderBeforeCurrentStream(); }));
    LoadedState state;
    const v1::Manifest& manifest = *manifest_;
    for (int i = 0; i < model_count_; ++i) {
      RETURN_IF_ERROR(state.model.Insert(manifest.tensors(i).key(), std::move(slots_[i].placed),
                                         manifest.tensors(i).original_device()));
    }
    absl::flat_hash_map<std::string, int> state_index;
    for (int j = 0; j < manifest.state_tensors_size(); ++j) {
      state_index.emplace(manifest.state_tensors(j).key(), model_count_ + j);
    }
    const auto resolve = [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
      auto it = state_index.find(std::string(key));
      if (it == state_index.end()) {
        return absl::DataLossError(absl::StrCat(where_, ": value tree references state tensor '",
                                                key, "', which the manifest lacks"));
      }
      return slots_[it->second].placed;
    };
    if (manifest.has_optimizer_state()) {
      ASSIGN_OR_RETURN(state.optimizer, ValueFromProto(manifest.optimizer_state(), resolve));
    }
    if (manifest.has_scheduler_state()) {
      ASSIGN_OR_RETURN(state.scheduler, ValueFromProto(manifest.scheduler_state(), resolve));
    }
    state.manifest = *std::move(manifest_);
    return state;
  }

  const RemoteLoader& loader_;
  const ClientChannel& channel_;
  const std::string where_;
  const absl::Time deadline_;
  const LoadTarget target_;
  const std::optional<c10::Device> accelerator_;
  v1::LoadRequest request_;  // ref pinned to the version number once the manifest is in.
  // Set by the first stream (before any other runs), read-only after.
  std::optional<v1::Manifest> manifest_;
  std::string version_;  // "MODEL@N" of manifest_.
  int model_count_ = 0;
  int count_ = 0;
  std::vector<Slot> slots_;
  // For an accelerator: each tensor is received into pinned memory and copied on a side stream
  // as soon as it is verified, overlapping with receiving the next ones.
  std::unique_ptr<SideStreamCopies> staging_;
  absl::Mutex staging_mu_;
  absl::Mutex mu_;
  std::vector<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);  // streams in flight.
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<LoadedState> RemoteLoader::Load(const v1::VersionRef& ref,
                                               const LoadTarget& target) const {
  // An unusable device fails here, before the server streams a byte.
  ASSIGN_OR_RETURN(const std::optional<c10::Device> accelerator, AcceleratorOf(target.device));
  LoadRun run(*this, ref, target, accelerator);
  return run.Run(streams_);
}

absl::StatusOr<PreflightReport> RemoteLoader::Preflight(const v1::VersionRef& ref,
                                                        const std::vector<ExpectedTensor>& expected,
                                                        const LoadTarget& target) const {
  v1::PreflightRequest request;
  *request.mutable_ref() = ref;
  *request.mutable_target() = LoadTargetToProto(target);
  ExpectedTensorsToProto(expected, *request.mutable_expected());
  v1::PreflightResponse response;
  RETURN_IF_ERROR(channel_->CallUnary("Preflight", channel_->options().deadline,
                                      [&](grpc::ClientContext* context) {
                                        response.Clear();
                                        return stub_->Preflight(context, request, &response);
                                      }));
  return PreflightReportFromProto(response);
}

absl::StatusOr<ExportResult> RemoteLoader::Export(const v1::VersionRef& ref,
                                                  const ExportOptions& options,
                                                  const std::string& path) const {
  if (options.max_shard_bytes > 0 || options.format == ExportFormat::kDcp) {
    // The loader's Export streams one file; a directory is written from the store (ExportToFile).
    return absl::InvalidArgumentError(
        "a remote loader exports one file: sharded safetensors (max_shard_bytes) and DCP "
        "directories need the store");
  }
  const auto& progress = options.progress;
  v1::ExportRequest request;
  *request.mutable_ref() = ref;
  *request.mutable_target() = LoadTargetToProto(options.target);
  request.set_format(ExportFormatToProto(options.format));
  const std::string where = FormatVersionRef(ref);
  ExportResult result;
  RETURN_IF_ERROR(channel_->RestartOnUnavailable(
      channel_->options().stream_deadline,
      [&](std::unique_ptr<grpc::ClientContext> context_owner) -> absl::Status {
        grpc::ClientContext& context = *context_owner;
        result = ExportResult();
        ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
        std::unique_ptr<grpc::ClientReader<v1::ExportResponse>> stream =
            stub_->Export(&context, request);
        v1::ExportResponse response;
        uint64_t total = 0;
        bool first = true;
        absl::Status received = absl::OkStatus();
        while (received.ok() && stream->Read(&response)) {
          if (first) {
            total = static_cast<uint64_t>(response.total_bytes());
            result.version = response.version().empty() ? where : response.version();
            result.left_out.assign(response.left_out().begin(), response.left_out().end());
            result.warnings.assign(response.warnings().begin(), response.warnings().end());
            first = false;
          }
          // Each piece is checked against the XXH3-64 the loader took as it sent it.
          const int64_t at = static_cast<int64_t>(out.bytes_written());
          const int64_t end = at + static_cast<int64_t>(response.data().size());
          if (!response.has_xxh3_64()) {
            received = absl::FailedPreconditionError(absl::StrCat(
                "the Export stream of ", where, " sent bytes ", at, "..", end,
                " of the file without a checksum: the loader server predates checksums to the "
                "consumer; upgrade it"));
            break;
          }
          if (response.offset() != at) {
            received = absl::DataLossError(absl::StrCat("the Export stream of ", where,
                                                        " sent bytes at offset ", response.offset(),
                                                        " after ", at, " bytes"));
            break;
          }
          if (const uint64_t digest = Xxh3(response.data()); digest != response.xxh3_64()) {
            received = absl::DataLossError(absl::StrFormat(
                "the Export stream of %s: file bytes %d..%d arrived with XXH3-64 %016x, the "
                "loader sent %016x: damaged between the loader and this client; %s was not "
                "written",
                where, at, end, digest, response.xxh3_64(), path));
            break;
          }
          received = out.Append(response.data());
          if (received.ok() && out.bytes_written() > total) {
            received =
                absl::DataLossError(absl::StrCat("the Export stream of ", where, " sent more ",
                                                 "than the ", total, " bytes it announced"));
          }
          if (received.ok() && progress) progress(out.bytes_written(), total);
        }
        if (!received.ok()) {
          context.TryCancel();
          stream->Finish();
          return received;
        }
        RETURN_IF_ERROR(channel_->FromCall(stream->Finish()));
        if (first || out.bytes_written() != total) {
          return absl::DataLossError(absl::StrCat("the Export stream of ", where, " ended after ",
                                                  out.bytes_written(), " of ", total, " bytes"));
        }
        RETURN_IF_ERROR(out.Commit());
        result.file_bytes = total;
        result.bundle = ExportWritesBundle(options);
        return absl::OkStatus();
      }));
  return result;
}

}  // namespace ckpt
