#include "libs/tensor/sparse_layout.h"

#include <cstring>
#include <string>

#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/eye.h"
#include "ATen/ops/sparse_coo_tensor.h"
#include "ATen/ops/sparse_csr_tensor.h"
#include "ATen/ops/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/status/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

// The stored form of `tensor` and the tensor rebuilt from it.
struct RoundTrip {
  v1::TensorMeta meta;
  at::Tensor back;
};

RoundTrip StoreAndRebuild(const at::Tensor& tensor) {
  RoundTrip trip;
  trip.meta.set_key("w");
  EXPECT_OK(DescribeSparseTensor(tensor, trip.meta));
  absl::StatusOr<at::Tensor> bytes = StoredBytes(tensor);
  EXPECT_OK(bytes.status());
  EXPECT_EQ(static_cast<int64_t>(bytes->nbytes()), trip.meta.byte_length());
  absl::StatusOr<at::Tensor> back = SparseTensorFromBytes(
      trip.meta, absl::string_view(static_cast<const char*>(bytes->data_ptr()), bytes->nbytes()));
  EXPECT_OK(back.status());
  if (back.ok()) trip.back = *back;
  return trip;
}

TEST(SparseLayoutTest, CooKeepsItsIndicesValuesAndCoalescedFlag) {
  const at::Tensor dense = at::arange(1, 13, at::kFloat).reshape({3, 4}).mul(at::eye(3, 4));
  const at::Tensor coo = dense.to_sparse();
  RoundTrip trip = StoreAndRebuild(coo);
  EXPECT_EQ(SparseLayoutName(trip.meta), "sparse_coo");
  EXPECT_EQ(trip.meta.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(trip.meta.shape(), ::testing::ElementsAre(3, 4));
  ASSERT_EQ(trip.meta.sparse().parts_size(), 2);
  EXPECT_EQ(trip.meta.sparse().parts(0).name(), "indices");
  EXPECT_THAT(trip.meta.sparse().parts(0).shape(), ::testing::ElementsAre(2, 3));
  EXPECT_TRUE(trip.meta.sparse().coalesced());
  EXPECT_EQ(trip.meta.byte_length(), 2 * 3 * 8 + 3 * 4);
  ASSERT_TRUE(trip.back.defined());
  EXPECT_TRUE(trip.back.is_sparse());
  EXPECT_TRUE(trip.back.is_coalesced());
  EXPECT_TRUE(at::equal(trip.back._indices(), coo._indices()));
  EXPECT_TRUE(at::equal(trip.back._values(), coo._values()));
  EXPECT_TRUE(at::equal(trip.back.to_dense(), dense));
}

TEST(SparseLayoutTest, UncoalescedCooKeepsItsDuplicatesAndHybridDenseDims) {
  // Two entries at (0, 1), each a row of 2 dense values: a hybrid tensor of shape [2, 3, 2].
  const at::Tensor indices = at::tensor({0, 0, 1, 1, 1, 2}, at::kLong).reshape({2, 3});
  const at::Tensor values = at::arange(6, at::kDouble).reshape({3, 2});
  const at::Tensor coo = at::sparse_coo_tensor(indices, values, {2, 3, 2});
  ASSERT_FALSE(coo.is_coalesced());
  RoundTrip trip = StoreAndRebuild(coo);
  EXPECT_FALSE(trip.meta.sparse().coalesced());
  EXPECT_THAT(trip.meta.sparse().parts(1).shape(), ::testing::ElementsAre(3, 2));
  EXPECT_FALSE(trip.back.is_coalesced());
  EXPECT_TRUE(at::equal(trip.back._indices(), indices));
  EXPECT_TRUE(at::equal(trip.back._values(), values));
}

TEST(SparseLayoutTest, CompressedLayoutsRoundTripWithTheirIndexDType) {
  const at::Tensor dense = at::arange(1, 25, at::kFloat).reshape({4, 6}).mul(at::eye(4, 6));
  for (const at::Tensor& sparse :
       {dense.to_sparse_csr(), dense.to_sparse_csc(), dense.to_sparse_bsr({2, 3}),
        dense.to_sparse_bsc({2, 2})}) {
    RoundTrip trip = StoreAndRebuild(sparse);
    ASSERT_TRUE(trip.back.defined());
    EXPECT_EQ(trip.back.layout(), sparse.layout());
    EXPECT_TRUE(at::equal(trip.back.to_dense(), dense)) << SparseLayoutName(trip.meta);
    EXPECT_TRUE(at::equal(trip.back.values(), sparse.values())) << SparseLayoutName(trip.meta);
  }
  // int32 indices stay int32.
  const at::Tensor csr32 = at::sparse_csr_tensor(at::tensor({0, 1, 2}, at::kInt),
                                                 at::tensor({1, 0}, at::kInt),
                                                 at::tensor({5.0f, 6.0f}), {2, 2},
                                                 at::TensorOptions().dtype(at::kFloat));
  RoundTrip trip = StoreAndRebuild(csr32);
  EXPECT_EQ(trip.meta.sparse().parts(0).dtype(), v1::DTYPE_INT32);
  EXPECT_EQ(trip.back.crow_indices().scalar_type(), at::kInt);
}

TEST(SparseLayoutTest, StoredByteLengthRefusesPartsThatDoNotFitTheLayout) {
  v1::TensorMeta meta;
  meta.set_key("w");
  ASSERT_OK(DescribeSparseTensor(at::eye(3).to_sparse(), meta));
  ASSERT_OK(StoredByteLength(meta).status());

  v1::TensorMeta renamed = meta;
  renamed.mutable_sparse()->mutable_parts(0)->set_name("idx");
  EXPECT_THAT(StoredByteLength(renamed),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("part 0 is 'idx'")));

  v1::TensorMeta short_values = meta;
  short_values.mutable_sparse()->mutable_parts(1)->set_shape(0, 2);
  EXPECT_THAT(StoredByteLength(short_values),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("its values have shape [2]")));

  v1::TensorMeta int32_coo = meta;
  int32_coo.mutable_sparse()->mutable_parts(0)->set_dtype(v1::DTYPE_INT32);
  EXPECT_THAT(StoredByteLength(int32_coo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be int64")));

  v1::TensorMeta negative = meta;
  negative.mutable_sparse()->mutable_parts(0)->set_shape(0, -1);
  EXPECT_THAT(StoredByteLength(negative),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));

  v1::TensorMeta csr;
  csr.set_key("c");
  ASSERT_OK(DescribeSparseTensor(at::eye(3).to_sparse_csr(), csr));
  csr.mutable_sparse()->mutable_parts(0)->set_shape(0, 3);  // 2 rows' worth for 3 rows.
  EXPECT_THAT(StoredByteLength(csr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need 4")));
}

TEST(SparseLayoutTest, BytesWhoseIndicesLeaveTheShapeAreDataLoss) {
  const at::Tensor coo = at::eye(3).to_sparse();
  v1::TensorMeta meta;
  meta.set_key("w");
  ASSERT_OK(DescribeSparseTensor(coo, meta));
  ASSERT_OK_AND_ASSIGN(at::Tensor bytes, StoredBytes(coo));
  std::string damaged(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes());
  const int64_t out_of_range = 7;  // the first row index, in a 3 x 3 tensor.
  std::memcpy(damaged.data(), &out_of_range, sizeof(out_of_range));
  EXPECT_THAT(SparseTensorFromBytes(meta, damaged),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sparse_coo tensor 'w'")));
  EXPECT_THAT(SparseTensorFromBytes(meta, damaged.substr(1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bytes given")));
}

TEST(SparseLayoutTest, CastChangesTheValuesOnly) {
  v1::TensorMeta meta;
  meta.set_key("w");
  ASSERT_OK(DescribeSparseTensor(at::eye(3).to_sparse(), meta));
  ASSERT_OK(CastSparseMeta(DType::kFloat16, meta));
  EXPECT_EQ(meta.dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(meta.sparse().parts(0).dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(meta.sparse().parts(1).dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(meta.byte_length(), 2 * 3 * 8 + 3 * 2);
}

TEST(SparseLayoutTest, DenseTensorsAreTheirOwnStoredBytes) {
  const at::Tensor dense = at::arange(6, at::kFloat).reshape({2, 3});
  EXPECT_FALSE(IsSparseTensor(dense));
  ASSERT_OK_AND_ASSIGN(at::Tensor bytes, StoredBytes(dense));
  EXPECT_EQ(bytes.data_ptr(), dense.data_ptr());
  v1::TensorMeta meta;
  meta.set_dtype(v1::DTYPE_FLOAT32);
  meta.add_shape(2);
  meta.add_shape(3);
  ASSERT_OK_AND_ASSIGN(const int64_t length, StoredByteLength(meta));
  EXPECT_EQ(length, 24);
  EXPECT_EQ(SparseLayoutName(meta), "strided");
}

}  // namespace
}  // namespace ckpt
