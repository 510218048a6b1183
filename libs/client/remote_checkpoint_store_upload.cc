// RemoteCheckpointStore::BeginUpload: one Upload stream per session (see
// internal/remote_store_connection.h for how the remote store's files divide).

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/client/internal/remote_store_connection.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/status_macros.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {

using Connection = RemoteCheckpointStore::Connection;

namespace {

using remote_store_internal::TensorAt;

std::string ToString(grpc::string_ref ref) { return std::string(ref.data(), ref.size()); }

// A name no other upload has: 128 random bits, for an upload other writers may join.
std::string RandomJoinName() {
  std::random_device random;
  std::string name = "upload-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&name, absl::Hex(random(), absl::kZeroPad8));
  return name;
}

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
  std::string upload_id() const override { return join_name_; }

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
    // Always joinable: this stream cannot tell the writers the server's id before the commit.
    join_name_ = options.joinable_as.empty() ? RandomJoinName() : options.joinable_as;
    upload->set_joinable_as(join_name_);
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
  std::string join_name_;
  std::vector<std::string> warnings_;
  std::vector<int64_t> received_;  // bytes sent per tensor.
  absl::Status failed_;
  bool committed_ = false;
};

// ---------------------------------------------------------------------------------------------
// A part of another upload, on an Upload stream of its own (UploadHeader.join).
class RemoteUploadPart final : public UploadPart {
 public:
  static absl::StatusOr<std::unique_ptr<UploadPart>> Start(
      std::shared_ptr<const Connection> connection, absl::string_view upload_id,
      std::vector<UploadRange> ranges) {
    const RemoteStoreOptions& remote = connection->options();
    RETURN_IF_ERROR(connection->WaitUntilConnected(absl::Now() + remote.connect_timeout));
    std::unique_ptr<RemoteUploadPart> part(
        new RemoteUploadPart(std::move(connection), std::move(ranges)));
    RETURN_IF_ERROR(part->SendHeader(upload_id));
    return std::unique_ptr<UploadPart>(std::move(part));
  }

  ~RemoteUploadPart() override {
    if (stream_open_) {
      context_->TryCancel();  // the server drops the part: an abandoned upload of its own.
      writer_->Finish();
    }
  }

  // The server names the upload's model; the rest of its header stays there.
  const v1::Manifest& header() const override { return header_; }
  const std::vector<UploadRange>& ranges() const override { return ranges_; }

  absl::Status AddRangeData(int range_index, int64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(CheckUsable());
    if (range_index < 0 || range_index >= static_cast<int>(ranges_.size())) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "range index ", range_index, " is out of range: the part has ", ranges_.size())));
    }
    const UploadRange& range = ranges_[range_index];
    int64_t& received = received_[range_index];
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (offset != received || size > range.end - range.begin - received) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "range ", range_index, " (bytes ", range.begin, "..", range.end, " of tensor index ",
          range.tensor_index, "): ", size, " bytes at offset ", offset, " after ", received,
          " (a range's bytes arrive in order, up to its end)")));
    }
    for (int64_t sent = 0; sent < size; sent += kMaxTensorDataBytes) {
      const int64_t piece = std::min<int64_t>(kMaxTensorDataBytes, size - sent);
      request_.Clear();
      v1::TensorData* data = request_.mutable_data();
      data->set_tensor_index(range_index);
      data->set_offset(offset + sent);
      data->set_data(bytes.data() + sent, piece);
      if (!writer_->Write(request_)) return Fail(StreamEnded());
    }
    received += size;
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    RETURN_IF_ERROR(CheckUsable());
    request_.Clear();
    request_.mutable_commit();
    if (!writer_->Write(request_)) return Fail(StreamEnded());
    writer_->WritesDone();
    const grpc::Status status = writer_->Finish();
    stream_open_ = false;
    if (!status.ok()) return Fail(connection_->FromCall(status));
    finished_ = true;
    return absl::OkStatus();
  }

 private:
  RemoteUploadPart(std::shared_ptr<const Connection> connection, std::vector<UploadRange> ranges)
      : connection_(std::move(connection)),
        ranges_(std::move(ranges)),
        received_(ranges_.size(), 0) {}

  absl::Status SendHeader(absl::string_view upload_id) {
    context_ = connection_->NewContext(absl::Now() + connection_->options().stream_deadline);
    writer_ = connection_->stub().Upload(context_.get(), &response_);
    stream_open_ = true;
    v1::UploadJoin* join = request_.mutable_header()->mutable_join();
    join->set_upload_id(std::string(upload_id));
    for (const UploadRange& range : ranges_) {
      v1::UploadByteRange* wire = join->add_ranges();
      wire->set_tensor_index(range.tensor_index);
      wire->set_begin(range.begin);
      wire->set_end(range.end);
    }
    if (!writer_->Write(request_)) return StreamEnded();
    writer_->WaitForInitialMetadata();
    const auto& metadata = context_->GetServerInitialMetadata();
    if (metadata.find(kUploadAcceptedMetadata) == metadata.end()) return StreamEnded();
    if (auto model = metadata.find(kUploadJoinedModelMetadata); model != metadata.end()) {
      header_.set_model(ToString(model->second));
    }
    return absl::OkStatus();
  }

  absl::Status StreamEnded() {
    const grpc::Status status = writer_->Finish();
    stream_open_ = false;
    if (status.ok()) {
      return absl::InternalError(absl::StrCat("the checkpoint store at ",
                                              connection_->options().address,
                                              " ended a part of an upload early without an error"));
    }
    return connection_->FromCall(status);
  }

  absl::Status CheckUsable() const {
    if (finished_) return absl::FailedPreconditionError("the part is already finished");
    if (!failed_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the part failed earlier: ", failed_.message()));
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
  const std::vector<UploadRange> ranges_;
  std::vector<int64_t> received_;  // bytes sent per range.
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer_;
  bool stream_open_ = false;
  v1::UploadRequest request_;
  v1::UploadResponse response_;
  v1::Manifest header_;  // the model only.
  absl::Status failed_;
  bool finished_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UploadSession>> RemoteCheckpointStore::BeginUpload(
    absl::string_view model, v1::Manifest header, const CommitOptions& options) {
  return RemoteUploadSession::Start(connection_, model, std::move(header), options);
}

absl::StatusOr<std::unique_ptr<UploadPart>> RemoteCheckpointStore::JoinUpload(
    absl::string_view upload_id, std::vector<UploadRange> ranges) {
  return RemoteUploadPart::Start(connection_, upload_id, std::move(ranges));
}

}  // namespace ckpt
