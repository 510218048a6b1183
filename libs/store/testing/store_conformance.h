#ifndef CKPT_LIBS_STORE_TESTING_STORE_CONFORMANCE_H_
#define CKPT_LIBS_STORE_TESTING_STORE_CONFORMANCE_H_

// The conformance suite every CheckpointStore backend runs (docs/STYLE.md: one suite per interface,
// as tensorstore's kvstore drivers share one): the contract of libs/store/checkpoint_store.h --
// round trips byte for byte, key normalization, value trees, versions and refs, aliases with
// compare-and-set, optimistic commits, concurrent writers, deduplication, delete / retention /
// GC accounting, readers that survive deletes, streamed uploads, validation errors and status
// codes. The RocksDB store runs it directly; RemoteCheckpointStore runs it through a real store
// service on loopback; a future backend (S3-backed chunks) instantiates it the same way.
// Backend-specific behaviour (pack files, corruption, mapping, reopen) stays in each backend's
// own test. testonly.
//
// An implementation's test instantiates it with a factory:
//   INSTANTIATE_TEST_SUITE_P(RocksDb, StoreConformanceTest,
//       ::testing::Values(StoreConformanceParam{"rocksdb", [](const std::string& dir) { ... }}),
//       [](const auto& info) { return info.param.name; });

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "gtest/gtest.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt::testing {

// A store under test and whatever keeps it working (a server, a channel).
class StoreHarness {
 public:
  virtual ~StoreHarness() = default;
  virtual CheckpointStore& store() = 0;
};

struct StoreConformanceParam {
  std::string name;
  // A fresh, empty store in `dir` (which exists), whose abandoned uploads have no grace period
  // (GarbageCollect reclaims them at once).
  std::function<std::unique_ptr<StoreHarness>(const std::string& dir)> make;
};

class StoreConformanceTest : public ::testing::TestWithParam<StoreConformanceParam> {
 protected:
  void SetUp() override;
  void TearDown() override;

  CommitResult MustCommit(const std::string& model, const CheckpointContents& contents,
                          const CommitOptions& options = {});

  std::unique_ptr<StoreHarness> harness_;
  CheckpointStore* store_ = nullptr;
};

// Helpers the suite and the backends' own tests share.
inline constexpr int64_t kMiB = 1 << 20;
// Every byte, dtype and shape equal.
void ExpectSameTensor(const at::Tensor& actual, const at::Tensor& expected,
                      const std::string& what);
std::string TensorBytes(const at::Tensor& tensor);
at::Tensor Seeded(std::vector<int64_t> shape, uint64_t seed);
StateDict MakeStateDict(std::vector<std::pair<std::string, at::Tensor>> entries);
CheckpointContents WeightsOnly(std::vector<std::pair<std::string, at::Tensor>> entries);
v1::VersionRef Ref(absl::string_view text);
// An Adam-like optimizer state dict with the shapes of `like`.
Value AdamState(const std::vector<at::Tensor>& like, int64_t step, uint64_t seed);
Value StepLrState(int64_t last_epoch);
// An upload header of one uint8 tensor "key" of `bytes` bytes.
v1::Manifest OneTensorHeader(const std::string& key, int64_t bytes);

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_STORE_TESTING_STORE_CONFORMANCE_H_
