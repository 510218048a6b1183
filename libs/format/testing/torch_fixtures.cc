#include "libs/format/testing/torch_fixtures.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ckpt::testing {
namespace {

std::vector<int64_t> ParseInts(absl::string_view text) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(part, &v)) << text;
    out.push_back(v);
  }
  return out;
}

ExpectedTensor ParseTensor(const std::vector<std::string>& f) {
  ExpectedTensor t;
  t.file = f[1];
  t.path = f[2];
  t.dtype = f[3];
  t.shape = ParseInts(f[4]);
  t.stride = ParseInts(f[5]);
  EXPECT_TRUE(absl::SimpleAtoi(f[6], &t.storage_offset));
  t.requires_grad = f[7] == "1";
  t.device = f[8];
  t.storage = f[9];
  t.hex = f[10];
  return t;
}

TorchFixtures Generate(const std::vector<std::string>& groups) {
  TorchFixtures fixtures;
  const char* tmp = std::getenv("TEST_TMPDIR");
  fixtures.dir = absl::StrCat(tmp ? tmp : "/tmp", "/torch_fixtures_", absl::StrJoin(groups, "_"));
  const char* python = std::getenv("PYTHON");
  const std::string command = absl::StrCat(python ? python : "/usr/bin/python3",
                                           " libs/format/testdata/make_torch_fixtures.py ",
                                           fixtures.dir, " ", absl::StrJoin(groups, " "));
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << command;
  if (rc != 0) return fixtures;
  std::ifstream in(fixtures.dir + "/expected.tsv");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    if ((f[0] == "tensor" || f[0] == "state") && f.size() == 11) {
      (f[0] == "tensor" ? fixtures.tensors : fixtures.state).push_back(ParseTensor(f));
    } else if (f[0] == "qparams" && f.size() == 7) {
      ExpectedQParams q;
      q.scheme = f[3];
      EXPECT_TRUE(absl::SimpleAtod(f[4], &q.scale));
      EXPECT_TRUE(absl::SimpleAtoi(f[5], &q.zero_point));
      EXPECT_TRUE(absl::SimpleAtoi(f[6], &q.axis));
      fixtures.qparams[{f[1], f[2]}] = q;
    } else if (f[0] == "pyload" && f.size() == 3) {
      fixtures.python_load[f[1]] = f[2];
    } else {
      ADD_FAILURE() << "unparsed expected.tsv line: " << line.substr(0, 200);
    }
  }
  return fixtures;
}

}  // namespace

std::vector<ExpectedTensor> TorchFixtures::TensorsOf(const std::string& file) const {
  std::vector<ExpectedTensor> out;
  for (const ExpectedTensor& t : tensors) {
    if (t.file == file) out.push_back(t);
  }
  return out;
}

std::vector<ExpectedTensor> TorchFixtures::StateOf(const std::string& file) const {
  std::vector<ExpectedTensor> out;
  for (const ExpectedTensor& t : state) {
    if (t.file == file) out.push_back(t);
  }
  return out;
}

const TorchFixtures& GenerateTorchFixtures(const std::vector<std::string>& groups) {
  static std::mutex mu;
  static auto* cache = new std::map<std::vector<std::string>, std::unique_ptr<TorchFixtures>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<TorchFixtures>& slot = (*cache)[groups];
  if (slot == nullptr) slot = std::make_unique<TorchFixtures>(Generate(groups));
  return *slot;
}

const Value* FindValueAtPath(const Value& root, const std::string& path) {
  const Value* current = &root;
  if (path.empty()) return current;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    int64_t index = 0;
    const bool numeric = absl::SimpleAtoi(part, &index);
    if (current->is_dict()) {
      const Value* next = current->Find(std::string(part));
      if (next == nullptr && numeric) next = current->Find(index);
      if (next == nullptr) return nullptr;
      current = next;
    } else if (current->is_sequence() && numeric && index >= 0 &&
               static_cast<size_t>(index) < current->items().size()) {
      current = &current->items()[index];
    } else {
      return nullptr;
    }
  }
  return current;
}

std::string HexOf(const at::Tensor& tensor) {
  at::Tensor data = tensor.is_quantized() ? tensor.int_repr() : tensor;
  data = data.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(data.data_ptr());
  const size_t n = data.numel() * data.element_size();
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 0xF]);
  }
  return out;
}

std::string DTypeNameOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kByte:
      return "uint8";
    case at::kChar:
      return "int8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kBool:
      return "bool";
    case at::kComplexHalf:
      return "complex32";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    case at::kQInt8:
      return "qint8";
    case at::kQUInt8:
      return "quint8";
    case at::kQInt32:
      return "qint32";
    default:
      return c10::toString(tensor.scalar_type());
  }
}

::testing::AssertionResult TensorMatches(const at::Tensor& tensor, const std::string& device,
                                         const ExpectedTensor& expected) {
  const std::string where = absl::StrCat(expected.file, " '", expected.path, "': ");
  if (!tensor.defined()) return ::testing::AssertionFailure() << where << "undefined tensor";
  if (DTypeNameOf(tensor) != expected.dtype) {
    return ::testing::AssertionFailure()
           << where << "dtype " << DTypeNameOf(tensor) << ", Python has " << expected.dtype;
  }
  if (tensor.sizes().vec() != expected.shape) {
    return ::testing::AssertionFailure()
           << where << "shape [" << absl::StrJoin(tensor.sizes(), ",") << "], Python has ["
           << absl::StrJoin(expected.shape, ",") << "]";
  }
  if (tensor.strides().vec() != expected.stride) {
    return ::testing::AssertionFailure()
           << where << "stride [" << absl::StrJoin(tensor.strides(), ",") << "], Python has ["
           << absl::StrJoin(expected.stride, ",") << "]";
  }
  if (tensor.storage_offset() != expected.storage_offset) {
    return ::testing::AssertionFailure() << where << "storage offset " << tensor.storage_offset()
                                         << ", Python has " << expected.storage_offset;
  }
  if (tensor.requires_grad() != expected.requires_grad) {
    return ::testing::AssertionFailure() << where << "requires_grad " << tensor.requires_grad()
                                         << ", Python has " << expected.requires_grad;
  }
  if (device != expected.device) {
    return ::testing::AssertionFailure() << where << "original device '" << device
                                         << "', Python saved '" << expected.device << "'";
  }
  if (!tensor.device().is_cpu()) {
    return ::testing::AssertionFailure() << where << "not on the CPU";
  }
  const std::string hex = HexOf(tensor);
  if (hex != expected.hex) {
    return ::testing::AssertionFailure()
           << where << "bytes differ:\n  ours   " << hex.substr(0, 160) << "\n  Python "
           << expected.hex.substr(0, 160);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SharingMatches(const std::vector<ExpectedTensor>& expected,
                                          const std::vector<at::Tensor>& ours) {
  if (expected.size() != ours.size()) {
    return ::testing::AssertionFailure() << "count " << ours.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    for (size_t j = i + 1; j < expected.size(); ++j) {
      if (expected[i].storage == "0" || expected[j].storage == "0") continue;
      const bool python_shares = expected[i].storage == expected[j].storage;
      const bool we_share = ours[i].storage().is_alias_of(ours[j].storage());
      if (python_shares != we_share) {
        return ::testing::AssertionFailure()
               << expected[i].path << " and " << expected[j].path << ": Python "
               << (python_shares ? "shares" : "does not share") << " storage, we "
               << (we_share ? "do" : "do not");
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ckpt::testing
