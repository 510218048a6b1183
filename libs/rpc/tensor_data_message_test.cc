#include "libs/rpc/tensor_data_message.h"

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// `bytes` as a buffer of slices cut at `cuts` (ascending offsets).
grpc::ByteBuffer Split(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t start = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + start, cut - start);
    start = cut;
  }
  slices.emplace_back(bytes.data() + start, bytes.size() - start);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer Whole(const std::string& bytes) { return Split(bytes, {}); }

std::string Joined(const TensorDataView& view) {
  std::string bytes;
  for (absl::string_view piece : view.pieces) bytes.append(piece.data(), piece.size());
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), view.size);
  return bytes;
}

v1::DownloadResponse DataResponse(int32_t index, int64_t offset, const std::string& bytes) {
  v1::DownloadResponse response;
  response.mutable_data()->set_tensor_index(index);
  response.mutable_data()->set_offset(offset);
  response.mutable_data()->set_data(bytes);
  return response;
}

TEST(TensorDataResponseTest, WritesWhatTheGeneratedSerializerWrites) {
  const std::string payload = "0123456789abcdef";
  struct Case {
    int32_t index;
    int64_t offset;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {0, 0, payload},
      {3, 1 << 20, payload},
      {-1, 0, payload},
      {std::numeric_limits<int32_t>::max(), std::numeric_limits<int64_t>::max(), "x"},
      {7, 12, ""},
      {0, 0, ""},
      {1, 5, std::string(300, 'q')},  // a two-byte length
  };
  for (const Case& c : cases) {
    auto owner = std::make_shared<std::string>(c.bytes);
    const grpc::ByteBuffer buffer = TensorDataResponse(c.index, c.offset, *owner, owner);
    EXPECT_EQ(Flatten(buffer), DataResponse(c.index, c.offset, c.bytes).SerializeAsString())
        << "index " << c.index << " offset " << c.offset << " bytes " << c.bytes.size();
  }
}

TEST(TensorDataResponseTest, SendsThePayloadFromItsOwnMemory) {
  auto owner = std::make_shared<std::string>(4096, 'z');
  const grpc::ByteBuffer buffer = TensorDataResponse(2, 8, *owner, owner);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), owner->data());
  EXPECT_EQ(slices[1].size(), owner->size());
}

TEST(TensorDataResponseTest, KeepsTheOwnerAliveUntilTheLastSliceGoes) {
  std::shared_ptr<PayloadPool> pool = PayloadPool::Create(1024, 4);
  std::shared_ptr<char> chunk = pool->Take();
  std::memset(chunk.get(), 'a', 1024);
  auto buffer = std::make_unique<grpc::ByteBuffer>(
      TensorDataResponse(0, 0, absl::string_view(chunk.get(), 1024), chunk));
  chunk.reset();
  EXPECT_EQ(pool->idle(), 0);  // the buffer's slice holds it.
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer->Dump(&slices).ok());
  buffer.reset();
  EXPECT_EQ(pool->idle(), 0);  // a dumped slice still does.
  EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin())[1023], 'a');
  slices.clear();
  EXPECT_EQ(pool->idle(), 1);
}

TEST(PayloadPoolTest, ReusesReleasedBuffersUpToItsLimit) {
  std::shared_ptr<PayloadPool> pool = PayloadPool::Create(64, 1);
  std::shared_ptr<char> first = pool->Take();
  std::shared_ptr<char> second = pool->Take();
  char* const first_memory = first.get();
  EXPECT_NE(first_memory, second.get());
  first.reset();
  second.reset();  // beyond max_idle: freed.
  EXPECT_EQ(pool->idle(), 1);
  EXPECT_EQ(pool->Take().get(), first_memory);
}

TEST(PayloadPoolTest, BuffersMayOutliveThePool) {
  std::shared_ptr<PayloadPool> pool = PayloadPool::Create(64, 2);
  std::shared_ptr<char> held = pool->Take();
  std::shared_ptr<char> idle = pool->Take();
  idle.reset();
  pool.reset();
  held.get()[63] = 1;  // still valid; freed below without a pool (ASan checks both).
  held.reset();
}

TEST(TensorDataResponseReaderTest, ReadsItsOwnEncodingWithoutCopying) {
  auto owner = std::make_shared<std::string>(1 << 16, 'k');
  const grpc::ByteBuffer buffer = TensorDataResponse(4, 1 << 20, *owner, owner);
  TensorDataResponseReader reader;
  v1::Manifest manifest;
  ASSERT_OK_AND_ASSIGN(ResponsePart part, reader.Read<v1::DownloadResponse>(buffer, &manifest));
  EXPECT_EQ(part, ResponsePart::kData);
  EXPECT_TRUE(reader.last_read_was_fast());
  EXPECT_EQ(reader.data().tensor_index, 4);
  EXPECT_EQ(reader.data().offset, 1 << 20);
  ASSERT_EQ(reader.data().pieces.size(), 1u);
  EXPECT_EQ(reader.data().pieces[0].data(), owner->data());
  EXPECT_EQ(Joined(reader.data()), *owner);
}

TEST(TensorDataResponseReaderTest, ReadsAMessageCutIntoSlicesAnywhere) {
  const std::string payload = "the quick brown fox jumps";
  const std::string bytes = DataResponse(300, 70000, payload).SerializeAsString();
  for (size_t first = 0; first <= bytes.size(); ++first) {
    for (size_t second = first; second <= bytes.size(); ++second) {
      TensorDataResponseReader reader;
      v1::Manifest manifest;
      ASSERT_OK_AND_ASSIGN(ResponsePart part, reader.Read<v1::DownloadResponse>(
                                                  Split(bytes, {first, second}), &manifest));
      ASSERT_EQ(part, ResponsePart::kData);
      EXPECT_TRUE(reader.last_read_was_fast());
      EXPECT_EQ(reader.data().tensor_index, 300);
      EXPECT_EQ(reader.data().offset, 70000);
      EXPECT_EQ(Joined(reader.data()), payload) << "cuts at " << first << ", " << second;
    }
  }
}

TEST(TensorDataResponseReaderTest, ReadsTheManifest) {
  v1::DownloadResponse response;
  response.mutable_manifest()->set_model("m");
  response.mutable_manifest()->set_version(7);
  TensorDataResponseReader reader;
  v1::Manifest manifest;
  ASSERT_OK_AND_ASSIGN(ResponsePart part, reader.Read<v1::DownloadResponse>(
                                              Whole(response.SerializeAsString()), &manifest));
  EXPECT_EQ(part, ResponsePart::kManifest);
  EXPECT_EQ(manifest.model(), "m");
  EXPECT_EQ(manifest.version(), 7);
}

TEST(TensorDataResponseReaderTest, ReadsLoadResponsesToo) {
  v1::LoadResponse response;
  response.mutable_data()->set_tensor_index(2);
  response.mutable_data()->set_data("abc");
  TensorDataResponseReader reader;
  v1::Manifest manifest;
  ASSERT_OK_AND_ASSIGN(ResponsePart part, reader.Read<v1::LoadResponse>(
                                              Whole(response.SerializeAsString()), &manifest));
  EXPECT_EQ(part, ResponsePart::kData);
  EXPECT_EQ(reader.data().tensor_index, 2);
  EXPECT_EQ(Joined(reader.data()), "abc");
}

TEST(TensorDataResponseReaderTest, AnEmptyResponseHasNeitherPart) {
  TensorDataResponseReader reader;
  v1::Manifest manifest;
  ASSERT_OK_AND_ASSIGN(ResponsePart part,
                       reader.Read<v1::DownloadResponse>(grpc::ByteBuffer(), &manifest));
  EXPECT_EQ(part, ResponsePart::kNeither);
}

// Encodings other than the usual one mean what the generated parser says they mean.
TEST(TensorDataResponseReaderTest, UnusualEncodingsReadAsTheGeneratedParserReadsThem) {
  std::string fields_reversed;  // data, offset, index; an unknown varint field 9 in between.
  fields_reversed += "\x1a\x03xyz";
  fields_reversed += "\x48\x05";
  fields_reversed += "\x10\x07";
  fields_reversed += "\x08\x02";
  const std::string repeated_bytes =
      std::string("\x1a\x02", 2) + "ab" + std::string("\x1a\x03", 2) + "cde";
  // A tag varint over 32 bits: protobuf keeps its low 32 bits (here: tensor_index again).
  const std::string long_tag("\x08\x05\x88\x80\x80\x80\x10\x07", 8);
  const std::vector<std::string> inner = {fields_reversed, repeated_bytes, long_tag};
  std::vector<std::string> messages;
  for (const std::string& body : inner) {
    messages.push_back(std::string("\x12") + static_cast<char>(body.size()) + body);
  }
  // TensorData twice at the top level (merged), and an unknown top-level field after it.
  messages.push_back(messages[0] + messages[1]);
  messages.push_back(messages[0] + std::string("\x30\x01", 2));
  for (const std::string& bytes : messages) {
    v1::DownloadResponse expected;
    ASSERT_TRUE(expected.ParseFromString(bytes));
    ASSERT_TRUE(expected.has_data());
    TensorDataResponseReader reader;
    v1::Manifest manifest;
    ASSERT_OK_AND_ASSIGN(ResponsePart part,
                         reader.Read<v1::DownloadResponse>(Whole(bytes), &manifest));
    ASSERT_EQ(part, ResponsePart::kData);
    EXPECT_EQ(reader.data().tensor_index, expected.data().tensor_index());
    EXPECT_EQ(reader.data().offset, expected.data().offset());
    EXPECT_EQ(Joined(reader.data()), expected.data().data());
  }
}

TEST(TensorDataResponseReaderTest, RejectsWhatIsNotAResponse) {
  TensorDataResponseReader reader;
  v1::Manifest manifest;
  // A TensorData that claims more bytes than follow, and a lone invalid tag.
  for (const std::string& bytes : {std::string("\x12\x05\x1a\x09xyz", 7), std::string("\x07")}) {
    EXPECT_THAT(reader.Read<v1::DownloadResponse>(Whole(bytes), &manifest),
                StatusIs(absl::StatusCode::kInternal));
  }
}

// Random damage to valid messages: whatever the fast path accepts, the generated parser reads
// the same way.
TEST(TensorDataResponseReaderTest, AgreesWithTheGeneratedParserOnDamagedMessages) {
  std::mt19937 random(12345);
  const std::string valid = DataResponse(9, 4096, std::string(40, 'p')).SerializeAsString();
  int fast = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes = valid;
    const int edits = 1 + static_cast<int>(random() % 3);
    for (int e = 0; e < edits; ++e) {
      bytes[random() % bytes.size()] = static_cast<char>(random() % 256);
    }
    if (random() % 4 == 0) bytes.resize(random() % bytes.size());
    v1::DownloadResponse expected;
    const bool parses = expected.ParseFromString(bytes);
    TensorDataResponseReader reader;
    v1::Manifest manifest;
    absl::StatusOr<ResponsePart> part = reader.Read<v1::DownloadResponse>(Whole(bytes), &manifest);
    ASSERT_EQ(part.ok(), parses) << "trial " << trial;
    if (!parses) continue;
    if (reader.last_read_was_fast()) ++fast;
    ASSERT_EQ(*part == ResponsePart::kData, expected.has_data()) << "trial " << trial;
    if (!expected.has_data()) continue;
    EXPECT_EQ(reader.data().tensor_index, expected.data().tensor_index()) << "trial " << trial;
    EXPECT_EQ(reader.data().offset, expected.data().offset()) << "trial " << trial;
    EXPECT_EQ(Joined(reader.data()), expected.data().data()) << "trial " << trial;
  }
  EXPECT_GT(fast, 100);  // the fast path was exercised, not only the fallback.
}

TEST(ByteBufferMessagesTest, RoundTripAndRejectGarbage) {
  v1::DownloadRequest request;
  request.add_keys("w");
  request.set_include_state(true);
  v1::DownloadRequest parsed;
  ASSERT_OK(ParseFromByteBuffer(SerializeToByteBuffer(request), "DownloadRequest", &parsed));
  EXPECT_EQ(parsed.keys(0), "w");
  EXPECT_TRUE(parsed.include_state());
  EXPECT_THAT(ParseFromByteBuffer(Whole("\xff\xff"), "DownloadRequest", &parsed),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ckpt
