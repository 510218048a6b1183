#ifndef CKPT_LIBS_TRAIN_TESTING_BUNDLE_COMPARISON_H_
#define CKPT_LIBS_TRAIN_TESTING_BUNDLE_COMPARISON_H_

// Whether two training runs stored the same training bundle: the one comparison the end-to-end
// tests of the trainer (a killed and resumed run against an uninterrupted one, two hosts against
// one) make, so each states it as one assertion and a failure names the first difference rather
// than a boolean.
//
// "The same" is bit for bit: tensors equal in dtype, shape and every byte (so -0.0 differs from
// 0.0, and NaNs with the same bits are equal), plain values equal as Value::operator== has them.
//
// Example:
//   ASSERT_OK_AND_ASSIGN(LoadedCheckpoint a, LoadCheckpoint(*clean, ref));
//   ASSERT_OK_AND_ASSIGN(LoadedCheckpoint b, LoadCheckpoint(*killed, ref));
//   EXPECT_OK(CompareTrainingBundles(a.contents, b.contents));
//   // or, loading both: EXPECT_OK(CompareStoredBundles(*clean, ref, *killed, ref));
//
// Every function returns OK when the two sides are the same and FAILED_PRECONDITION naming the
// first difference otherwise: the path of the tensor or value ("model/fc.weight",
// "optimizer/state/0/exp_avg", "trainer/rng_cpu"), the dtypes and shapes when they differ, or the
// first differing element's flat (row-major) index and both elements.

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/checkpoint_store.h"
#include "libs/tensor/state_dict.h"
#include "libs/tensor/value.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt::train::testing {

// `path` names the tensors in the message. Two undefined tensors are the same.
absl::Status CompareTensors(const at::Tensor& a, const at::Tensor& b, absl::string_view path);

// The same keys in the same order, each tensor the same; keys are named "PATH/KEY".
absl::Status CompareStateDicts(const StateDict& a, const StateDict& b,
                               absl::string_view path = "model");

// Two value trees: the same kinds, dict keys in the same order, sequences of the same length,
// equal plain values, the same tensors.
absl::Status CompareValues(const Value& a, const Value& b, absl::string_view path);

// Everything a resume restores: the model; the optimizer's whole tree (per-parameter tensors,
// "step", param_groups' hyperparameters); the scheduler's whole tree; and the trainer's state in
// `extra` (train::DecodeTrainerState): epoch, sampler position, global and target step, the CPU
// generator's state and the device generator's state. Also FAILED_PRECONDITION when either
// bundle lacks an optimizer or scheduler, its optimizer holds no tensor (a bundle of plain
// weights would compare equal vacuously), it holds no trainer state, or it recorded no CPU
// generator state.
absl::Status CompareTrainingBundles(const CheckpointContents& a, const CheckpointContents& b);

// Loads `ref_a` from `store_a` and `ref_b` from `store_b` and compares them as
// CompareTrainingBundles, the message prefixed with both versions. Errors of LoadCheckpoint
// (NOT_FOUND, DATA_LOSS) as they come.
absl::Status CompareStoredBundles(CheckpointStore& store_a, const v1::VersionRef& ref_a,
                                  CheckpointStore& store_b, const v1::VersionRef& ref_b);

}  // namespace ckpt::train::testing

#endif  // CKPT_LIBS_TRAIN_TESTING_BUNDLE_COMPARISON_H_
