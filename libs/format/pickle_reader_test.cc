#include "libs/format/pickle_reader.h"

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "ATen/TensorOperators.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

// A byte string literal that may hold NULs.
template <size_t N>
std::string B(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs testdata/make_pickle_fixtures.py with real Python once for the whole binary.
class PickleFixtures : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* python = std::getenv("PYTHON");
    const std::string command =
        absl::StrCat(python ? python : "/usr/bin/python3",
                     " libs/format/testdata/make_pickle_fixtures.py ", TmpDir());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
};
::testing::Environment* const kFixtures = ::testing::AddGlobalTestEnvironment(new PickleFixtures);

Value Ints(std::initializer_list<int64_t> values) {
  std::vector<Value> items;
  for (int64_t v : values) items.push_back(Value::Int(v));
  return Value::List(std::move(items));
}

Value BigInt(const std::string& decimal) {
  return Value::Opaque("builtins.int", Value::Tuple({Value::String(decimal)}), Value::None());
}

std::string AllBytes() {
  std::string out;
  for (int i = 0; i < 256; ++i) out.push_back(static_cast<char>(i));
  return out;
}

// What make_pickle_fixtures.reference() is, as the reader represents it.
Value ExpectedReference() {
  Value shared = Ints({1, 2});
  Value v = Value::Dict();
  v.Set("none", Value::None());
  v.Set("true", Value::Bool(true));
  v.Set("false", Value::Bool(false));
  v.Set("ints", Ints({0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648LL,
                      2147483648LL, INT64_MAX, INT64_MIN}));
  v.Set("big", Value::List({BigInt("18446744073709551616"), BigInt("-18446744073709551621"),
                            BigInt("1000000000000000000000000000000")}));
  v.Set("floats", Value::List({Value::Float(0.0), Value::Float(1.5), Value::Float(-2.25),
                               Value::Float(1e300), Value::Float(INFINITY)}));
  v.Set("str", Value::List({Value::String(""), Value::String("plain"),
                            Value::String("h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93"),
                            Value::String("quote's \"double\" \\ back\nnewline"),
                            Value::String("\xf0\x9f\x98\x80")}));
  v.Set("bytes", Value::List({Value::Bytes(""), Value::Bytes(std::string("\x00\x01\xff", 3)),
                              Value::Bytes(AllBytes())}));
  v.Set("bytearray", Value::Bytes(std::string("ab\x00\xff", 4)));
  v.Set("tuples",
        Value::List({Value::Tuple(), Value::Tuple({Value::Int(1)}),
                     Value::Tuple({Value::Int(1), Value::Int(2)}),
                     Value::Tuple({Value::Int(1), Value::Int(2), Value::Int(3)}),
                     Value::Tuple({Value::Int(1), Value::Int(2), Value::Int(3), Value::Int(4)})}));
  v.Set("int_keys",
        Value::Dict(
            {{0, Value::String("zero")}, {7, Value::String("seven")}, {-3, Value::String("neg")}}));
  v.Set("ordered", Value::Dict({{"b", Value::Int(1)}, {"a", Value::Int(2)}}));
  v.Set("set", Ints({3}));
  v.Set("frozenset", Ints({4}));
  v.Set("shared", Value::Tuple({shared, shared}));
  v.Set("nested",
        Value::Dict(
            {{"a", Value::Dict({{"b", Value::Dict({{"c", Value::List({Value::List()})}})}})}}));
  v.Set("tuple_keys",
        Value::Opaque("builtins.dict",
                      Value::Tuple({Value::List({Value::Tuple(
                          {Value::Tuple({Value::Int(1), Value::Int(2)}), Value::String("x")})})}),
                      Value::None()));
  v.Set("complex",
        Value::Opaque("builtins.complex", Value::Tuple({Value::Float(1.0), Value::Float(2.0)}),
                      Value::None()));
  return v;
}

class ReferencePickleTest : public ::testing::TestWithParam<int> {};

TEST_P(ReferencePickleTest, ReadsWhatPythonWroteExactly) {
  const std::string bytes =
      ReadFileOrDie(absl::StrCat(TmpDir(), "/reference_p", GetParam(), ".pkl"));
  ASSERT_OK_AND_ASSIGN(Value value, ReadPickleBytes(bytes));
  const Value expected = ExpectedReference();
  // Entry by entry first, for a readable failure.
  ASSERT_TRUE(value.is_dict()) << value.DebugString();
  for (const auto& [key, expected_child] : expected.entries()) {
    const Value* child = value.Find(key);
    ASSERT_NE(child, nullptr) << key.DebugString();
    EXPECT_EQ(*child, expected_child) << key.DebugString() << ": " << child->DebugString() << " vs "
                                      << expected_child.DebugString();
  }
  EXPECT_EQ(value, expected);
}

TEST_P(ReferencePickleTest, KeepsUserClassesAsOpaqueData) {
  const std::string bytes = ReadFileOrDie(absl::StrCat(TmpDir(), "/objects_p", GetParam(), ".pkl"));
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "objects.pkl");
  ASSERT_OK_AND_ASSIGN(PickleResult result, ReadPickle(*source, 0, PickleOptions(), nullptr));
  const Value& list = result.value;
  ASSERT_TRUE(list.is_list()) << list.DebugString();
  ASSERT_EQ(list.items().size(), 3u);

  const Value& point = list.items()[0];
  ASSERT_TRUE(point.is_opaque());
  EXPECT_EQ(point.opaque_class_name(), "__main__.Point");
  EXPECT_EQ(point.opaque_state(), Value::Dict({{"x", Value::Int(1)}, {"y", Value::String("two")}}));

  const Value& tagged = list.items()[1];
  ASSERT_TRUE(tagged.is_opaque());
  EXPECT_EQ(tagged.opaque_class_name(), "__main__.Tagged");
  const Value& items = list.items()[2];
  EXPECT_EQ(items.opaque_class_name(), "__main__.Items");
  if (GetParam() >= 2) {
    // NEWOBJ, then SETITEMS / APPENDS on the object, then BUILD with its __dict__.
    EXPECT_EQ(tagged.opaque_state(), Value::Tuple({Value::Dict({{"note", Value::String("hi")}}),
                                                   Value::Dict({{"k", Value::Int(1)}})}));
    EXPECT_EQ(items.opaque_state(), Ints({5, 6}));
  } else {
    // copyreg._reconstructor(cls, base, base(obj)): the base's value is the argument.
    EXPECT_EQ(tagged.opaque_args(), Value::Tuple({Value::Dict({{"k", Value::Int(1)}})}));
    EXPECT_EQ(tagged.opaque_state(), Value::Dict({{"note", Value::String("hi")}}));
    EXPECT_EQ(items.opaque_args(), Value::Tuple({Ints({5, 6})}));
  }
  EXPECT_THAT(result.warnings, ::testing::Contains(HasSubstr("'__main__.Point' as opaque")));
  EXPECT_EQ(result.end_offset, bytes.size());
}

INSTANTIATE_TEST_SUITE_P(AllProtocols, ReferencePickleTest, ::testing::Range(0, 6));

TEST(PickleReaderTest, ReadsPicklesLargerThanItsBuffer) {
  for (int protocol : {0, 2}) {
    const std::string bytes = ReadFileOrDie(absl::StrCat(TmpDir(), "/big_p", protocol, ".pkl"));
    ASSERT_GT(bytes.size(), 200000u);
    ASSERT_OK_AND_ASSIGN(Value value, ReadPickleBytes(bytes));
    ASSERT_TRUE(value.is_list());
    ASSERT_EQ(value.items().size(), 20001u);
    EXPECT_EQ(value.items()[0], Value::String(std::string(100000, 'x')));
    for (int i = 0; i < 20000; ++i) {
      ASSERT_EQ(value.items()[i + 1], Value::String(absl::StrCat("s", i))) << i;
    }
  }
}

TEST(PickleReaderTest, NewObjExKeepsKeywordArguments) {
  const std::string bytes = ReadFileOrDie(TmpDir() + "/kwargs_p4.pkl");
  ASSERT_OK_AND_ASSIGN(Value value, ReadPickleBytes(bytes));
  EXPECT_EQ(value,
            Value::Opaque("__main__.WithKwargs",
                          Value::Tuple({Value::Tuple(), Value::Dict({{"size", Value::Int(3)}})}),
                          Value::Dict({{"size", Value::Int(3)}})));
}

TEST(PickleReaderTest, EveryTruncationIsAnErrorNotACrash) {
  for (int protocol : {0, 2, 4}) {
    const std::string bytes =
        ReadFileOrDie(absl::StrCat(TmpDir(), "/reference_p", protocol, ".pkl"));
    for (size_t size = 0; size < bytes.size(); ++size) {
      EXPECT_FALSE(ReadPickleBytes(bytes.substr(0, size)).ok())
          << "protocol " << protocol << ", prefix of " << size << " bytes";
    }
  }
}

TEST(PickleReaderTest, RandomCorruptionNeverCrashes) {
  std::mt19937 random(1234);
  for (int protocol : {0, 2, 4, 5}) {
    const std::string bytes =
        ReadFileOrDie(absl::StrCat(TmpDir(), "/reference_p", protocol, ".pkl"));
    for (int round = 0; round < 500; ++round) {
      std::string mutated = bytes;
      const int flips = 1 + random() % 4;
      for (int i = 0; i < flips; ++i) {
        mutated[random() % mutated.size()] = static_cast<char>(random() % 256);
      }
      (void)ReadPickleBytes(mutated);  // Any status is fine; crashing or hanging is not.
    }
  }
}

TEST(PickleReaderTest, UnknownOpcodeNamesItsOffset) {
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01\xff."),
              StatusIs(absl::StatusCode::kInvalidArgument, "pickle offset 4: unknown opcode 0xff"));
}

TEST(PickleReaderTest, GetOfAnUnsetMemoIndexIsAnError) {
  EXPECT_THAT(ReadPickleBytes(B("\x80\x02]q\x00h\x07.")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "offset 5: BINGET of memo index 7 that was never PUT"));
  EXPECT_THAT(ReadPickleBytes("g12\n."),
              StatusIs(absl::StatusCode::kInvalidArgument, "GET of memo index 12"));
  EXPECT_THAT(ReadPickleBytes(std::string("j\x00\x00\x00\x80.", 6)),
              StatusIs(absl::StatusCode::kInvalidArgument, "LONG_BINGET of memo index 2147483648"));
  EXPECT_THAT(ReadPickleBytes(B("\x80\x02q\x00.")),
              StatusIs(absl::StatusCode::kInvalidArgument, "PUT needs an object on the stack"));
}

TEST(PickleReaderTest, StackMisuseIsAnError) {
  EXPECT_THAT(ReadPickleBytes("\x80\x02"
                              "a."),
              StatusIs(absl::StatusCode::kInvalidArgument, "APPEND needs an object on the stack"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02]("
                              "K\x01u."),
              StatusIs(absl::StatusCode::kInvalidArgument, "SETITEMS with an odd number (1)"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01(\x86."),
              StatusIs(absl::StatusCode::kInvalidArgument, "TUPLE2 needs 2 objects"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01t."),
              StatusIs(absl::StatusCode::kInvalidArgument, "TUPLE without a MARK"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01]s."),
              StatusIs(absl::StatusCode::kInvalidArgument, "SETITEM needs an object"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01K\x02K\x03s."),
              StatusIs(absl::StatusCode::kInvalidArgument, "SETITEM on a int, expected a dict"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02."),
              StatusIs(absl::StatusCode::kInvalidArgument, "STOP needs an object"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01K\x02R."),
              StatusIs(absl::StatusCode::kInvalidArgument, "REDUCE: arguments are a int"));
}

TEST(PickleReaderTest, LengthsBeyondTheInputFailBeforeAllocating) {
  EXPECT_THAT(ReadPickleBytes("\x80\x02X\xff\xff\xff\xff"
                              "abc."),
              StatusIs(absl::StatusCode::kDataLoss,
                       "offset 2: BINUNICODE needs 4294967295 bytes but only 4 remain"));
  EXPECT_THAT(ReadPickleBytes("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\x7f."),
              StatusIs(absl::StatusCode::kDataLoss, "BINBYTES8 needs 9223372036854775807"));
  EXPECT_THAT(ReadPickleBytes(B("\x80\x04\x95\xff\xff\xff\xff\xff\x00\x00\x00.")),
              StatusIs(absl::StatusCode::kDataLoss, "FRAME needs"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02\x8b\xff\xff\xff\xff."),
              StatusIs(absl::StatusCode::kInvalidArgument, "LONG4 with negative length"));
  EXPECT_THAT(
      ReadPickleBytes(B("\x80\x02\x8b\x00\x00\x10\x00.")),
      StatusIs(absl::StatusCode::kInvalidArgument, "integer of 1048576 bytes is too large"));
  EXPECT_THAT(ReadPickleBytes(B("\x80\x02T\x00\x00\x00\x80.")),
              StatusIs(absl::StatusCode::kInvalidArgument, "BINSTRING with negative length"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01"),
              StatusIs(absl::StatusCode::kDataLoss, "ends without a STOP"));
  EXPECT_THAT(ReadPickleBytes("cos\nsys"),
              StatusIs(absl::StatusCode::kDataLoss, "GLOBAL: no newline"));
}

TEST(PickleReaderTest, DeepNestingIsRefusedNotAStackOverflow) {
  const int depth = 100000;
  std::string bytes = "\x80\x02";
  bytes.append(depth, ']');
  bytes.append(depth - 1, 'a');
  bytes += '.';
  EXPECT_THAT(ReadPickleBytes(bytes),
              StatusIs(absl::StatusCode::kResourceExhausted, "nest deeper than 512 levels"));
}

TEST(PickleReaderTest, SharedReferenceBlowUpIsBounded) {
  // x = []; then 80 times x = (x, x): 2^80 values if expanded naively.
  std::string bytes = "\x80\x02]";
  for (int i = 0; i < 80; ++i) bytes += "2\x86";
  bytes += '.';
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "laughs.pkl");
  PickleOptions options;
  options.max_values = 100000;  // The default (2 Mi + 4 per byte) fails the same way, slower.
  EXPECT_THAT(ReadPickle(*source, 0, options, nullptr),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "laughs.pkl: the pickle expands to more than 100000 values"));
}

TEST(PickleReaderTest, CyclesBecomeMarkedReferences) {
  const std::string bytes =
      B("\x80\x02]q\x00h\x00"
        "a.");
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "cycle.pkl");
  ASSERT_OK_AND_ASSIGN(PickleResult result, ReadPickle(*source, 0, PickleOptions(), nullptr));
  EXPECT_EQ(result.value,
            Value::List({Value::Opaque("ckpt.RecursiveReference",
                                       Value::Tuple({Value::String("list")}), Value::None())}));
  EXPECT_THAT(result.warnings, ::testing::Contains(HasSubstr("contains itself")));
}

TEST(PickleReaderTest, NothingOutsideTheAllowListIsExecuted) {
  // os.system('ls') and builtins.eval("...") are recorded, not called.
  const std::string bytes =
      B("\x80\x02(cos\nsystem\nX\x02\x00\x00\x00ls\x85R"
        "cbuiltins\neval\nX\x03\x00\x00\x00"
        "1+1\x85Rl.");
  std::unique_ptr<ByteSource> source = MemorySource(bytes, "evil.pkl");
  ASSERT_OK_AND_ASSIGN(PickleResult result, ReadPickle(*source, 0, PickleOptions(), nullptr));
  EXPECT_EQ(
      result.value,
      Value::List(
          {Value::Opaque("os.system", Value::Tuple({Value::String("ls")}), Value::None()),
           Value::Opaque("builtins.eval", Value::Tuple({Value::String("1+1")}), Value::None())}));
  EXPECT_THAT(result.warnings,
              ::testing::ElementsAre(HasSubstr("'os.system'"), HasSubstr("'builtins.eval'")));
}

TEST(PickleReaderTest, UnsupportedFeaturesAreUnimplemented) {
  EXPECT_THAT(ReadPickleBytes("\x80\x02\x82\x01."),
              StatusIs(absl::StatusCode::kUnimplemented, "EXT1"));
  EXPECT_THAT(ReadPickleBytes("\x80\x05\x97."),
              StatusIs(absl::StatusCode::kUnimplemented, "out-of-band"));
  EXPECT_THAT(ReadPickleBytes("\x80\x06N."),
              StatusIs(absl::StatusCode::kInvalidArgument, "unsupported pickle protocol 6"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02Q."),
              StatusIs(absl::StatusCode::kInvalidArgument, "BINPERSID needs an object"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02NQ."),
              StatusIs(absl::StatusCode::kInvalidArgument, "without a persistent-load handler"));
}

TEST(PickleReaderTest, ProtocolZeroLiterals) {
  ASSERT_OK_AND_ASSIGN(Value value,
                       ReadPickleBytes("(I01\nI00\nI-42\nL123456789012345678901234567890L\n"
                                       "F-0.5\nS'a\\x41\\n\\'\\101'\nVcaf\\u00e9\\\\u\nl."));
  EXPECT_EQ(value, Value::List({Value::Bool(true), Value::Bool(false), Value::Int(-42),
                                BigInt("123456789012345678901234567890"), Value::Float(-0.5),
                                Value::String("aA\n'A"), Value::String("caf\xc3\xa9\\\\u")}));
}

// A hooks object standing in for torch_reader: persistent ids become tensors, and one global
// is understood.
class FakeTorchHooks : public PickleHooks {
 public:
  absl::StatusOr<PersistentObject> PersistentLoad(const Value& pid) override {
    if (!pid.is_string()) return absl::InvalidArgumentError("expected a str id");
    PersistentObject object;
    object.value = Value::Tensor(at::arange(3), pid.string_value());
    return object;
  }
  bool HandlesGlobal(absl::string_view global) const override { return global == "m.double"; }
  absl::StatusOr<std::optional<Value>> CallGlobal(absl::string_view global,
                                                  const Value& args) override {
    if (args.items().size() != 1 || !args.items()[0].is_tensor()) {
      return absl::InvalidArgumentError("m.double takes one tensor");
    }
    return Value::Tensor(args.items()[0].tensor() * 2, args.items()[0].tensor_original_device());
  }
};

TEST(PickleReaderTest, HooksSupplyPersistentObjectsAndGlobals) {
  FakeTorchHooks hooks;
  ASSERT_OK_AND_ASSIGN(Value value, ReadPickleBytes("\x80\x02"
                                                    "cm\ndouble\nPcuda:1\n\x85R.",
                                                    &hooks));
  ASSERT_TRUE(value.is_tensor());
  EXPECT_EQ(value.tensor_original_device(), "cuda:1");
  EXPECT_TRUE(value.tensor().equal(at::arange(3) * 2));
  EXPECT_THAT(ReadPickleBytes("\x80\x02"
                              "cm\ndouble\nK\x01\x85R.",
                              &hooks),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "offset 15: m.double: m.double takes one tensor"));
  EXPECT_THAT(ReadPickleBytes("\x80\x02K\x01Q.", &hooks),
              StatusIs(absl::StatusCode::kInvalidArgument, "persistent id 1: expected a str id"));
}

}  // namespace
}  // namespace ckpt
