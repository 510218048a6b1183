#ifndef CKPT_LIBS_TENSOR_SIDE_STREAM_COPIES_H_
#define CKPT_LIBS_TENSOR_SIDE_STREAM_COPIES_H_

// Copies between pinned host memory and one accelerator (CUDA) device on a side stream, so that
// the stream the caller computes on is not held up by them: what PyTorch users write as
//   with torch.cuda.stream(side): host.copy_(gpu_tensor, non_blocking=True)
// with the events around it done right. Used by checkpoint snapshots (device -> host, the training
// step pays for launching the copies, not for the copies) and by the loader client (host ->
// device, the copies overlap with receiving the next tensors).
//
// Ordering:
//   - construction makes the side stream wait for the work already queued on the device's
//     current stream, so a copy sees the tensors as that work leaves them;
//   - OrderBeforeCurrentStream() makes the current stream wait, on the device, for the copies
//     issued so far (the host does not wait): later kernels may then overwrite a copied tensor
//     or read a tensor copied onto the device;
//   - WaitOnHost() blocks the calling thread (any thread) until those copies are done: only then
//     may host memory written by CopyToHost be read.
// Device memory stays valid for the side stream: sources of CopyToHost and results of
// CopyToDevice are recorded on the stream that will use or free them, as tensor.record_stream.
//
// Everything here compiles against a CPU-only LibTorch (c10's device-generic stream and event
// API); it is only exercised with CUDA tensors (tools/gpu_check.sh). Constructing one for a
// device this LibTorch cannot drive throws c10::Error.
//
// Thread-safety: one thread issues copies; WaitOnHost may be called from another.

#include "ATen/core/Tensor.h"
#include "c10/core/Device.h"
#include "c10/core/Stream.h"
#include "c10/core/impl/VirtualGuardImpl.h"
#include "c10/util/ArrayRef.h"

namespace ckpt {

class SideStreamCopies {
 public:
  // `device`: an accelerator device with an index, e.g. cuda:1.
  explicit SideStreamCopies(c10::Device device);
  SideStreamCopies(const SideStreamCopies&) = delete;
  SideStreamCopies& operator=(const SideStreamCopies&) = delete;

  c10::Device device() const { return device_; }

  // Starts copying `source` (on device()) into `pinned_host` (a pinned CPU tensor of its shape
  // and dtype). The bytes are there after WaitOnHost().
  void CopyToHost(const at::Tensor& source, at::Tensor& pinned_host);

  // Starts copying `pinned_host` onto device(); usable on the current stream after
  // OrderBeforeCurrentStream(). Keep `pinned_host` alive, or let PyTorch's pinned-memory
  // allocator keep it (it does for pinned tensors it allocated).
  at::Tensor CopyToDevice(const at::Tensor& pinned_host);

  void OrderBeforeCurrentStream();
  void WaitOnHost() const;

 private:
  const c10::Device device_;
  const c10::impl::VirtualGuardImpl guard_impl_;
  const c10::Stream compute_stream_;  // the device's current stream at construction
  const c10::Stream side_stream_;
};

// A CPU tensor in pinned (page-locked) memory, which accelerators copy from and to without an
// extra staging copy and asynchronously. Needs a LibTorch with CUDA.
at::Tensor EmptyPinned(c10::IntArrayRef sizes, c10::ScalarType dtype);

}  // namespace ckpt

#endif  // CKPT_LIBS_TENSOR_SIDE_STREAM_COPIES_H_
