#ifndef CKPT_LIBS_CLIENT_INTERNAL_REMOTE_STORE_CONNECTION_H_
#define CKPT_LIBS_CLIENT_INTERNAL_REMOTE_STORE_CONNECTION_H_

// RemoteCheckpointStore's private parts, shared by its files (listed in srcs only): Connection --
// the channel, the stub and the raw Download method that the store, its upload sessions and its
// version readers share. The public API is remote_checkpoint_store.h.
//
// The files, by concern:
//   remote_checkpoint_store.cc           connecting; the unary calls (listing, aliases, deletes,
//                                        retention, GC, verify, stats, audit)
//   remote_checkpoint_store_upload.cc    BeginUpload: the Upload stream
//   remote_checkpoint_store_download.cc  OpenVersion: Download streams, chunks checked on arrival
//   remote_checkpoint_store_history.cc   the model registry's calls and the Watch stream
//   internal/remote_store_connection.h   this file

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/rpc/client_channel.h"
#include "libs/rpc/wire_constants.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"

namespace ckpt {

class RemoteCheckpointStore::Connection {
 public:
  using Stub = v1::CheckpointStore::Stub;

  explicit Connection(std::shared_ptr<ClientChannel> channel)
      : channel_(std::move(channel)),
        stub_(v1::CheckpointStore::NewStub(channel_->channel())),
        download_method_(kDownloadMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
                         channel_->channel()) {}

  const RemoteStoreOptions& options() const { return channel_->options(); }
  const ClientChannel& channel() const { return *channel_; }
  Stub& stub() const { return *stub_; }

  // Download, read as raw messages (TensorDataResponseReader reads them without copying the
  // bytes). gRPC's generated stubs make their readers with this same internal factory; there is
  // no public way to read a server stream as ByteBuffers synchronously.
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> Download(
      grpc::ClientContext* context, const v1::DownloadRequest& request) const {
    return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channel_->channel().get(), download_method_, context, request));
  }

  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const {
    return channel_->NewContext(deadline);
  }
  absl::Status WaitUntilConnected(absl::Time deadline) const {
    return channel_->WaitUntilConnected(deadline);
  }
  absl::Status FromCall(const grpc::Status& status) const { return channel_->FromCall(status); }

  // One unary call of the method called `name`, all attempts within `timeout` from now
  // (ClientChannel::CallUnary): the read-only ones (ReadOnlyMethods) are retried on
  // UNAVAILABLE; the others are sent once, after the channel is connected.
  template <typename Request, typename Response>
  absl::Status Call(absl::string_view name,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, absl::Duration timeout) const {
    return channel_->CallUnary(name, timeout, [&](grpc::ClientContext* context) {
      response->Clear();
      return (stub_.get()->*method)(context, request, response);
    });
  }

 private:
  const std::shared_ptr<ClientChannel> channel_;
  const std::unique_ptr<Stub> stub_;
  const grpc::internal::RpcMethod download_method_;
};

namespace remote_store_internal {

// Tensor `index` of `manifest` in manifest order: its model tensors, then its state tensors.
inline const v1::TensorMeta& TensorAt(const v1::Manifest& manifest, int index) {
  return index < manifest.tensors_size() ? manifest.tensors(index)
                                         : manifest.state_tensors(index - manifest.tensors_size());
}

}  // namespace remote_store_internal
}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_INTERNAL_REMOTE_STORE_CONNECTION_H_
