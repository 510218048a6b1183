#include "tools/bench/grpc_baseline.h"

#include <cstring>
#include <memory>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/zeros.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt::bench {
namespace {

using ::ckpt::testing::StatusIs;

// Three tensors of sizes that are not multiples of the 1 MiB message, one of them smaller than a
// message: the last message of each tensor is short.
Workload SmallWorkload() {
  Workload workload;
  workload.name = "small";
  for (const int64_t elements : {int64_t{700000}, int64_t{3}, int64_t{300001}}) {
    at::Tensor tensor = at::empty({elements}, at::kFloat);
    EXPECT_OK(FillRandom(tensor, static_cast<uint64_t>(elements)));
    workload.bytes += static_cast<int64_t>(tensor.nbytes());
    workload.tensors.push_back(tensor);
  }
  return workload;
}

std::vector<at::Tensor> Destinations(const Workload& workload) {
  std::vector<at::Tensor> destinations;
  for (const at::Tensor& tensor : workload.tensors) {
    destinations.push_back(at::zeros({static_cast<int64_t>(tensor.nbytes())}, at::kByte));
  }
  return destinations;
}

TEST(GrpcBaselineTest, PlacesEveryByteInOrderOnEachCall) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcBaseline> baseline, GrpcBaseline::Start());
  const Workload workload = SmallWorkload();
  std::vector<at::Tensor> destinations = Destinations(workload);
  for (const bool prefault : {false, true}) {  // the second call into memory the first wrote.
    for (at::Tensor& destination : destinations) destination.zero_();
    ASSERT_OK_AND_ASSIGN(const double seconds,
                         baseline->TimeStream(workload, destinations, prefault));
    EXPECT_GT(seconds, 0);
    for (size_t i = 0; i < workload.tensors.size(); ++i) {
      EXPECT_EQ(std::memcmp(destinations[i].data_ptr(), workload.tensors[i].data_ptr(),
                            workload.tensors[i].nbytes()),
                0)
          << "tensor " << i << ", prefault " << prefault;
    }
  }
}

TEST(GrpcBaselineTest, TooLittleRoomIsAnErrorNotAnOverrun) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GrpcBaseline> baseline, GrpcBaseline::Start());
  const Workload workload = SmallWorkload();
  std::vector<at::Tensor> destinations = Destinations(workload);
  destinations.pop_back();
  EXPECT_THAT(baseline->TimeStream(workload, destinations, /*prefault=*/false),
              StatusIs(absl::StatusCode::kInternal, "more bytes arrived"));
}

}  // namespace
}  // namespace ckpt::bench
