// RemoteCheckpointStore::BeginUpload: one Upload stream per session (see
// internal/remote_store_connection.h for how the remote store's files divide).

#include <algorithm>
#include <map>
#include <memory>
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

// ---------------------------------------------------------------------------------------------
// One Upload stream: the header and the server's acceptance of it, tensor data in pieces, the
// closing UploadCommit, and how the stream ended. An upload's session and a part of an upload
// each drive one. After an error the stream is closed and every later call says it failed.
class UploadStream {
 public:
  explicit UploadStream(std::shared_ptr<const Connection> connection)
      : connection_(std::move(connection)) {}

  ~UploadStream() {
    if (open_) {
      // Abandons the upload (or part): the server destroys it, nothing becomes visible.
      context_->TryCancel();
      writer_->Finish();
    }
  }

  const Connection& connection() const { return *connection_; }

  // Sends `header` and waits until the server accepts it: it sends initial metadata then, and
  // ends the call instead when it refuses the header (the error is then the call's status).
  absl::Status Open(const v1::UploadHeader& header) {
    const RemoteStoreOptions& remote = connection_->options();
    RETURN_IF_ERROR(connection_->WaitUntilConnected(absl::Now() + remote.connect_timeout));
    context_ = connection_->NewContext(absl::Now() + remote.stream_deadline);
    writer_ = connection_->stub().Upload(context_.get(), &response_);
    open_ = true;
    request_.Clear();
    *request_.mutable_header() = header;
    if (!writer_->Write(request_)) return Fail(Ended());
    writer_->WaitForInitialMetadata();
    if (metadata().find(kUploadAcceptedMetadata) == metadata().end()) return Fail(Ended());
    return absl::OkStatus();
  }

  // The server's initial metadata, once Open returned OK.
  const std::multimap<grpc::string_ref, grpc::string_ref>& metadata() const {
    return context_->GetServerInitialMetadata();
  }

  // `bytes` of tensor (or range) `index` from `offset`, in messages of at most 1 MiB.
  absl::Status SendData(int index, int64_t offset, absl::string_view bytes) {
    RETURN_IF_ERROR(CheckUsable());
    const int64_t size = static_cast<int64_t>(bytes.size());
    for (int64_t sent = 0; sent < size; sent += kMaxTensorDataBytes) {
      const int64_t piece = std::min<int64_t>(kMaxTensorDataBytes, size - sent);
      request_.Clear();
      v1::TensorData* data = request_.mutable_data();
      data->set_tensor_index(index);
      data->set_offset(offset + sent);
      data->set_data(bytes.data() + sent, piece);
      if (!writer_->Write(request_)) return Fail(Ended());
    }
    return absl::OkStatus();
  }

  absl::Status SendStoredChunk(int index, int64_t offset, absl::string_view sha256,
                               int64_t length) {
    RETURN_IF_ERROR(CheckUsable());
    request_.Clear();
    v1::StoredChunk* chunk = request_.mutable_stored_chunk();
    chunk->set_tensor_index(index);
    chunk->set_offset(offset);
    chunk->set_sha256(sha256.data(), sha256.size());
    chunk->set_length(length);
    if (!writer_->Write(request_)) return Fail(Ended());
    return absl::OkStatus();
  }

  // Sends the UploadCommit once and ends the stream: the server's response. If the stream breaks
  // now the server may or may not have committed, and only a look at the model (ListVersions) can
  // tell; a blind retry could commit twice.
  absl::StatusOr<v1::UploadResponse> Commit() {
    RETURN_IF_ERROR(CheckUsable());
    request_.Clear();
    request_.mutable_commit();  // the aliases travelled in the header.
    if (!writer_->Write(request_)) return Fail(Ended());
    writer_->WritesDone();
    const grpc::Status status = writer_->Finish();
    open_ = false;
    if (!status.ok()) return Fail(connection_->FromCall(status));
    done_ = true;
    return response_;
  }

  // Records `status` as the stream's failure and closes it; returns `status`.
  absl::Status Fail(absl::Status status) {
    failed_ = status;
    if (open_) {
      context_->TryCancel();
      writer_->Finish();
      open_ = false;
    }
    return status;
  }

  absl::Status CheckUsable() const {
    if (done_) return absl::FailedPreconditionError("the upload is already committed");
    if (!failed_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the upload failed earlier: ", failed_.message()));
    }
    return absl::OkStatus();
  }

 private:
  // The status that ended the stream (a Write failed, or the server ended it early).
  absl::Status Ended() {
    const grpc::Status status = writer_->Finish();
    open_ = false;
    if (status.ok()) {
      return absl::InternalError(absl::StrCat("the checkpoint store at ",
                                              connection_->options().address,
                                              " ended the upload early without an error"));
    }
    return connection_->FromCall(status);
  }

  const std::shared_ptr<const Connection> connection_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer_;
  bool open_ = false;  // Finish not called yet.
  bool done_ = false;  // committed (or finished, for a part).
  absl::Status failed_;
  v1::UploadRequest request_;
  v1::UploadResponse response_;
};

// ---------------------------------------------------------------------------------------------
// An upload on one Upload stream.
class RemoteUploadSession final : public UploadSession {
 public:
  static absl::StatusOr<std::unique_ptr<UploadSession>> Start(
      std::shared_ptr<const Connection> connection, absl::string_view model, v1::Manifest header,
      const CommitOptions& options) {
    std::unique_ptr<RemoteUploadSession> session(new RemoteUploadSession(std::move(connection)));
    RETURN_IF_ERROR(session->SendHeader(model, std::move(header), options));
    return std::unique_ptr<UploadSession>(std::move(session));
  }

  const v1::Manifest& header() const override { return header_; }
  int tensor_count() const override { return static_cast<int>(received_.size()); }
  const std::vector<std::string>& warnings() const override { return warnings_; }
  std::string upload_id() const override { return join_name_; }

  absl::Status AddTensorData(int tensor_index, int64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(stream_.CheckUsable());
    ASSIGN_OR_RETURN(const v1::TensorMeta* next, NextPieceOf(tensor_index, offset));
    const v1::TensorMeta& meta = *next;
    int64_t& received = received_[tensor_index];
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (size > meta.byte_length() - received) {
      return stream_.Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor '", meta.key(), "' (index ", tensor_index, "): ", received + size,
                       " bytes sent but its byte_length is ", meta.byte_length())));
    }
    RETURN_IF_ERROR(stream_.SendData(tensor_index, offset, bytes));
    received += size;
    return absl::OkStatus();
  }

  // The server's answer to a reference (NOT_FOUND for a chunk it lacks) ends the stream, so it
  // surfaces from a later call or from Commit.
  absl::Status AddStoredChunk(int tensor_index, int64_t offset, absl::string_view sha256,
                              int64_t length) override {
    RETURN_IF_ERROR(stream_.CheckUsable());
    ASSIGN_OR_RETURN(const v1::TensorMeta* next, NextPieceOf(tensor_index, offset));
    const v1::TensorMeta& meta = *next;
    const std::string name = absl::StrCat("tensor '", meta.key(), "' (index ", tensor_index, ")");
    absl::Status placed = CheckStoredChunkPlace(meta, name, offset, sha256, length);
    if (!placed.ok()) return stream_.Fail(placed);
    RETURN_IF_ERROR(stream_.SendStoredChunk(tensor_index, offset, sha256, length));
    received_[tensor_index] += length;
    return absl::OkStatus();
  }

  absl::StatusOr<CommitResult> Commit() override {
    ASSIGN_OR_RETURN(v1::UploadResponse response, stream_.Commit());
    CommitResult result;
    result.version = response.version();
    result.logical_bytes = response.logical_bytes();
    result.new_bytes = response.new_bytes();
    result.warnings.assign(response.warnings().begin(), response.warnings().end());
    result.replayed = response.replayed();
    return result;
  }

 private:
  explicit RemoteUploadSession(std::shared_ptr<const Connection> connection)
      : stream_(std::move(connection)) {}

  absl::Status SendHeader(absl::string_view model, v1::Manifest header,
                          const CommitOptions& options) {
    v1::UploadHeader upload;
    upload.set_model(std::string(model));
    *upload.mutable_manifest() = header;
    upload.set_expected_latest_version(options.expected_latest_version);
    upload.set_reason(options.attribution.reason);
    for (const std::string& alias : options.aliases) upload.add_aliases(alias);
    // Always joinable: this stream cannot tell the writers the server's id before the commit.
    join_name_ = options.joinable_as.empty() ? RandomUploadName("upload-") : options.joinable_as;
    upload.set_joinable_as(join_name_);
    upload.set_idempotency_key(options.idempotency_key);
    RETURN_IF_ERROR(stream_.Open(upload));
    auto [begin, end] = stream_.metadata().equal_range(kUploadWarningMetadata);
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

  // The tensor `tensor_index` names, when `offset` is where its bytes have got to; otherwise the
  // session fails with INVALID_ARGUMENT, as the server would refuse the piece.
  absl::StatusOr<const v1::TensorMeta*> NextPieceOf(int tensor_index, int64_t offset) {
    if (tensor_index < 0 || tensor_index >= tensor_count()) {
      return stream_.Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor index ", tensor_index, " is out of range: the upload has ",
                       tensor_count(), " tensors")));
    }
    const v1::TensorMeta& meta = TensorAt(header_, tensor_index);
    if (offset != received_[tensor_index]) {
      return stream_.Fail(absl::InvalidArgumentError(
          absl::StrCat("tensor '", meta.key(), "' (index ", tensor_index, "): data at offset ",
                       offset, ", expected offset ", received_[tensor_index],
                       " (a tensor's bytes must arrive in order)")));
    }
    return &meta;
  }

  UploadStream stream_;
  v1::Manifest header_;
  std::string join_name_;
  std::vector<std::string> warnings_;
  std::vector<int64_t> received_;  // bytes sent per tensor.
};

// ---------------------------------------------------------------------------------------------
// A part of another upload, on an Upload stream of its own (UploadHeader.join).
class RemoteUploadPart final : public UploadPart {
 public:
  static absl::StatusOr<std::unique_ptr<UploadPart>> Start(
      std::shared_ptr<const Connection> connection, absl::string_view upload_id,
      std::vector<UploadRange> ranges) {
    std::unique_ptr<RemoteUploadPart> part(
        new RemoteUploadPart(std::move(connection), std::move(ranges)));
    v1::UploadHeader header;
    v1::UploadJoin* join = header.mutable_join();
    join->set_upload_id(std::string(upload_id));
    for (const UploadRange& range : part->ranges_) {
      v1::UploadByteRange* wire = join->add_ranges();
      wire->set_tensor_index(range.tensor_index);
      wire->set_begin(range.begin);
      wire->set_end(range.end);
    }
    RETURN_IF_ERROR(part->stream_.Open(header));
    auto model = part->stream_.metadata().find(kUploadJoinedModelMetadata);
    if (model != part->stream_.metadata().end()) part->header_.set_model(ToString(model->second));
    return std::unique_ptr<UploadPart>(std::move(part));
  }

  // The server names the upload's model; the rest of its header stays there.
  const v1::Manifest& header() const override { return header_; }
  const std::vector<UploadRange>& ranges() const override { return ranges_; }

  absl::Status AddRangeData(int range_index, int64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(stream_.CheckUsable());
    if (range_index < 0 || range_index >= static_cast<int>(ranges_.size())) {
      return stream_.Fail(absl::InvalidArgumentError(absl::StrCat(
          "range index ", range_index, " is out of range: the part has ", ranges_.size())));
    }
    const UploadRange& range = ranges_[range_index];
    int64_t& received = received_[range_index];
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (offset != received || size > range.end - range.begin - received) {
      return stream_.Fail(absl::InvalidArgumentError(absl::StrCat(
          "range ", range_index, " (bytes ", range.begin, "..", range.end, " of tensor index ",
          range.tensor_index, "): ", size, " bytes at offset ", offset, " after ", received,
          " (a range's bytes arrive in order, up to its end)")));
    }
    RETURN_IF_ERROR(stream_.SendData(range_index, offset, bytes));
    received += size;
    return absl::OkStatus();
  }

  absl::Status Finish() override { return stream_.Commit().status(); }

 private:
  RemoteUploadPart(std::shared_ptr<const Connection> connection, std::vector<UploadRange> ranges)
      : stream_(std::move(connection)), ranges_(std::move(ranges)), received_(ranges_.size(), 0) {}

  UploadStream stream_;
  const std::vector<UploadRange> ranges_;
  std::vector<int64_t> received_;  // bytes sent per range.
  v1::Manifest header_;            // the model only.
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
