#ifndef CKPT_LIBS_CLIENT_REMOTE_LOADER_H_
#define CKPT_LIBS_CLIENT_REMOTE_LOADER_H_

// RemoteLoader: the C++ client of a loader server (//services/loader, ckpt.v1.Loader), and the
// Loader (libs/loader/loader_interface.h) whose work happens there. What other
// teams link to get a stored version into their process in their own shape: the server selects,
// renames and casts; this client receives the stream and places each tensor on the target
// device as soon as its bytes are complete. For an accelerator target (cuda:N) each tensor is
// received into pinned host memory and copied on a side stream (libs/tensor/side_stream_copies.h)
// while the next ones arrive; Load returns with the device's current stream ordered after the
// copies, so the caller's kernels see the tensors without a host-side synchronization.
//
// Calls carry deadlines: `deadline` for Preflight, `stream_deadline` for Load and Export. Every
// call of the loader only reads, so a call that fails with UNAVAILABLE (server restarting,
// connection reset) is tried again, up to max_retries times with exponential backoff from
// initial_backoff, within its deadline: Preflight by gRPC's retry policy, Load and Export
// restarted from the start by the client once the channel has reconnected (a half-received
// stream is discarded first). See libs/rpc/client_channel.h. Other errors pass through with the
// server's code and message.
//
// Uploads are the store's business: use RemoteCheckpointStore (remote_checkpoint_store.h),
// e.g. CommitCheckpoint for a state dict or bundle, which streams it in 1 MiB pieces.
//
// Thread-safety: every method may be called concurrently (one shared channel).
//
// Example:
//   RemoteLoaderOptions options;
//   options.address = "127.0.0.1:50052";
//   options.auth_token = token;  // "" for a server without --auth_token_file
//   ASSIGN_OR_RETURN(std::unique_ptr<RemoteLoader> loader, RemoteLoader::Connect(options));
//   ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef("resnet@best"));
//   ASSIGN_OR_RETURN(PreflightReport report,
//                    loader->Preflight(ref, ExpectedTensorsOf(net), LoadTarget()));
//   LoadTarget target;
//   target.device = *ParseDevice("cuda:0");
//   ASSIGN_OR_RETURN(LoadedState state, loader->Load(ref, target));

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libs/loader/export.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/loader/loader_interface.h"
#include "libs/rpc/client_channel.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"
#include "proto/ckpt/v1/types.pb.h"

namespace ckpt {

// Address, credentials, deadlines and retries: the shape every ckpt client shares
// (libs/rpc/client_channel.h). `deadline` bounds a Preflight call, `stream_deadline` a Load or
// Export stream, restarts included.
using RemoteLoaderOptions = ClientOptions;

class RemoteLoader final : public Loader {
 public:
  // Opens a channel and waits up to connect_timeout for it. INVALID_ARGUMENT for bad options;
  // UNAVAILABLE naming the address when it does not connect.
  static absl::StatusOr<std::unique_ptr<RemoteLoader>> Connect(const RemoteLoaderOptions& options);

  // `ref` adapted to `target` by the server, each tensor placed on target.device here.
  // LoadedState.manifest is the adapted manifest the server sent (consumer keys, cast dtypes).
  // FAILED_PRECONDITION (before any call) when target.device is unusable in this process;
  // DATA_LOSS when the stream is inconsistent with its manifest; server errors as they are.
  absl::StatusOr<LoadedState> Load(const v1::VersionRef& ref,
                                   const LoadTarget& target) const override;

  // The compatibility report of `ref` (restricted to target's subset, keys under target.keys)
  // against `expected`, computed by the server; moves no tensor bytes.
  absl::StatusOr<PreflightReport> Preflight(const v1::VersionRef& ref,
                                            const std::vector<ExpectedTensor>& expected,
                                            const LoadTarget& target) const override;

  // Streams the export of `ref` into `path`, atomically: the model's state dict, or the whole
  // training bundle when options.target includes optimizer or scheduler state (format torch;
  // see libs/loader/export.h), with what the file leaves out in ExportResult::left_out.
  // options.progress (may be empty) is called with bytes received and the file's total. Errors
  // from the server, and from the filesystem as AtomicFileWriter reports them; DATA_LOSS when
  // fewer or more bytes arrive than announced.
  absl::StatusOr<ExportResult> Export(const v1::VersionRef& ref, const ExportOptions& options,
                                      const std::string& path) const override;

  const std::string& address() const { return channel_->options().address; }

 private:
  explicit RemoteLoader(std::shared_ptr<ClientChannel> channel);

  const std::shared_ptr<ClientChannel> channel_;
  const std::unique_ptr<v1::Loader::Stub> stub_;  // Preflight and Export.
  // Load, read as raw messages (libs/rpc/tensor_data_message), for the bytes' sake.
  const grpc::internal::RpcMethod load_method_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_REMOTE_LOADER_H_
