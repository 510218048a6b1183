// RemoteCheckpointStore::OpenVersion: a version read through Download streams, every chunk
// checked against its ChunkRef as it arrives (see internal/remote_store_connection.h for how the
// remote store's files divide).


#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/client/internal/remote_store_connection.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/io/xxh3.h"
#include "libs/rpc/tensor_data_message.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/chunk_layout.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {

using Connection = RemoteCheckpointStore::Connection;

namespace {

using remote_store_internal::TensorAt;

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

  // Streams the chunks `span` of tensor `index` (described by `meta`, from the manifest, whose
  // layout the caller checked), one store chunk at a time, each checked against its ChunkRef: into
  // `destination` (byte_length bytes, for a whole tensor) when it is not null -- each message
  // copied once, straight to its place -- else to `callback`. The tensor's data must be the next
  // on the stream, apart from data of earlier tensors, which is skipped. After an error the
  // stream is mid-tensor and must not be read again; when the error is the stream's own
  // UNAVAILABLE (the store died or was cut off), `*unread` is set to the chunks of `span` that
  // were not delivered, from which a fresh Download can go on.
  absl::Status ReadTensor(int index, const v1::TensorMeta& meta, const ChunkSpan& span,
                          const ChunkCallback& callback, absl::string_view where,
                          char* destination, std::optional<ChunkSpan>* unread) {
    const int64_t length = span.end_offset;
    int64_t received = span.first_offset;
    int chunk_index = span.first_chunk;
    int64_t chunk_offset = span.first_offset;
    std::string& chunk = chunk_;  // reused: no fresh 4 MiB per tensor.
    chunk.clear();
    while (received < length) {
      if (!reader_->Read(&message_)) {
        const grpc::Status status = reader_->Finish();
        open_ = false;
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
          *unread = ChunkSpan{chunk_index, span.end_chunk, chunk_offset, span.end_offset};
        }
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
      if (data.tensor_index < index && received == span.first_offset) continue;  // Not asked for.
      if (data.tensor_index != index || data.offset != received) {
        return absl::InternalError(absl::StrCat(
            "the download of ", where, " sent tensor ", data.tensor_index, " at offset ",
            data.offset, " where tensor ", index, " at offset ", received, " was due"));
      }
      if (data.size > length - received) {
        return absl::DataLossError(absl::StrCat("the download of ", where, " sent bytes up to ",
                                                received + data.size, " of tensor '", meta.key(),
                                                "', where ", length, " was the end"));
      }
      for (absl::string_view bytes : data.pieces) {
        while (!bytes.empty()) {
          const v1::ChunkRef& ref = meta.chunks(chunk_index);
          const int64_t chunk_received = received - chunk_offset;
          const size_t take =
              std::min(bytes.size(), static_cast<size_t>(ref.length() - chunk_received));
          if (chunk_received == 0) hash_.Reset();
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
            hash_.Update(absl::string_view(copied, block));
            done += block;
          }
          bytes.remove_prefix(take);
          received += static_cast<int64_t>(take);
          if (received - chunk_offset < ref.length()) continue;
          const uint64_t xxh3 = hash_.Digest();
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

  explicit DownloadStream(std::shared_ptr<const Connection> connection)
      : connection_(std::move(connection)) {}

  const std::shared_ptr<const Connection> connection_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader_;
  bool open_ = false;  // Finish not called yet.
  v1::Manifest manifest_;
  grpc::ByteBuffer message_;          // the last message read...
  TensorDataResponseReader decoder_;  // ...and views of its bytes.
  std::string chunk_;                 // a chunk being assembled for a callback.
  // XXH3-64 (seed 0, as the store's ChunkRef.xxh3_64) of the chunk being received, so far.
  Xxh3Stream hash_;
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

  // One Download of the range: the server sends the whole chunks that hold it, each is checked
  // here as it arrives, and only the range is copied out.
  absl::Status ReadTensorRange(const v1::TensorMeta& meta, int64_t begin, int64_t end,
                               char* destination) const override {
    ASSIGN_OR_RETURN(const int index, IndexOf(meta));
    const v1::TensorMeta& stored = TensorAt(manifest_, index);
    RETURN_IF_ERROR(CheckChunkLayout(stored, where_));
    ASSIGN_OR_RETURN(const ChunkSpan span, ChunksCovering(stored, begin, end, where_));
    if (span.first_chunk == span.end_chunk) return absl::OkStatus();
    std::unique_ptr<DownloadStream> stream;
    return ReadResuming(
        index, stored, span,
        [&](int64_t offset, absl::string_view chunk) {
          const int64_t from = std::max(begin, offset);
          const int64_t to = std::min(end, offset + static_cast<int64_t>(chunk.size()));
          if (to > from) {
            std::memcpy(destination + (from - begin), chunk.data() + (from - offset),
                        static_cast<size_t>(to - from));
          }
          return absl::OkStatus();
        },
        nullptr, stream, /*rest_of_version=*/false);
  }

 private:
  // A stream that breaks this many times in a row without delivering a chunk in between ends
  // the read with its UNAVAILABLE.
  static constexpr int kMaxFruitlessResumes = 3;

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
    RETURN_IF_ERROR(CheckChunkLayout(stored, where_));  // before a buffer is sized by a chunk
    const ChunkSpan whole{0, stored.chunks_size(), 0, stored.byte_length()};
    if (main_ != nullptr && index == NextOnMainStream()) {
      main_position_ = index + 1;
      // A main stream that failed for good is left null: later reads go one-off.
      return ReadResuming(index, stored, whole, callback, destination, main_,
                          /*rest_of_version=*/true);
    }
    std::unique_ptr<DownloadStream> stream;
    return ReadResuming(index, stored, whole, callback, destination, stream,
                        /*rest_of_version=*/false);
  }

  // Reads `span` of tensor `index` from `stream` -- a Download of just that span when `stream`
  // is null -- and, when the stream breaks with UNAVAILABLE (the store's host died, the client's
  // store list moves on to the successor), goes on from the first chunk it did not deliver on a
  // fresh Download of the same version, by number: a stored version never changes, and every
  // chunk is checked against this reader's manifest anyway. So no byte reaches `callback` or
  // `destination` twice, and a load in flight at a failover finishes instead of failing. With
  // `rest_of_version`, the fresh stream also carries every later tensor (it becomes the main
  // stream); else just the rest of `span`. On failure `stream` is null.
  absl::Status ReadResuming(int index, const v1::TensorMeta& stored, ChunkSpan span,
                            const ChunkCallback& callback, char* destination,
                            std::unique_ptr<DownloadStream>& stream, bool rest_of_version) const {
    for (int fruitless = 0;;) {
      if (stream == nullptr) {
        absl::StatusOr<std::unique_ptr<DownloadStream>> opened =
            DownloadStream::Open(connection_, ResumeRequest(index, stored, span, rest_of_version));
        if (!opened.ok()) return opened.status();
        stream = *std::move(opened);
      }
      std::optional<ChunkSpan> unread;
      absl::Status status =
          stream->ReadTensor(index, stored, span, callback, where_, destination, &unread);
      if (status.ok()) return status;
      stream.reset();
      if (!unread.has_value()) return status;
      fruitless = unread->first_offset > span.first_offset ? 0 : fruitless + 1;
      if (fruitless > kMaxFruitlessResumes) return status;
      span = *unread;
    }
  }

  // A Download of `span` of tensor `index` and, with `rest_of_version`, every later tensor
  // (as byte ranges, which a Download sends in manifest order) up to the first that a range
  // cannot name (a state tensor whose key a model tensor also has).
  v1::DownloadRequest ResumeRequest(int index, const v1::TensorMeta& stored, const ChunkSpan& span,
                                    bool rest_of_version) const {
    v1::DownloadRequest request;
    *request.mutable_ref() = MakeVersionRef(manifest_.model(), manifest_.version());
    request.set_include_state(true);
    v1::TensorByteRange* range = request.add_ranges();
    range->set_key(stored.key());
    range->set_begin(span.first_offset);
    range->set_end(span.end_offset);
    if (!rest_of_version) return request;
    const int count = manifest_.tensors_size() + manifest_.state_tensors_size();
    for (main_end_ = index + 1; main_end_ < count; ++main_end_) {
      const v1::TensorMeta& later = TensorAt(manifest_, main_end_);
      if (main_end_ >= manifest_.tensors_size() && model_index_.contains(later.key())) break;
      if (later.byte_length() == 0) continue;
      range = request.add_ranges();
      range->set_key(later.key());
      range->set_begin(0);
      range->set_end(later.byte_length());
    }
    return request;
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
    const int count = std::min(main_end_, manifest_.tensors_size() + manifest_.state_tensors_size());
    int index = main_position_;
    while (index < count && TensorAt(manifest_, index).byte_length() == 0) ++index;
    return index < count ? index : -1;
  }

  const std::shared_ptr<const Connection> connection_;
  // Reading changes stream positions, while VersionReader's reads are const; a reader is used
  // by one thread at a time, as the interface requires.
  mutable std::unique_ptr<DownloadStream> main_;  // null once it failed.
  mutable int main_position_ = 0;                 // tensors before this were consumed.
  // Tensors from this index on are not on the main stream (a resumed one may stop early).
  mutable int main_end_ = std::numeric_limits<int>::max();
  const v1::Manifest manifest_;
  const std::string where_;
  absl::flat_hash_map<std::string, int> model_index_;
  absl::flat_hash_map<std::string, int> state_index_;
};

}  // namespace

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

}  // namespace ckpt
