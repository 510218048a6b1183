#include "libs/rpc/tensor_data_message.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace ckpt {
namespace {

// Protobuf wire types and the fields of the responses (see the header).
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;
constexpr uint32_t kResponseDataField = 2;
constexpr uint32_t kTensorIndexField = 1;
constexpr uint32_t kOffsetField = 2;
constexpr uint32_t kBytesField = 3;

constexpr uint32_t Tag(uint32_t field, uint32_t wire_type) { return (field << 3) | wire_type; }

size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

void AppendVarint(uint64_t value, std::string& out) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// Reads forward through a message held in several slices.
class SliceCursor {
 public:
  SliceCursor(const std::vector<grpc::Slice>& slices, size_t size)
      : slices_(slices), remaining_(size) {}

  size_t remaining() const { return remaining_; }

  // A varint of at most `max_bytes` bytes (a value: 10).
  bool ReadVarint(uint64_t* value, int max_bytes = 10) {
    *value = 0;
    for (int i = 0, shift = 0; i < max_bytes; ++i, shift += 7) {
      uint8_t byte = 0;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // Tags and lengths as protobuf's parser reads them (at most 5 bytes; a tag fits 32 bits, a
  // length 31). Anything else goes to the generated parser, which rejects or reads it its way.
  bool ReadTag(uint64_t* tag) { return ReadVarint(tag, 5) && *tag <= UINT32_MAX; }
  bool ReadLength(uint64_t* length) {
    return ReadVarint(length, 5) && *length <= static_cast<uint64_t>(INT32_MAX);
  }

  // Moves past `size` bytes, appending views of them to `pieces` when it is not null.
  bool Advance(uint64_t size, std::vector<absl::string_view>* pieces) {
    if (size > remaining_) return false;
    remaining_ -= size;
    while (size > 0) {
      SkipEmptySlices();
      const grpc::Slice& slice = slices_[slice_];
      const size_t take = std::min<uint64_t>(size, slice.size() - position_);
      if (pieces != nullptr) {
        pieces->emplace_back(reinterpret_cast<const char*>(slice.begin()) + position_, take);
      }
      position_ += take;
      size -= take;
    }
    return true;
  }

 private:
  bool ReadByte(uint8_t* byte) {
    if (remaining_ == 0) return false;
    SkipEmptySlices();
    *byte = slices_[slice_].begin()[position_++];
    --remaining_;
    return true;
  }

  // Called only while bytes remain, so a slice with bytes left exists.
  void SkipEmptySlices() {
    while (position_ == slices_[slice_].size()) {
      ++slice_;
      position_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t remaining_;
  size_t slice_ = 0;
  size_t position_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct PayloadPool::Release {
  std::weak_ptr<PayloadPool> pool;
  void operator()(char* buffer) const {
    if (std::shared_ptr<PayloadPool> alive = pool.lock()) {
      alive->Give(buffer);
    } else {
      delete[] buffer;
    }
  }
};

std::shared_ptr<PayloadPool> PayloadPool::Create(size_t buffer_bytes, int max_idle) {
  return std::shared_ptr<PayloadPool>(new PayloadPool(buffer_bytes, max_idle));
}

PayloadPool::~PayloadPool() {
  for (char* buffer : idle_) delete[] buffer;
}

std::shared_ptr<char> PayloadPool::Take() {
  char* buffer = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      buffer = idle_.back();
      idle_.pop_back();
    }
  }
  if (buffer == nullptr) buffer = new char[buffer_bytes_];
  return std::shared_ptr<char>(buffer, Release{weak_from_this()});
}

int PayloadPool::idle() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(idle_.size());
}

void PayloadPool::Give(char* buffer) {
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(idle_.size()) < max_idle_) {
      idle_.push_back(buffer);
      return;
    }
  }
  delete[] buffer;
}

// ---------------------------------------------------------------------------------------------

grpc::ByteBuffer TensorDataResponse(int32_t tensor_index, int64_t offset, absl::string_view payload,
                                    std::shared_ptr<const void> owner) {
  // Fields in number order, zero values left out: what the generated serializer writes.
  // int32 and int64 are varints of the value's 64-bit two's complement.
  const uint64_t index_bits = static_cast<uint64_t>(static_cast<int64_t>(tensor_index));
  const uint64_t offset_bits = static_cast<uint64_t>(offset);
  size_t inner = 0;
  if (index_bits != 0) inner += 1 + VarintSize(index_bits);
  if (offset_bits != 0) inner += 1 + VarintSize(offset_bits);
  if (!payload.empty()) inner += 1 + VarintSize(payload.size()) + payload.size();
  std::string header;
  header.reserve(32);
  AppendVarint(Tag(kResponseDataField, kLengthDelimited), header);
  AppendVarint(inner, header);
  if (index_bits != 0) {
    AppendVarint(Tag(kTensorIndexField, kVarint), header);
    AppendVarint(index_bits, header);
  }
  if (offset_bits != 0) {
    AppendVarint(Tag(kOffsetField, kVarint), header);
    AppendVarint(offset_bits, header);
  }
  if (payload.empty()) {
    grpc::Slice only(header);
    return grpc::ByteBuffer(&only, 1);
  }
  AppendVarint(Tag(kBytesField, kLengthDelimited), header);
  AppendVarint(payload.size(), header);
  // The slice's user data is a heap copy of the owning pointer; gRPC deletes it with the slice.
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  const grpc::Slice slices[2] = {
      grpc::Slice(header),
      grpc::Slice(
          const_cast<char*>(payload.data()), payload.size(),
          [](void* held) { delete static_cast<std::shared_ptr<const void>*>(held); }, keep),
  };
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer, absl::string_view what,
                                 google::protobuf::MessageLite* message) {
  if (!buffer.Valid() || buffer.Length() == 0) {  // an empty message: every field unset.
    message->Clear();
    return absl::OkStatus();
  }
  grpc::ByteBuffer view(buffer);  // shares the slices; the reader needs a mutable buffer.
  grpc::ProtoBufferReader reader(&view);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message of ", buffer.Length(), " bytes is not a valid ", what));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

bool TensorDataResponseReader::ReadFast(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  data_ = TensorDataView();
  if (!buffer.Valid() || !buffer.Dump(&slices_).ok()) return false;
  size_t size = 0;  // of the slices themselves, which Dump may have decompressed.
  for (const grpc::Slice& slice : slices_) size += slice.size();
  SliceCursor cursor(slices_, size);
  uint64_t tag = 0;
  uint64_t length = 0;
  // Exactly one field, the TensorData, filling the message.
  if (!cursor.ReadTag(&tag) || tag != Tag(kResponseDataField, kLengthDelimited) ||
      !cursor.ReadLength(&length) || length != cursor.remaining()) {
    return false;
  }
  while (cursor.remaining() > 0) {
    uint64_t value = 0;
    if (!cursor.ReadTag(&tag)) return false;
    const uint64_t field = tag >> 3;
    const uint32_t wire_type = static_cast<uint32_t>(tag & 7);
    if (field == 0) return false;
    if (field == kTensorIndexField || field == kOffsetField) {
      if (wire_type != kVarint || !cursor.ReadVarint(&value)) return false;
      if (field == kTensorIndexField) {
        data_.tensor_index = static_cast<int32_t>(static_cast<uint32_t>(value));  // low 32 bits
      } else {
        data_.offset = static_cast<int64_t>(value);
      }
      continue;
    }
    if (field == kBytesField) {
      if (wire_type != kLengthDelimited || !cursor.ReadLength(&length)) return false;
      data_.pieces.clear();  // a repeated scalar field: the last one counts.
      data_.size = static_cast<int64_t>(length);
      if (!cursor.Advance(length, &data_.pieces)) return false;
      continue;
    }
    // An unknown field: skipped, as the generated parser would keep it aside.
    switch (wire_type) {
      case kVarint:
        if (!cursor.ReadVarint(&value)) return false;
        break;
      case kFixed64:
        if (!cursor.Advance(8, nullptr)) return false;
        break;
      case kLengthDelimited:
        if (!cursor.ReadLength(&length) || !cursor.Advance(length, nullptr)) return false;
        break;
      case kFixed32:
        if (!cursor.Advance(4, nullptr)) return false;
        break;
      default:  // groups: left to the generated parser.
        return false;
    }
  }
  return true;
}

}  // namespace ckpt
