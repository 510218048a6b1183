#ifndef CKPT_LIBS_FORMAT_TESTING_TORCH_FIXTURES_H_
#define CKPT_LIBS_FORMAT_TESTING_TORCH_FIXTURES_H_

// Checkpoints written by real PyTorch for the format tests (testonly).
//
// GenerateTorchFixtures runs testdata/make_torch_fixtures.py with /usr/bin/python3 (or $PYTHON)
// into $TEST_TMPDIR once per process and parses what PyTorch saw in each file (expected.tsv, see
// the script's docstring), so tests compare every tensor byte for byte against Python's view.
//
// Example:
//   const TorchFixtures& fixtures = GenerateTorchFixtures({"basic"});
//   for (const ExpectedTensor& t : fixtures.TensorsOf("plain.pt")) { ... }

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "gtest/gtest.h"
#include "libs/tensor/value.h"

namespace ckpt::testing {

struct ExpectedTensor {
  std::string file;
  std::string path;   // "model/fc.weight" (tensor lines) or the state-dict key (state lines).
  std::string dtype;  // PyTorch's name without "torch.": "float32", "bfloat16", "qint8".
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t storage_offset = 0;
  bool requires_grad = false;
  std::string device;   // Location tag the file records.
  std::string storage;  // Equal for tensors that share a storage in Python; "0" if empty.
  std::string hex;      // Row-major element bytes (int_repr() for quantized tensors).
};

struct ExpectedQParams {
  std::string scheme;  // "per_tensor" or "per_channel".
  double scale = 0;
  int64_t zero_point = 0;
  int64_t axis = -1;
};

struct TorchFixtures {
  std::string dir;
  std::vector<ExpectedTensor> tensors;                                     // "tensor" lines.
  std::vector<ExpectedTensor> state;                                       // "state" lines.
  std::map<std::pair<std::string, std::string>, ExpectedQParams> qparams;  // (file, path).
  std::map<std::string, std::string> python_load;  // file -> "ok" or "error:..."

  std::string Path(const std::string& file) const { return dir + "/" + file; }
  std::vector<ExpectedTensor> TensorsOf(const std::string& file) const;
  std::vector<ExpectedTensor> StateOf(const std::string& file) const;
};

// Generates the fixture groups ("basic", "models") on first use; later calls with the same
// groups return the same object. Fails the current test (and returns an empty set) if Python
// fails.
const TorchFixtures& GenerateTorchFixtures(const std::vector<std::string>& groups);

// The Value at a '/'-joined path of dict keys (str, else int) and sequence indices, as
// expected.tsv writes them; nullptr if absent. "" is `root` itself.
const Value* FindValueAtPath(const Value& root, const std::string& path);

// Row-major bytes of `tensor` as lowercase hex (int_repr() for quantized tensors).
std::string HexOf(const at::Tensor& tensor);

// PyTorch's dtype name without "torch.".
std::string DTypeNameOf(const at::Tensor& tensor);

// Compares dtype, shape, stride, storage offset, requires_grad, every byte, and `device` with
// the recorded location tag.
::testing::AssertionResult TensorMatches(const at::Tensor& tensor, const std::string& device,
                                         const ExpectedTensor& expected);

// Checks that tensors which share a storage in Python share one here and that the others do
// not. `ours` holds our tensor for each expectation, in the same order.
::testing::AssertionResult SharingMatches(const std::vector<ExpectedTensor>& expected,
                                          const std::vector<at::Tensor>& ours);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_FORMAT_TESTING_TORCH_FIXTURES_H_
