#ifndef CKPT_LIBS_STORE_UPLOAD_SPLIT_H_
#define CKPT_LIBS_STORE_UPLOAD_SPLIT_H_

// How the writers of a parted upload (CheckpointStore::JoinUpload) share a checkpoint's bytes:
// balanced by bytes, small tensors whole, large ones cut on chunk boundaries, so that N ranks each
// store about 1/N of it. Every rank computes the same split from the same header.
//
// Example (each rank of a job):
//   ASSIGN_OR_RETURN(PreparedUpload prepared, PrepareUpload(contents, options));
//   const std::vector<std::vector<UploadRange>> split = SplitUpload(prepared.header, world_size);
//   ASSIGN_OR_RETURN(auto part, store.JoinUpload(name, split[rank]));   // if split[rank] is not
//   empty RETURN_IF_ERROR(UploadTensorRanges(*part, prepared.tensors));

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "libs/store/checkpoint_store.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

namespace ckpt {

// The ranges of `header`'s tensors each of `writers` (>= 1) writes: writer w gets
// result[w], every non-empty tensor's bytes are covered exactly once, and each range is valid for
// JoinUpload (non-empty; begins on a chunk boundary; ends on one or at its tensor's end). Writers
// take consecutive stretches of the tensors in upload order, each about total / writers bytes
// (never off by more than one chunk, except that a tensor of under one chunk is never cut); a
// writer may get none when there are fewer bytes than writers have chunks. Tensors listed in
// `first_writer_only` (tensor indices) go whole to writer 0: state that differs between ranks
// (their random generators) is saved from rank 0's copy, as a one-writer save would. Tensors
// listed in `supplied_by_writers` are left out (no writer gets a range of them, nor do their bytes
// count towards a share): the writers supply them as OwnedTensorBytes, below.
std::vector<std::vector<UploadRange>> SplitUpload(const v1::Manifest& header, int writers,
                                                  const std::vector<int>& first_writer_only = {},
                                                  const std::vector<int>& supplied_by_writers = {});

// Bytes [begin, end) of a checkpoint tensor that one writer of a parted upload supplies from
// memory of its own, `source`: contiguous, of `tensor`'s dtype, holding exactly those bytes. What
// a ZeRO-1 rank saves of its slices: of an optimizer state tensor that no rank holds whole
// (`tensor` is then a shape-only placeholder on the meta device, which PrepareUpload describes
// and nothing reads), and of the parameters it updates. The writers' ranges of a tensor must
// cover it exactly, each valid for JoinUpload; the store refuses the commit otherwise.
struct OwnedTensorBytes {
  at::Tensor tensor;
  int64_t begin = 0;
  int64_t end = 0;
  at::Tensor source;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_STORE_UPLOAD_SPLIT_H_
