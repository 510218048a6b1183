// Fuzz target: one message of a tensor-data stream (CheckpointStore.Download, Loader.Load) as
// the client receives it, in 1..4 gRPC slices, through TensorDataResponseReader: the zero-copy
// fast path, and the generated parser it falls back to. Besides never crashing, the decoder must
// agree with the generated parser on every input: same part, and for tensor data the same index,
// offset and bytes (the pieces, in order, are exactly the `data` field). A disagreement aborts.
//
// Input: byte 0 chooses the slice count (bits 0-1) and the response type (bit 2: LoadResponse,
// else DownloadResponse); the rest is the message.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "libs/rpc/tensor_data_message.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace {

void Disagree(const char* what) {
  std::fprintf(stderr, "tensor_data_fuzzer: the decoder and the generated parser disagree: %s\n",
               what);
  std::abort();
}

template <typename Response>
void Check(const std::string& message, const grpc::ByteBuffer& buffer) {
  ckpt::TensorDataResponseReader reader;
  ckpt::v1::Manifest manifest;
  absl::StatusOr<ckpt::ResponsePart> part = reader.Read<Response>(buffer, &manifest);
  Response expected;
  const bool parsed = expected.ParseFromString(message);
  if (!parsed) {
    if (part.ok()) Disagree("accepted a message the generated parser rejects");
    return;
  }
  if (!part.ok()) Disagree("rejected a message the generated parser reads");
  switch (expected.part_case()) {
    case Response::kManifest:
      if (*part != ckpt::ResponsePart::kManifest) Disagree("missed the manifest");
      // Compared field by field: the serialization of map fields has no fixed order.
      if (!google::protobuf::util::MessageDifferencer::Equals(manifest, expected.manifest())) {
        Disagree("manifest differs");
      }
      return;
    case Response::kData: {
      if (*part != ckpt::ResponsePart::kData) Disagree("missed the tensor data");
      const ckpt::TensorDataView& view = reader.data();
      std::string bytes;
      for (absl::string_view piece : view.pieces) bytes.append(piece.data(), piece.size());
      if (view.tensor_index != expected.data().tensor_index()) Disagree("tensor_index differs");
      if (view.offset != expected.data().offset()) Disagree("offset differs");
      if (view.size != static_cast<int64_t>(bytes.size())) Disagree("size is not the pieces'");
      if (bytes != expected.data().data()) Disagree("bytes differ");
      return;
    }
    default:
      if (*part != ckpt::ResponsePart::kNeither) Disagree("found a part that is not there");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int slice_count = 1 + (data[0] & 3);
  const bool load = (data[0] & 4) != 0;
  const std::string message(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<grpc::Slice> slices;
  const size_t step = message.size() / slice_count + 1;
  for (size_t at = 0; at < message.size(); at += step) {
    slices.emplace_back(message.data() + at, std::min(step, message.size() - at));
  }
  if (slices.empty()) slices.emplace_back(std::string());
  const grpc::ByteBuffer buffer(slices.data(), slices.size());
  if (load) {
    Check<ckpt::v1::LoadResponse>(message, buffer);
  } else {
    Check<ckpt::v1::DownloadResponse>(message, buffer);
  }
  return 0;
}
