#include "libs/client/remote_checkpoint_store.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/io/xxh3.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/tensor_data_message.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/chunk_layout.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {
namespace {

// Listing pages asked for: the service's maximum (libs/rpc/wire_constants.h).
constexpr int kListPageSize = kMaxPageSize;

using Stub = v1::CheckpointStore::Stub;

const v1::TensorMeta& TensorAt(const v1::Manifest& manifest, int index) {
  return index < manifest.tensors_size() ? manifest.tensors(index)
                                         : manifest.state_tensors(index - manifest.tensors_size());
}

std::string ToString(grpc::string_ref ref) { return std::string(ref.data(), ref.size()); }

}  // namespace

// ---------------------------------------------------------------------------------------------

// The store's methods that only read: ClientChannel::CallUnary retries these on UNAVAILABLE;
// every other call may have changed the store and is sent once.
const std::vector<std::string>& ReadOnlyMethods() {
  static const auto* methods = new std::vector<std::string>{
      "FindMissingChunks", "ListModels", "ListVersions", "GetManifest", "Verify",
      "GetStats",          "ListAudit",  "ListHistory"};
  return *methods;
}

class RemoteCheckpointStore::Connection {
 public:
  explicit Connection(std::shared_ptr<ClientChannel> channel)
      : channel_(std::move(channel)),
        stub_(v1::CheckpointStore::NewStub(channel_->channel())),
        download_method_(kDownloadMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
                         channel_->channel()) {}

  const RemoteStoreOptions& options() const { return channel_->options(); }
  const ClientChannel& channel() const { return *channel_; }
  Stub& stub() const { return *stub_; }

  // Download, read as raw messages (TensorDataResponseReader reads them without copying the
  // bytes). gRPC's generated stubs make their readers with this same internal factory; there is
  // no public way to read a server stream as ByteBuffers synchronously.
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> Download(
      grpc::ClientContext* context, const v1::DownloadRequest& request) const {
    return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channel_->channel().get(), download_method_, context, request));
  }

  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const {
    return channel_->NewContext(deadline);
  }
  absl::Status WaitUntilConnected(absl::Time deadline) const {
    return channel_->WaitUntilConnected(deadline);
  }
  absl::Status FromCall(const grpc::Status& status) const { return channel_->FromCall(status); }

  // One unary call of the method called `name`, all attempts within `timeout` from now
  // (ClientChannel::CallUnary): the read-only ones (ReadOnlyMethods) are retried on
  // UNAVAILABLE; the others are sent once, after the channel is connected.
  template <typename Request, typename Response>
  absl::Status Call(absl::string_view name,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, absl::Duration timeout) const {
    return channel_->CallUnary(name, timeout, [&](grpc::ClientContext* context) {
      response->Clear();
      return (stub_.get()->*method)(context, request, response);
    });
  }

 private:
  const std::shared_ptr<ClientChannel> channel_;
  const std::unique_ptr<Stub> stub_;
  const grpc::internal::RpcMethod download_method_;
};

using Connection = RemoteCheckpointStore::Connection;

namespace {

// ---------------------------------------------------------------------------------------------
// One Upload stream.
class RemoteUploadSession final : public UploadSession {
 public:
  static absl::StatusOr<std::unique_ptr<UploadSession>> Start(
      std::shared_ptr<const Connection> connection, absl::string_view model, v1::Manifest header,
      const CommitOptions& options) {
    const RemoteStoreOptions& remote = connection->options();
    RETURN_IF_ERROR(connection->WaitUntilConnected(absl::Now() + remote.connect_timeout));
    std::unique_ptr<RemoteUploadSession> session(new RemoteUploadSession(std::move(connection)));
    RETURN_IF_ERROR(session->SendHeader(model, std::move(header), options));
    return std::unique_ptr<UploadSession>(std::move(session));
  }

  ~RemoteUploadSession() override {
    if (stream_open_) {
      // Abandons the upload: the server destroys its session, nothing becomes visible.
      context_->TryCancel();
      writer_->Finish();
    }
  }

  const v1::Manifest& header() const override { return header_; }
  int tensor_count() const override { return static_cast<int>(received_.size()); }
  const std::vector<std::string>& warnings() const override { return warnings_; }

  absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(CheckUsable());
    ASSIGN_OR_RETURN(const v1::TensorMeta* next, NextPieceOf(tensor_index, offset));
    const v1::TensorMeta& meta = *next;
    int64_t& received = received_[tensor_index];
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (size > meta.byte_length() - received) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor '", meta.key(), "' (index ", tensor_index, "): ", received + size,
                       " bytes sent but its byte_length is ", meta.byte_length())));
    }
    for (int64_t sent = 0; sent < size; sent += kMaxTensorDataBytes) {
      const int64_t piece = std::min<int64_t>(kMaxTensorDataBytes, size - sent);
      request_.Clear();
      v1::TensorData* data = request_.mutable_data();
      data->set_tensor_index(tensor_index);
      data->set_offset(offset + sent);
      data->set_data(bytes.data() + sent, piece);
      if (!writer_->Write(request_)) return Fail(StreamEnded());
    }
    received += size;
    return absl::OkStatus();
  }

  // The server's answer to a reference (NOT_FOUND for a chunk it lacks) ends the stream, so it
  // surfaces from a later call or from Commit.
  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override {
    RETURN_IF_ERROR(CheckUsable());
    ASSIGN_OR_RETURN(const v1::TensorMeta* next, NextPieceOf(tensor_index, offset));
    const v1::TensorMeta& meta = *next;
    int64_t& received = received_[tensor_index];
    const std::string name = absl::StrCat("tensor '", meta.key(), "' (index ", tensor_index, ")");
    absl::Status placed = CheckStoredChunkPlace(meta, name, offset, sha256, length);
    if (!placed.ok()) return Fail(placed);
    request_.Clear();
    v1::StoredChunk* chunk = request_.mutable_stored_chunk();
    chunk->set_tensor_index(tensor_index);
    chunk->set_offset(offset);
    chunk->set_sha256(sha256.data(), sha256.size());
    chunk->set_length(length);
    if (!writer_->Write(request_)) return Fail(StreamEnded());
    received += length;
    return absl::OkStatus();
  }

  absl::StatusOr<CommitResult> Commit() override {
    RETURN_IF_ERROR(CheckUsable());
    request_.Clear();
    // The aliases travelled in the header; an empty UploadCommit.aliases keeps them.
    request_.mutable_commit();
    // Sent once: if the stream breaks now the server may or may not have committed, and only a
    // look at the model (ListVersions) can tell; a blind retry could commit twice.
    if (!writer_->Write(request_)) return Fail(StreamEnded());
    writer_->WritesDone();
    const grpc::Status status = writer_->Finish();
    stream_open_ = false;
    if (!status.ok()) return Fail(connection_->FromCall(status));
    committed_ = true;
    CommitResult result;
    result.version = response_.version();
    result.logical_bytes = response_.logical_bytes();
    result.new_bytes = response_.new_bytes();
    result.warnings.assign(response_.warnings().begin(), response_.warnings().end());
    return result;
  }

 private:
  explicit RemoteUploadSession(std::shared_ptr<const Connection> connection)
      : connection_(std::move(connection)) {}

  absl::Status SendHeader(absl::string_view model, v1::Manifest header,
                          const CommitOptions& options) {
    context_ = connection_->NewContext(absl::Now() + connection_->options().stream_deadline);
    writer_ = connection_->stub().Upload(context_.get(), &response_);
    stream_open_ = true;
    v1::UploadHeader* upload = request_.mutable_header();
    upload->set_model(std::string(model));
    *upload->mutable_manifest() = header;
    upload->set_expected_latest_version(options.expected_latest_version);
    upload->set_reason(options.attribution.reason);
    for (const std::string& alias : options.aliases) upload->add_aliases(alias);
    if (!writer_->Write(request_)) return StreamEnded();
    // The server sends initial metadata once it accepted the header; when it rejects the header
    // it ends the call instead, and Finish has its status.
    writer_->WaitForInitialMetadata();
    const auto& metadata = context_->GetServerInitialMetadata();
    if (metadata.find(kUploadAcceptedMetadata) == metadata.end()) return StreamEnded();
    auto [begin, end] = metadata.equal_range(kUploadWarningMetadata);
    for (auto it = begin; it != end; ++it) warnings_.push_back(ToString(it->second));

    header_ = std::move(header);
    header_.set_model(std::string(model));
    header_.set_version(0);
    header_.clear_aliases();
    header_.clear_warnings();
    for (const std::string& warning : warnings_) header_.add_warnings(warning);
    received_.assign(header_.tensors_size() + header_.state_tensors_size(), 0);
    return absl::OkStatus();
  }

  // The status that ended the stream (a Write failed, or the server ended it early).
  absl::Status StreamEnded() {
    const grpc::Status status = writer_->Finish();
    stream_open_ = false;
    if (status.ok()) {
      return absl::InternalError(absl::StrCat("the checkpoint store at ",
                                              connection_->options().address,
                                              " ended the upload early without an error"));
    }
    return connection_->FromCall(status);
  }

  // The tensor `tensor_index` names, when `offset` is where its bytes have got to; otherwise the
  // session fails with INVALID_ARGUMENT, as the server would refuse the piece.
  absl::StatusOr<const v1::TensorMeta*> NextPieceOf(int tensor_index, int64_t offset) {
    if (tensor_index < 0 || tensor_index >= tensor_count()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("tensor index ", tensor_index,
                                                          " is out of range: the upload has ",
                                                          tensor_count(), " tensors")));
    }
    const v1::TensorMeta& meta = TensorAt(header_, tensor_index);
    if (offset != received_[tensor_index]) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor '", meta.key(), "' (index ", tensor_index, "): data at offset ",
                       offset, ", expected offset ", received_[tensor_index],
                       " (a tensor's bytes must arrive in order)")));
    }
    return &meta;
  }

  absl::Status CheckUsable() const {
    if (committed_) return absl::FailedPreconditionError("the upload is already committed");
    if (!failed_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the upload failed earlier: ", failed_.message()));
    }
    return absl::OkStatus();
  }

  absl::Status Fail(absl::Status status) {
    failed_ = status;
    if (stream_open_) {
      context_->TryCancel();
      writer_->Finish();
      stream_open_ = false;
    }
    return status;
  }

  const std::shared_ptr<const Connection> connection_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer_;
  bool stream_open_ = false;  // Finish not called yet.
  v1::UploadRequest request_;
  v1::UploadResponse response_;
  v1::Manifest header_;
  std::vector<std::string> warnings_;
  std::vector<int64_t> received_;  // bytes sent per tensor.
  absl::Status failed_;
  bool committed_ = false;
};

// ---------------------------------------------------------------------------------------------
// One Download stream, positioned after its manifest.
class DownloadStream {
 public:
  // Starts the download and reads the manifest. UNAVAILABLE before the manifest arrived is
  // retried like a read-only call: nothing was consumed yet.
  static absl::StatusOr<std::unique_ptr<DownloadStream>> Open(
      std::shared_ptr<const Connection> connection, v1::DownloadRequest request) {
    const RemoteStoreOptions& options = connection->options();
    // ReadTensor checks every chunk against the manifest, so the server need not check first.
    request.set_client_checks_chunks(true);
    std::unique_ptr<DownloadStream> opened;
    RETURN_IF_ERROR(connection->channel().RestartOnUnavailable(
        options.stream_deadline, [&](std::unique_ptr<grpc::ClientContext> context) -> absl::Status {
          std::unique_ptr<DownloadStream> stream(new DownloadStream(connection));
          stream->context_ = std::move(context);
          stream->reader_ = connection->Download(stream->context_.get(), request);
          stream->open_ = true;
          if (stream->reader_->Read(&stream->message_)) {
            absl::StatusOr<ResponsePart> part =
                stream->decoder_.Read<v1::DownloadResponse>(stream->message_, &stream->manifest_);
            if (!part.ok() || *part != ResponsePart::kManifest) {
              return absl::InternalError(
                  absl::StrCat("the checkpoint store at ", options.address,
                               " began a download without its manifest",
                               part.ok() ? "" : absl::StrCat(": ", part.status().message())));
            }
            opened = std::move(stream);
            return absl::OkStatus();
          }
          const grpc::Status status = stream->reader_->Finish();
          stream->open_ = false;
          if (status.ok()) {
            return absl::InternalError(absl::StrCat("the checkpoint store at ", options.address,
                                                    " sent an empty download"));
          }
          return connection->FromCall(status);
        }));
    return opened;
  }

  ~DownloadStream() {
    if (open_) {
      context_->TryCancel();
      reader_->Finish();
    }
  }

  v1::Manifest& manifest() { return manifest_; }

  // Streams tensor `index` (described by `meta`, from the manifest) one store chunk at a time,
  // each checked against its ChunkRef: into `destination` (byte_length bytes) when it is not
  // null -- each message copied once, straight to its place -- else to `callback`. The tensor's
  // data must be the next on the stream, apart from data of earlier tensors, which is skipped.
  // After an error the stream is mid-tensor and must not be read again.
  absl::Status ReadTensor(int index, const v1::TensorMeta& meta, const ChunkCallback& callback,
                          absl::string_view where, char* destination = nullptr) {
    const int64_t length = meta.byte_length();
    RETURN_IF_ERROR(CheckChunkLayout(meta, where));  // before a buffer is sized by a chunk
    int64_t received = 0;
    int chunk_index = 0;
    int64_t chunk_offset = 0;
    std::string& chunk = chunk_;  // reused: no fresh 4 MiB per tensor.
    chunk.clear();
    while (received < length) {
      if (!reader_->Read(&message_)) {
        const grpc::Status status = reader_->Finish();
        open_ = false;
        if (!status.ok()) return connection_->FromCall(status);
        return absl::DataLossError(absl::StrCat("the download of ", where, " ended after ",
                                                received, " of ", length, " bytes of tensor '",
                                                meta.key(), "'"));
      }
      v1::Manifest second_manifest;
      absl::StatusOr<ResponsePart> part =
          decoder_.Read<v1::DownloadResponse>(message_, &second_manifest);
      if (!part.ok()) {
        return absl::InternalError(absl::StrCat("the download of ", where,
                                                " sent a bad message: ", part.status().message()));
      }
      if (*part != ResponsePart::kData) {
        return absl::InternalError(absl::StrCat("the download of ", where, " sent ",
                                                *part == ResponsePart::kManifest
                                                    ? "a second manifest"
                                                    : "a message with neither manifest nor data"));
      }
      const TensorDataView& data = decoder_.data();
      if (data.tensor_index < index && received == 0) continue;  // Not asked for: skipped.
      if (data.tensor_index != index || data.offset != received) {
        return absl::InternalError(absl::StrCat(
            "the download of ", where, " sent tensor ", data.tensor_index, " at offset ",
            data.offset, " where tensor ", index, " at offset ", received, " was due"));
      }
      if (data.size > length - received) {
        return absl::DataLossError(absl::StrCat("the download of ", where, " sent ",
                                                received + data.size, " bytes of tensor '",
                                                meta.key(), "', whose byte_length is ", length));
      }
      for (absl::string_view bytes : data.pieces) {
        while (!bytes.empty()) {
          const v1::ChunkRef& ref = meta.chunks(chunk_index);
          const int64_t chunk_received = received - chunk_offset;
          const size_t take =
              std::min(bytes.size(), static_cast<size_t>(ref.length() - chunk_received));
          if (chunk_received == 0) XXH3_64bits_reset(hash_.get());
          char* const to = destination != nullptr ? destination + received : nullptr;
          if (to == nullptr && chunk.capacity() < static_cast<size_t>(ref.length())) {
            chunk.reserve(ref.length());
          }
          // Copied and hashed a block at a time: the hash reads what was just written while it
          // is still in cache, instead of reading the whole chunk from memory again afterwards.
          for (size_t done = 0; done < take;) {
            const size_t block = std::min(take - done, kHashBlockBytes);
            const char* copied;
            if (to != nullptr) {
              std::memcpy(to + done, bytes.data() + done, block);
              copied = to + done;
            } else {
              chunk.append(bytes.data() + done, block);
              copied = chunk.data() + chunk.size() - block;
            }
            Xxh3Update(hash_.get(), absl::string_view(copied, block));
            done += block;
          }
          bytes.remove_prefix(take);
          received += static_cast<int64_t>(take);
          if (received - chunk_offset < ref.length()) continue;
          const uint64_t xxh3 = XXH3_64bits_digest(hash_.get());
          if (xxh3 != ref.xxh3_64()) {
            return absl::DataLossError(absl::StrCat(
                "chunk ", HexEncode(ref.sha256()), " of tensor '", meta.key(), "' of ", where,
                " (bytes ", chunk_offset, "..", chunk_offset + ref.length(),
                ") arrived with a wrong xxh3 checksum (damaged in the store or on the way: the "
                "server does not check chunks for a client that does; `ckpt verify` "
                "checks the store); do not use the bytes read"));
          }
          if (destination == nullptr) RETURN_IF_ERROR(callback(chunk_offset, chunk));
          chunk_offset += ref.length();
          ++chunk_index;
          chunk.clear();
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  // Pieces are copied and hashed in blocks of this size, small enough to still be in L1/L2
  // when the hash reads them.
  static constexpr size_t kHashBlockBytes = 64 << 10;

  struct FreeHashState {
    void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
  };

  explicit DownloadStream(std::shared_ptr<const Connection> connection)
      : connection_(std::move(connection)), hash_(XXH3_createState()) {}

  const std::shared_ptr<const Connection> connection_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader_;
  bool open_ = false;  // Finish not called yet.
  v1::Manifest manifest_;
  grpc::ByteBuffer message_;          // the last message read...
  TensorDataResponseReader decoder_;  // ...and views of its bytes.
  std::string chunk_;                 // a chunk being assembled for a callback.
  // XXH3-64 (seed 0, as the store's ChunkRef.xxh3_64) of the chunk being received, so far.
  std::unique_ptr<XXH3_state_t, FreeHashState> hash_;
};

// ---------------------------------------------------------------------------------------------
// A version read through one main Download stream (in manifest order) plus one-off Downloads
// for tensors read out of order.
class RemoteVersionReader final : public VersionReader {
 public:
  RemoteVersionReader(std::shared_ptr<const Connection> connection,
                      std::unique_ptr<DownloadStream> main)
      : connection_(std::move(connection)),
        main_(std::move(main)),
        manifest_(std::move(main_->manifest())),
        where_(FormatVersionRef(manifest_.model(), manifest_.version())) {
    for (int i = 0; i < manifest_.tensors_size(); ++i) {
      model_index_.emplace(manifest_.tensors(i).key(), i);
    }
    for (int i = 0; i < manifest_.state_tensors_size(); ++i) {
      state_index_.emplace(manifest_.state_tensors(i).key(), manifest_.tensors_size() + i);
    }
  }

  const v1::Manifest& manifest() const override { return manifest_; }

  absl::Status ReadTensorChunks(const v1::TensorMeta& meta,
                                const ChunkCallback& callback) const override {
    return Read(meta, callback, nullptr);
  }

  absl::Status ReadTensorInto(const v1::TensorMeta& meta, char* destination) const override {
    return Read(meta, nullptr, destination);
  }

 private:
  absl::Status Read(const v1::TensorMeta& meta, const ChunkCallback& callback,
                    char* destination) const {
    ASSIGN_OR_RETURN(const int index, IndexOf(meta));
    const v1::TensorMeta& stored = TensorAt(manifest_, index);
    if (stored.byte_length() != meta.byte_length()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", meta.key(), "' has byte_length ",
                                                     meta.byte_length(), " but ", where_,
                                                     " holds it with ", stored.byte_length()));
    }
    if (stored.byte_length() == 0) return absl::OkStatus();
    if (main_ != nullptr && index == NextOnMainStream()) {
      absl::Status status = main_->ReadTensor(index, stored, callback, where_, destination);
      main_position_ = index + 1;
      if (!status.ok()) main_.reset();  // Mid-tensor now: later reads go one-off.
      return status;
    }
    v1::DownloadRequest request;
    *request.mutable_ref() = MakeVersionRef(manifest_.model(), manifest_.version());
    request.add_keys(stored.key());
    request.set_include_state(index >= manifest_.tensors_size());
    ASSIGN_OR_RETURN(std::unique_ptr<DownloadStream> stream,
                     DownloadStream::Open(connection_, request));
    return stream->ReadTensor(index, stored, callback, where_, destination);
  }

  // The index of `meta` in manifest order: the very entry when `meta` is one of manifest()'s,
  // else by key, model tensors first (as ReadTensor(key) searches).
  absl::StatusOr<int> IndexOf(const v1::TensorMeta& meta) const {
    auto state = state_index_.find(meta.key());
    if (state != state_index_.end() && &TensorAt(manifest_, state->second) == &meta) {
      return state->second;
    }
    auto model = model_index_.find(meta.key());
    if (model != model_index_.end()) return model->second;
    if (state != state_index_.end()) return state->second;
    return absl::NotFoundError(absl::StrCat("no tensor '", meta.key(), "' in ", where_));
  }

  // The tensor whose bytes the main stream delivers next (tensors of 0 bytes send none).
  int NextOnMainStream() const {
    const int count = manifest_.tensors_size() + manifest_.state_tensors_size();
    int index = main_position_;
    while (index < count && TensorAt(manifest_, index).byte_length() == 0) ++index;
    return index;
  }

  const std::shared_ptr<const Connection> connection_;
  // Reading changes stream positions, while VersionReader's reads are const; a reader is used
  // by one thread at a time, as the interface requires.
  mutable std::unique_ptr<DownloadStream> main_;  // null once it failed.
  mutable int main_position_ = 0;                 // tensors before this were consumed.
  const v1::Manifest manifest_;
  const std::string where_;
  absl::flat_hash_map<std::string, int> model_index_;
  absl::flat_hash_map<std::string, int> state_index_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> RemoteCheckpointStore::Connect(
    const RemoteStoreOptions& options) {
  if (options.max_receive_message_bytes <= kMaxTensorDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RemoteStoreOptions.max_receive_message_bytes must exceed ", kMaxTensorDataBytes,
        " (a TensorData message), got ", options.max_receive_message_bytes));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<ClientChannel> channel,
      ClientChannel::Open(options, {std::string(v1::CheckpointStore::service_full_name()),
                                    "checkpoint store", ReadOnlyMethods()}));
  auto connection = std::make_shared<Connection>(channel);
  return std::unique_ptr<RemoteCheckpointStore>(
      new RemoteCheckpointStore(std::move(connection), std::move(channel)));
}

RemoteCheckpointStore::RemoteCheckpointStore(std::shared_ptr<Connection> connection,
                                             std::shared_ptr<ClientChannel> channel)
    : connection_(std::move(connection)),
      channel_(std::move(channel)),
      stub_(v1::CheckpointStore::NewStub(channel_->channel())) {}

RemoteCheckpointStore::~RemoteCheckpointStore() = default;

const std::string& RemoteCheckpointStore::address() const { return connection_->options().address; }

absl::StatusOr<std::unique_ptr<UploadSession>> RemoteCheckpointStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  return RemoteUploadSession::Start(connection_, model, std::move(header), options);
}

absl::StatusOr<std::vector<std::string>> RemoteCheckpointStore::FindMissingChunks(
    const std::vector<std::string>& sha256s) {
  v1::FindMissingChunksRequest request;
  for (const std::string& sha256 : sha256s) request.add_sha256(sha256);
  v1::FindMissingChunksResponse response;
  RETURN_IF_ERROR(connection_->Call("FindMissingChunks", &Stub::FindMissingChunks, request,
                                    &response, connection_->options().deadline));
  return std::vector<std::string>(response.missing_sha256().begin(),
                                  response.missing_sha256().end());
}

absl::StatusOr<v1::Manifest> RemoteCheckpointStore::GetManifest(const v1::VersionRef& ref) {
  v1::GetManifestRequest request;
  *request.mutable_ref() = ref;
  v1::Manifest manifest;
  RETURN_IF_ERROR(connection_->Call("GetManifest", &Stub::GetManifest, request, &manifest,
                                    connection_->options().deadline));
  return manifest;
}

absl::StatusOr<std::unique_ptr<VersionReader>> RemoteCheckpointStore::OpenVersion(
    const v1::VersionRef& ref) {
  v1::DownloadRequest request;
  *request.mutable_ref() = ref;
  request.set_include_state(true);
  ASSIGN_OR_RETURN(std::unique_ptr<DownloadStream> stream,
                   DownloadStream::Open(connection_, request));
  return std::unique_ptr<VersionReader>(new RemoteVersionReader(connection_, std::move(stream)));
}

absl::Status RemoteCheckpointStore::ReadTensorChunks(const v1::TensorMeta& meta,
                                                     const ChunkCallback&) {
  return absl::UnimplementedError(
      absl::StrCat("a remote checkpoint store cannot read tensor '", meta.key(),
                   "' by its chunk list: the wire API reads tensors of a version; use "
                   "OpenVersion(MODEL@N)->ReadTensorChunks"));
}

absl::StatusOr<std::vector<v1::ModelInfo>> RemoteCheckpointStore::ListModels() {
  std::vector<v1::ModelInfo> models;
  v1::ListModelsRequest request;
  request.set_page_size(kListPageSize);
  do {
    v1::ListModelsResponse response;
    RETURN_IF_ERROR(connection_->Call("ListModels", &Stub::ListModels, request, &response,
                                      connection_->options().deadline));
    for (v1::ModelInfo& model : *response.mutable_models()) models.push_back(std::move(model));
    if (!response.next_page_token().empty() && response.next_page_token() == request.page_token()) {
      return absl::InternalError("ListModels returned the same page token twice");
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return models;
}

absl::StatusOr<std::vector<v1::VersionInfo>> RemoteCheckpointStore::ListVersions(
    absl::string_view model) {
  std::vector<v1::VersionInfo> versions;
  v1::ListVersionsRequest request;
  request.set_model(std::string(model));
  request.set_page_size(kListPageSize);
  do {
    v1::ListVersionsResponse response;
    RETURN_IF_ERROR(connection_->Call("ListVersions", &Stub::ListVersions, request, &response,
                                      connection_->options().deadline));
    for (v1::VersionInfo& version : *response.mutable_versions()) {
      versions.push_back(std::move(version));
    }
    if (!response.next_page_token().empty() && response.next_page_token() == request.page_token()) {
      return absl::InternalError("ListVersions returned the same page token twice");
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return versions;
}

absl::StatusOr<int64_t> RemoteCheckpointStore::SetAlias(absl::string_view model,
                                                        absl::string_view alias, int64_t version,
                                                        int64_t expected_current_version,
                                                        const ChangeAttribution& attribution) {
  v1::SetAliasRequest request;
  request.set_reason(attribution.reason);
  request.set_model(std::string(model));
  request.set_alias(std::string(alias));
  request.set_version(version);
  request.set_expected_current_version(expected_current_version);
  v1::SetAliasResponse response;
  RETURN_IF_ERROR(connection_->Call("SetAlias", &Stub::SetAlias, request, &response,
                                    connection_->options().deadline));
  return response.previous_version();
}

absl::Status RemoteCheckpointStore::DeleteAlias(absl::string_view model, absl::string_view alias,
                                                const ChangeAttribution& attribution) {
  v1::DeleteAliasRequest request;
  request.set_reason(attribution.reason);
  request.set_model(std::string(model));
  request.set_alias(std::string(alias));
  v1::DeleteAliasResponse response;
  return connection_->Call("DeleteAlias", &Stub::DeleteAlias, request, &response,
                           connection_->options().deadline);
}

absl::StatusOr<int64_t> RemoteCheckpointStore::DeleteVersion(absl::string_view model,
                                                             int64_t version, bool force,
                                                             const ChangeAttribution& attribution) {
  v1::DeleteVersionRequest request;
  request.set_reason(attribution.reason);
  request.set_model(std::string(model));
  request.set_version(version);
  request.set_force(force);
  v1::DeleteVersionResponse response;
  RETURN_IF_ERROR(connection_->Call("DeleteVersion", &Stub::DeleteVersion, request, &response,
                                    connection_->options().deadline));
  return response.bytes_released();
}

absl::StatusOr<v1::ApplyRetentionResponse> RemoteCheckpointStore::ApplyRetention(
    absl::string_view model, const v1::RetentionPolicy& policy, bool dry_run,
    const ChangeAttribution& attribution) {
  v1::ApplyRetentionRequest request;
  request.set_model(std::string(model));
  *request.mutable_policy() = policy;
  request.set_dry_run(dry_run);
  request.set_reason(attribution.reason);
  v1::ApplyRetentionResponse response;
  RETURN_IF_ERROR(connection_->Call("ApplyRetention", &Stub::ApplyRetention, request, &response,
                                    connection_->options().stream_deadline));
  return response;
}

absl::StatusOr<v1::GarbageCollectResponse> RemoteCheckpointStore::GarbageCollect(bool dry_run) {
  v1::GarbageCollectRequest request;
  request.set_dry_run(dry_run);
  v1::GarbageCollectResponse response;
  RETURN_IF_ERROR(connection_->Call("GarbageCollect", &Stub::GarbageCollect, request, &response,
                                    connection_->options().stream_deadline));
  return response;
}

absl::StatusOr<v1::VerifyResponse> RemoteCheckpointStore::Verify(absl::string_view model,
                                                                 int64_t version) {
  v1::VerifyRequest request;
  request.set_model(std::string(model));
  request.set_version(version);
  v1::VerifyResponse response;
  RETURN_IF_ERROR(connection_->Call("Verify", &Stub::Verify, request, &response,
                                    connection_->options().stream_deadline));
  return response;
}

absl::StatusOr<v1::StoreStats> RemoteCheckpointStore::GetStats() {
  v1::GetStatsRequest request;
  v1::StoreStats stats;
  RETURN_IF_ERROR(connection_->Call("GetStats", &Stub::GetStats, request, &stats,
                                    connection_->options().deadline));
  return stats;
}

absl::StatusOr<int64_t> RemoteCheckpointStore::BeginAudit(v1::AuditRecord record) {
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot write the audit record of a '", record.action(), "' call to the store at ", address(),
      ": a store server records its own audit of the calls made to it, naming the caller it "
      "authenticated, so a client must not write records on anyone's behalf; make the call "
      "itself instead"));
}

absl::Status RemoteCheckpointStore::FinishAudit(int64_t sequence, const absl::Status&,
                                                absl::string_view, int64_t) {
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot finish audit record ", sequence, " of the store at ", address(),
      ": a store server records its own audit of the calls made to it; a client writes none"));
}

absl::StatusOr<std::vector<v1::AuditRecord>> RemoteCheckpointStore::ListAudit(
    const AuditQuery& query) {
  if (query.after_sequence < 0 || query.limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("audit query: after_sequence (",
                                                   query.after_sequence, ") and limit (",
                                                   query.limit, ") must not be negative"));
  }
  std::vector<v1::AuditRecord> records;
  v1::ListAuditRequest request;
  request.set_model(query.model);
  request.set_since_unix_micros(
      query.since == absl::InfinitePast() ? 0 : absl::ToUnixMicros(query.since));
  request.set_after_sequence(query.after_sequence);
  while (true) {
    const int64_t wanted = query.limit > 0 ? query.limit - static_cast<int64_t>(records.size())
                                           : int64_t{kListPageSize};
    request.set_page_size(static_cast<int32_t>(std::min<int64_t>(wanted, kListPageSize)));
    v1::ListAuditResponse response;
    RETURN_IF_ERROR(connection_->Call("ListAudit", &Stub::ListAudit, request, &response,
                                      connection_->options().deadline));
    for (v1::AuditRecord& record : *response.mutable_records()) {
      records.push_back(std::move(record));
    }
    if (response.next_after_sequence() == 0) break;
    if (response.next_after_sequence() <= request.after_sequence()) {
      return absl::InternalError(absl::StrCat("ListAudit returned next_after_sequence ",
                                              response.next_after_sequence(), " for a page after ",
                                              request.after_sequence()));
    }
    if (query.limit > 0 && static_cast<int64_t>(records.size()) >= query.limit) break;
    request.set_after_sequence(response.next_after_sequence());
  }
  return records;
}

}  // namespace ckpt
