#ifndef CKPT_LIBS_RPC_TENSOR_DATA_MESSAGE_H_
#define CKPT_LIBS_RPC_TENSOR_DATA_MESSAGE_H_

// The responses of the streams that carry tensor bytes (CheckpointStore.Download, Loader.Load)
// share one shape:
//
//   message XResponse { oneof part { Manifest manifest = 1; TensorData data = 2; } }
//   message TensorData { int32 tensor_index = 1; int64 offset = 2; bytes data = 3; }
//
// Sent and received through the generated classes, every byte is copied three more times than
// the wire needs: into the message (set_data), into gRPC's slices (serialization) and out of them
// again (parsing). Here the same wire format is written from, and read in, the bytes' own memory:
// the sender's payload becomes a gRPC slice as it is, and the receiver gets views into the slices
// gRPC received. The bytes on the wire are exactly what SerializeToString writes, so either end
// may be any protobuf implementation. The fast path reads a response that is one TensorData field
// (its fields in any order, unknown ones skipped); anything else (the manifest, a second oneof
// member, unknown top-level fields, groups, oversized varints) is parsed by the generated class.
//
// Example, server (a raw callback method, ServerWriteReactor<grpc::ByteBuffer>):
//   std::shared_ptr<char> chunk = pool->Take();            // kChunkBytes, reused
//   ... fill chunk.get() ...
//   response_ = TensorDataResponse(index, offset, absl::string_view(chunk.get(), n), chunk);
//   StartWrite(&response_);
// Example, client (a ClientReader<grpc::ByteBuffer>):
//   TensorDataResponseReader decoder;
//   while (reader->Read(&buffer)) {
//     ASSIGN_OR_RETURN(ResponsePart part, decoder.Read<v1::DownloadResponse>(buffer, &manifest));
//     if (part == ResponsePart::kData) for (absl::string_view piece : decoder.data().pieces) ...
//   }

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

// Fixed-size buffers for outgoing payloads. gRPC may hold a payload's slice after the write that
// sent it has completed, so a payload is shared: it comes back to the pool when the last slice
// that points into it is released, and is handed out again by a later Take. Thread-safe; a
// buffer released after the pool is gone is freed.
class PayloadPool : public std::enable_shared_from_this<PayloadPool> {
 public:
  // Buffers of `buffer_bytes`; at most `max_idle` released ones are kept for reuse.
  static std::shared_ptr<PayloadPool> Create(size_t buffer_bytes, int max_idle);

  ~PayloadPool();
  PayloadPool(const PayloadPool&) = delete;
  PayloadPool& operator=(const PayloadPool&) = delete;

  size_t buffer_bytes() const { return buffer_bytes_; }

  // A buffer of buffer_bytes() bytes, contents undefined: an idle one when there is one (its
  // pages are already faulted in), else a new one.
  std::shared_ptr<char> Take();

  // Released buffers kept for reuse (for tests).
  int idle() const;

 private:
  struct Release;
  PayloadPool(size_t buffer_bytes, int max_idle)
      : buffer_bytes_(buffer_bytes), max_idle_(max_idle) {}
  void Give(char* buffer);

  const size_t buffer_bytes_;
  const int max_idle_;
  mutable absl::Mutex mu_;
  std::vector<char*> idle_ ABSL_GUARDED_BY(mu_);
};

// A response holding TensorData{tensor_index, offset, data = payload}. `payload` is not copied:
// the buffer's slice points into it and keeps `owner` (the memory `payload` lies in) alive until
// gRPC is done with it. Take `payload` from the owner before the call when passing
// std::move(owner): the order in which arguments are evaluated is unspecified.
grpc::ByteBuffer TensorDataResponse(int32_t tensor_index, int64_t offset, absl::string_view payload,
                                    std::shared_ptr<const void> owner);

// `message` serialized into a buffer (for the manifest response and other small messages).
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message);

// Parses `buffer` into `message`; INVALID_ARGUMENT naming `what` when it is not one.
absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer, absl::string_view what,
                                 google::protobuf::MessageLite* message);

enum class ResponsePart { kManifest, kData, kNeither };

// The bytes of one TensorData response: `pieces`, in order, are views into the received slices.
struct TensorDataView {
  int32_t tensor_index = 0;
  int64_t offset = 0;
  int64_t size = 0;  // total bytes of `pieces`.
  std::vector<absl::string_view> pieces;
};

// Reads the responses of one stream. The views of data() stay valid until the next Read.
class TensorDataResponseReader {
 public:
  // Reads `buffer`: the manifest into *manifest (kManifest), tensor bytes into data() (kData),
  // or kNeither for a response with neither set. INTERNAL when it is not a `Response` at all.
  template <typename Response>
  absl::StatusOr<ResponsePart> Read(const grpc::ByteBuffer& buffer, v1::Manifest* manifest);

  const TensorDataView& data() const { return data_; }

  // Whether the last Read took the fast path (for tests).
  bool last_read_was_fast() const { return last_read_was_fast_; }

 private:
  // Reads a response that is exactly one TensorData field into data_ without copying its bytes.
  // False (data_ undefined) for anything else, which the generated parser then reads.
  bool ReadFast(const grpc::ByteBuffer& buffer);

  std::vector<grpc::Slice> slices_;  // what data_.pieces point into.
  std::string slow_bytes_;           // ...or, after the slow path, this.
  TensorDataView data_;
  bool last_read_was_fast_ = false;
};

template <typename Response>
absl::StatusOr<ResponsePart> TensorDataResponseReader::Read(const grpc::ByteBuffer& buffer,
                                                            v1::Manifest* manifest) {
  last_read_was_fast_ = ReadFast(buffer);
  if (last_read_was_fast_) return ResponsePart::kData;
  Response response;
  if (absl::Status parsed = ParseFromByteBuffer(buffer, Response::descriptor()->name(), &response);
      !parsed.ok()) {
    return absl::InternalError(parsed.message());
  }
  switch (response.part_case()) {
    case Response::kManifest:
      *manifest = std::move(*response.mutable_manifest());
      return ResponsePart::kManifest;
    case Response::kData: {
      v1::TensorData& data = *response.mutable_data();
      slices_.clear();
      slow_bytes_ = std::move(*data.mutable_data());
      data_.tensor_index = data.tensor_index();
      data_.offset = data.offset();
      data_.size = static_cast<int64_t>(slow_bytes_.size());
      data_.pieces.assign(1, slow_bytes_);
      return ResponsePart::kData;
    }
    default:
      return ResponsePart::kNeither;
  }
}

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_TENSOR_DATA_MESSAGE_H_
