#include "libs/tensor/side_stream_copies.h"

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "c10/core/Event.h"
#include "c10/core/StreamGuard.h"
#include "c10/util/Exception.h"

namespace ckpt {
namespace {

c10::Device CheckedDevice(c10::Device device) {
  TORCH_CHECK(!device.is_cpu() && device.has_index(),
              "side-stream copies need an accelerator device with an index (e.g. cuda:0), got ",
              device);
  return device;
}

}  // namespace

SideStreamCopies::SideStreamCopies(c10::Device device)
    : device_(CheckedDevice(device)),
      guard_impl_(device.type()),
      compute_stream_(guard_impl_.getStream(device)),
      side_stream_(guard_impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/false)) {
  c10::Event queued(device_.type());
  queued.record(compute_stream_);
  queued.block(side_stream_);
}

void SideStreamCopies::CopyToHost(const at::Tensor& source, at::Tensor& pinned_host) {
  TORCH_CHECK(source.device() == device_, "CopyToHost: the source is on ", source.device(),
              ", these copies are for ", device_);
  TORCH_CHECK(pinned_host.is_cpu() && pinned_host.sizes() == source.sizes() &&
                  pinned_host.scalar_type() == source.scalar_type(),
              "CopyToHost: the host buffer does not match the source");
  c10::StreamGuard on_side(side_stream_);
  pinned_host.copy_(source, /*non_blocking=*/true);
  // The training stream may free `source` (e.g. an optimizer state it replaces) before the side
  // stream has read it; recording keeps the allocator from handing its memory out until then.
  if (source.has_storage()) {
    guard_impl_.recordDataPtrOnStream(source.storage().data_ptr(), side_stream_);
  }
}

at::Tensor SideStreamCopies::CopyToDevice(const at::Tensor& pinned_host) {
  TORCH_CHECK(pinned_host.is_cpu(), "CopyToDevice: the source must be a host tensor, got one on ",
              pinned_host.device());
  c10::StreamGuard on_side(side_stream_);
  at::Tensor placed = pinned_host.to(device_, pinned_host.scalar_type(), /*non_blocking=*/true);
  // Allocated while the side stream was current, used and freed on the compute stream.
  if (placed.has_storage()) {
    guard_impl_.recordDataPtrOnStream(placed.storage().data_ptr(), compute_stream_);
  }
  return placed;
}

void SideStreamCopies::OrderBeforeCurrentStream() {
  c10::Event copied(device_.type());
  copied.record(side_stream_);
  copied.block(compute_stream_);
}

void SideStreamCopies::WaitOnHost() const { guard_impl_.synchronizeStream(side_stream_); }

at::Tensor EmptyPinned(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(true));
}

}  // namespace ckpt
