#include "libs/client/remote_loader.h"

#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "ATen/ATen.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/io/atomic_file.h"
#include "libs/io/prefault.h"
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
#include "libs/tensor/value_proto.h"

namespace ckpt {
namespace {

// A CPU tensor for `meta`'s dtype and shape, checked against its byte_length; in pinned memory
// when it goes on to an accelerator.
absl::StatusOr<at::Tensor> EmptyTensorFor(const v1::TensorMeta& meta, absl::string_view where,
                                          bool pinned) {
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
  // Load and Export are streams the client restarts itself; Preflight only reads.
  ASSIGN_OR_RETURN(
      std::shared_ptr<ClientChannel> channel,
      ClientChannel::Open(options,
                          {std::string(v1::Loader::service_full_name()), "loader", {"Preflight"}}));
  return std::unique_ptr<RemoteLoader>(new RemoteLoader(std::move(channel)));
}

RemoteLoader::RemoteLoader(std::shared_ptr<ClientChannel> channel)
    : channel_(std::move(channel)),
      stub_(v1::Loader::NewStub(channel_->channel())),
      load_method_(kLoadMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_->channel()) {}

absl::StatusOr<LoadedState> RemoteLoader::Load(const v1::VersionRef& ref,
                                               const LoadTarget& target) const {
  // An unusable device fails here, before the server streams a byte.
  ASSIGN_OR_RETURN(const std::optional<c10::Device> accelerator, AcceleratorOf(target.device));
  v1::LoadRequest request;
  *request.mutable_ref() = ref;
  *request.mutable_target() = LoadTargetToProto(target);
  request.set_send_digests(true);  // for the tensors the server casts.
  const std::string where = FormatVersionRef(ref);
  LoadedState state;
  RETURN_IF_ERROR(channel_->RestartOnUnavailable(
      channel_->options().stream_deadline,
      [&](std::unique_ptr<grpc::ClientContext> context_owner) -> absl::Status {
        grpc::ClientContext& context = *context_owner;
        state = LoadedState();
        // A raw reader, as generated stubs make theirs (there is no public way to read a server
        // stream as ByteBuffers synchronously): each message's bytes are copied once, from
        // gRPC's slices into their tensor (libs/rpc/tensor_data_message).
        std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream(
            grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
                channel_->channel().get(), load_method_, &context, request));
        grpc::ByteBuffer response;
        TensorDataResponseReader decoder;
        std::optional<std::string> unverified;  // a tensor no checksum came for.
        // Receives the stream; an early return cancels the call (TryCancel) before Finish.
        absl::Status received = [&]() -> absl::Status {
          if (!stream->Read(&response)) return absl::OkStatus();  // Finish has the error.
          absl::StatusOr<ResponsePart> first =
              decoder.Read<v1::LoadResponse>(response, &state.manifest);
          if (!first.ok() || *first != ResponsePart::kManifest) {
            return absl::DataLossError(
                absl::StrCat("the Load stream of ", where, " did not start with a manifest",
                             first.ok() ? "" : absl::StrCat(": ", first.status().message())));
          }
          const v1::Manifest& manifest = state.manifest;
          const int model_count = manifest.tensors_size();
          const int count = model_count + manifest.state_tensors_size();
          const auto meta_at = [&](int i) -> const v1::TensorMeta& {
            return i < model_count ? manifest.tensors(i) : manifest.state_tensors(i - model_count);
          };
          std::vector<at::Tensor> cpu(count);
          std::vector<at::Tensor> placed(count);
          std::vector<int64_t> received_bytes(count, 0);
          // For an accelerator: each tensor is received into pinned memory and copied on a side
          // stream as soon as its last byte is in, overlapping with receiving the next ones.
          std::unique_ptr<SideStreamCopies> staging;
          if (accelerator) {
            RETURN_IF_ERROR(CatchTorchErrors(
                [&] { staging = std::make_unique<SideStreamCopies>(*accelerator); }));
          }
          const auto place = [&](int i) -> absl::Status {
            if (staging) {
              ASSIGN_OR_RETURN(placed[i],
                               CatchTorchErrors([&] { return staging->CopyToDevice(cpu[i]); }));
            } else {
              ASSIGN_OR_RETURN(placed[i], PlaceTensor(cpu[i], target.device, DTypePolicy::Keep()));
            }
            cpu[i] = at::Tensor();  // PyTorch's pinned allocator keeps it until its copy is done.
            return absl::OkStatus();
          };
          for (int i = 0; i < count; ++i) {
            ASSIGN_OR_RETURN(cpu[i], EmptyTensorFor(meta_at(i), where, staging != nullptr));
          }
          // Every byte is checked before its tensor is placed: against the store's chunk digests
          // when it travels as stored, else against the TensorDigest that follows its bytes.
          const std::string version = FormatVersionRef(manifest.model(), manifest.version());
          std::vector<std::optional<ReceivedTensorCheck>> checks(count);
          std::vector<bool> complete(count, false);
          std::vector<bool> verified(count, false);
          for (int i = 0; i < count; ++i) {
            ASSIGN_OR_RETURN(checks[i], ReceivedTensorCheck::Create(meta_at(i), version));
          }
          // After tensor i's last byte: places it when its chunks verified it.
          const auto on_complete = [&](int i) -> absl::Status {
            complete[i] = true;
            ASSIGN_OR_RETURN(const bool by_chunks, checks[i]->Complete());
            if (!by_chunks) return absl::OkStatus();  // its TensorDigest comes next.
            verified[i] = true;
            return place(i);
          };
          v1::Manifest second_manifest;
          while (stream->Read(&response)) {
            absl::StatusOr<ResponsePart> part =
                decoder.Read<v1::LoadResponse>(response, &second_manifest);
            if (!part.ok()) {
              return absl::DataLossError(absl::StrCat(
                  "the Load stream of ", where, " sent a bad message: ", part.status().message()));
            }
            if (*part == ResponsePart::kNeither) {
              // A TensorDigest (the reader knows manifests and data only): small, parsed whole.
              v1::LoadResponse other;
              RETURN_IF_ERROR(ParseFromByteBuffer(response, "LoadResponse", &other));
              if (!other.has_digest()) {
                return absl::DataLossError(
                    absl::StrCat("the Load stream of ", where,
                                 " sent a message with no part this client knows"));
              }
              const int i = other.digest().tensor_index();
              if (i < 0 || i >= count || verified[i]) {
                return absl::DataLossError(absl::StrCat("the Load stream of ", where,
                                                        " sent an unexpected TensorDigest for "
                                                        "tensor index ",
                                                        i, " of ", count));
              }
              if (!complete[i] && meta_at(i).byte_length() == 0) RETURN_IF_ERROR(on_complete(i));
              RETURN_IF_ERROR(checks[i]->CheckDigest(other.digest()));
              verified[i] = true;
              RETURN_IF_ERROR(place(i));
              continue;
            }
            if (*part != ResponsePart::kData) {
              return absl::DataLossError(
                  absl::StrCat("the Load stream of ", where, " sent a second manifest"));
            }
            const TensorDataView& data = decoder.data();
            const int i = data.tensor_index;
            if (i < 0 || i >= count) {
              return absl::DataLossError(absl::StrCat(
                  "the Load stream of ", where, " sent bytes of tensor index ", i, " of ", count));
            }
            const v1::TensorMeta& meta = meta_at(i);
            if (data.offset != received_bytes[i] || data.offset + data.size > meta.byte_length()) {
              return absl::DataLossError(
                  absl::StrCat("the Load stream of ", where, " sent bytes ", data.offset, "..",
                               data.offset + data.size, " of tensor '", meta.key(), "' (",
                               meta.byte_length(), " bytes) after ", received_bytes[i]));
            }
            char* destination = static_cast<char*>(cpu[i].data_ptr()) + data.offset;
            for (absl::string_view piece : data.pieces) {
              RETURN_IF_ERROR(checks[i]->Add(piece));
              std::memcpy(destination, piece.data(), piece.size());
              destination += piece.size();
            }
            received_bytes[i] += data.size;
            if (received_bytes[i] == meta.byte_length()) RETURN_IF_ERROR(on_complete(i));
          }
          for (int i = 0; i < count; ++i) {
            // An incomplete stream: Finish says why (a server error, the deadline), else DATA_LOSS.
            if (received_bytes[i] != meta_at(i).byte_length()) return absl::OkStatus();
            if (!complete[i]) RETURN_IF_ERROR(on_complete(i));  // tensors of zero bytes.
            if (!verified[i]) {
              // Finish may say why (the stream broke before the digest); else the server is one
              // that sends no checksums, and its bytes are not taken unchecked.
              unverified = meta_at(i).key();
              return absl::OkStatus();
            }
          }
          // The caller's stream (the device's current one) may use the tensors from here on.
          if (staging)
            RETURN_IF_ERROR(CatchTorchErrors([&] { staging->OrderBeforeCurrentStream(); }));
          for (int i = 0; i < model_count; ++i) {
            RETURN_IF_ERROR(state.model.Insert(manifest.tensors(i).key(), std::move(placed[i]),
                                               manifest.tensors(i).original_device()));
          }
          absl::flat_hash_map<std::string, int> state_index;
          for (int j = 0; j < manifest.state_tensors_size(); ++j) {
            state_index.emplace(manifest.state_tensors(j).key(), model_count + j);
          }
          const auto resolve = [&](absl::string_view key) -> absl::StatusOr<at::Tensor> {
            auto it = state_index.find(std::string(key));
            if (it == state_index.end()) {
              return absl::DataLossError(absl::StrCat(where,
                                                      ": value tree references state tensor '", key,
                                                      "', which the manifest lacks"));
            }
            return placed[it->second];
          };
          if (manifest.has_optimizer_state()) {
            ASSIGN_OR_RETURN(state.optimizer, ValueFromProto(manifest.optimizer_state(), resolve));
          }
          if (manifest.has_scheduler_state()) {
            ASSIGN_OR_RETURN(state.scheduler, ValueFromProto(manifest.scheduler_state(), resolve));
          }
          return absl::OkStatus();
        }();
        if (!received.ok()) {
          context.TryCancel();
          stream->Finish();
          return received;
        }
        RETURN_IF_ERROR(channel_->FromCall(stream->Finish()));
        if (unverified.has_value()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "tensor '", *unverified, "' of ", where,
              " arrived with neither chunk refs nor a TensorDigest to check it by: the loader "
              "server predates checksums to the consumer; upgrade it"));
        }
        if (state.manifest.model().empty() ||
            state.model.size() != static_cast<size_t>(state.manifest.tensors_size())) {
          return absl::DataLossError(
              absl::StrCat("the Load stream of ", where, " ended before every tensor arrived"));
        }
        return absl::OkStatus();
      }));
  return state;
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
  if (options.max_shard_bytes > 0) {
    // The loader's Export streams one file; sharding is written from the store (ExportToFile).
    return absl::InvalidArgumentError(
        "a remote loader exports one file: sharded safetensors (max_shard_bytes) need the store");
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
          if (const uint64_t digest = Xxh3Of(response.data()); digest != response.xxh3_64()) {
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
