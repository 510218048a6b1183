#ifndef CKPT_LIBS_RPC_WIRE_CONSTANTS_H_
#define CKPT_LIBS_RPC_WIRE_CONSTANTS_H_

// The numbers and names both ends of the ckpt.v1 wire protocol must agree on, in one header the
// services (services/...) and the clients (libs/client) include, so they cannot drift apart. The
// metadata that says who a caller is lives with the access policy, in libs/auth/metadata.h.

namespace ckpt {

// ---- ckpt.v1.CheckpointStore.
// Bytes of tensor data one TensorData message may carry, in either direction (1 MiB).
inline constexpr int kMaxTensorDataBytes = 1 << 20;
// The smallest piece a Download, Load or Export sends (64 KiB): a smaller max_message_bytes in the
// request is raised to it, since tiny pieces turn one version into millions of messages.
inline constexpr int kMinStreamedPieceBytes = 64 << 10;

// The bytes of tensor data per message for a request's max_message_bytes (not negative; each
// service names a negative one in its own error): 0 means `maximum`, any other value is clamped
// into [kMinStreamedPieceBytes, maximum].
constexpr int StreamedPieceBytes(int requested, int maximum) {
  if (requested == 0 || requested > maximum) return maximum;
  return requested < kMinStreamedPieceBytes ? kMinStreamedPieceBytes : requested;
}
// Page sizes of ListModels / ListVersions when the request says 0, and the most one page holds.
inline constexpr int kDefaultPageSize = 100;
inline constexpr int kMaxPageSize = 1000;
// Upload metadata: the server's acceptance of the header, and its validation warnings.
inline constexpr char kUploadAcceptedMetadata[] = "ckpt-upload-accepted";
inline constexpr char kUploadWarningMetadata[] = "ckpt-upload-warning-bin";
// Sent with kUploadAcceptedMetadata to a part of an upload (UploadHeader.join): the upload's model.
inline constexpr char kUploadJoinedModelMetadata[] = "ckpt-upload-joined-model-bin";
// Methods the clients read as raw messages (libs/rpc/tensor_data_message.h).
inline constexpr char kDownloadMethod[] = "/ckpt.v1.CheckpointStore/Download";

// ---- Every connection. Clients ping an idle or busy connection every kKeepaliveIntervalMs and
// close it when the answer takes over kKeepaliveTimeoutMs: a server that is paused (SIGSTOP, a
// stalled VM) or cut off keeps its TCP connection open, and without pings its calls would hang
// until their deadlines instead of failing over (UNAVAILABLE) to another server of a list within
// about two seconds. Servers accept pings that often (GrpcServer). clients/python mirrors both.
inline constexpr int kKeepaliveIntervalMs = 1000;
inline constexpr int kKeepaliveTimeoutMs = 1000;

// ---- ckpt.v1.Loader.
// Tensor bytes one Load / Export message carries at most (1 MiB).
inline constexpr int kMaxLoaderPieceBytes = 1 << 20;
inline constexpr char kLoadMethod[] = "/ckpt.v1.Loader/Load";

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_WIRE_CONSTANTS_H_
