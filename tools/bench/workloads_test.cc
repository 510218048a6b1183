#include "tools/bench/workloads.h"

#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/isfinite.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"
#include "libs/store/chunk_hasher.h"

namespace ckpt::bench {
namespace {

using ::ckpt::testing::StatusIs;

absl::string_view Bytes(const at::Tensor& tensor) {
  return absl::string_view(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
}

TEST(FillRandomTest, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  at::Tensor a = at::empty({1000}, at::kFloat);
  at::Tensor b = at::empty({1000}, at::kFloat);
  at::Tensor c = at::empty({1000}, at::kFloat);
  ASSERT_OK(FillRandom(a, 7));
  ASSERT_OK(FillRandom(b, 7));
  ASSERT_OK(FillRandom(c, 8));
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(a, c));
  EXPECT_TRUE(at::isfinite(a).all().item<bool>());
  EXPECT_GE(a.min().item<float>(), -0.5f);
  EXPECT_LT(a.max().item<float>(), 0.5f);
}

TEST(FillRandomTest, RejectsOtherDtypes) {
  EXPECT_THAT(FillRandom(at::empty({4}, at::kDouble), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "float32"));
}

TEST(MakeLargeWorkloadTest, HoldsParametersAndAdamStateWithDistinctChunks) {
  ASSERT_OK_AND_ASSIGN(Workload workload, MakeLargeWorkload(int64_t{32} << 20));
  // Two layers of weight + bias; each parameter has exp_avg, exp_avg_sq and a scalar step.
  EXPECT_EQ(workload.contents.model.size(), 4u);
  EXPECT_EQ(workload.tensors.size(), 4u * 4);
  const int64_t params = workload.contents.model.TotalBytes();
  EXPECT_EQ(params, 2 * (4096 * 1024 + 4096) * 4);
  EXPECT_EQ(workload.bytes, 3 * params + 4 * 4);
  // Dedup must not make the workload smaller than it looks: every 4 MiB chunk is distinct.
  std::set<std::string> chunks;
  int64_t count = 0;
  for (const at::Tensor& tensor : workload.tensors) {
    const absl::string_view bytes = Bytes(tensor);
    for (size_t offset = 0; offset < bytes.size(); offset += kChunkBytes, ++count) {
      chunks.insert(Sha256(bytes.substr(offset, kChunkBytes)));
    }
  }
  EXPECT_EQ(static_cast<int64_t>(chunks.size()), count - 3);  // the 4 step scalars are equal.
}

TEST(MakeManySmallWorkloadTest, TensorsAreFourToSixtyFourKiB) {
  ASSERT_OK_AND_ASSIGN(Workload workload, MakeManySmallWorkload(200));
  ASSERT_EQ(workload.tensors.size(), 200u);
  for (const at::Tensor& tensor : workload.tensors) {
    EXPECT_GE(tensor.nbytes(), 4u << 10);
    EXPECT_LE(tensor.nbytes(), 64u << 10);
  }
}

TEST(MakeFineTuneSeriesTest, VersionsShareTheBackboneAndDifferInTheHead) {
  ASSERT_OK_AND_ASSIGN(FineTuneSeries series, MakeFineTuneSeries(8 << 20, 1 << 20, 3));
  ASSERT_EQ(series.versions.size(), 3u);
  EXPECT_EQ(series.backbone_bytes, 8 << 20);
  EXPECT_EQ(series.head_bytes, 1 << 20);
  const at::Tensor* backbone0 = series.versions[0].model.Find("backbone.0.weight");
  const at::Tensor* backbone2 = series.versions[2].model.Find("backbone.0.weight");
  ASSERT_NE(backbone0, nullptr);
  ASSERT_NE(backbone2, nullptr);
  EXPECT_TRUE(at::equal(*backbone0, *backbone2));
  EXPECT_FALSE(at::equal(*series.versions[0].model.Find("head.weight"),
                         *series.versions[2].model.Find("head.weight")));
}

TEST(MakeExportWorkloadTest, HoldsEqualTensorsOfTheAskedSize) {
  ASSERT_OK_AND_ASSIGN(Workload workload, MakeExportWorkload(3, int64_t{1} << 20));
  ASSERT_EQ(workload.tensors.size(), 3u);
  EXPECT_EQ(workload.bytes, 3 * (int64_t{1} << 20));
  EXPECT_EQ(workload.contents.model.keys(),
            (std::vector<std::string>{"layers.0.weight", "layers.1.weight", "layers.2.weight"}));
  EXPECT_FALSE(at::equal(workload.tensors[0], workload.tensors[1]));
  EXPECT_FALSE(workload.contents.optimizer.has_value());
}

}  // namespace
}  // namespace ckpt::bench
