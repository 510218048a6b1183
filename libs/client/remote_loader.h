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
// initial_backoff, within its deadline, once the channel has reconnected: Preflight and Export
// from the start (a half-written export is discarded first). See libs/rpc/client_channel.h.
// Other errors pass through with the server's code and message.
//
// A loader fleet: `address` may list several loaders (HOST:PORT,HOST:PORT) or name them in DNS
// (dns:///NAME:PORT); calls are then spread round-robin over the loaders whose health status
// for ckpt.v1.Loader is SERVING. Loaders are stateless over one store, so any of them serves any
// stream of a load.
//
// A Load survives a loader going away: when its stream breaks with UNAVAILABLE after some
// tensors arrived and passed their checks, the load is resumed for the tensors not yet complete
// (LoadRequest.only_tensors) on the channel -- another loader, for a fleet -- with the version
// pinned by number to the one the first stream served, and the resumed stream's manifest must
// equal the first one. A resumption that brings at least one more tensor does not count against
// max_retries; one that brings none does, with backoff, as a restart would. A tensor whose
// bytes were cut off is received again from its first byte.
//
// A Load split over several streams (Arrow Flight style, options.streams > 1): the manifest
// alone first, then the tensors in `streams` groups of about equal bytes, each its own Load
// stream (restricted with LoadRequest.only_tensors, version pinned) running at once and resumed
// on its own as above; every stream's manifest must equal the first, every tensor passes the
// same checks, and the tensors are assembled into one LoadedState. On one loader the streams
// share its connection; with a fleet round-robin spreads them over the loaders.
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

#include <atomic>
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

// Address (one loader, a list or a DNS name), credentials, deadlines and retries: the shape
// every ckpt client shares (libs/rpc/client_channel.h). `deadline` bounds a Preflight call,
// `stream_deadline` a whole Load (every stream, resumptions included) or Export stream.
struct RemoteLoaderOptions : ClientOptions {
  // Load streams one Load runs at once, each for about 1/streams of the bytes (see above); 1
  // (the default) is one stream, as loaders built before LoadRequest.only_tensors serve it.
  int streams = 1;
};

// What a RemoteLoader has done, for logs and tests.
struct RemoteLoaderCounters {
  int64_t load_streams = 0;     // Load streams opened (manifest-only ones included).
  int64_t resumed_streams = 0;  // of those, restarts and resumptions after a broken stream.
  int64_t tensor_bytes = 0;     // tensor bytes received (bytes received twice count twice).
};

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
  RemoteLoaderCounters counters() const;

 private:
  class LoadRun;

  RemoteLoader(std::shared_ptr<ClientChannel> channel, int streams);

  const std::shared_ptr<ClientChannel> channel_;
  const int streams_;
  mutable std::atomic<int64_t> load_streams_{0};
  mutable std::atomic<int64_t> resumed_streams_{0};
  mutable std::atomic<int64_t> tensor_bytes_{0};
  const std::unique_ptr<v1::Loader::Stub> stub_;  // Preflight and Export.
  // Load, read as raw messages (libs/rpc/tensor_data_message), for the bytes' sake.
  const grpc::internal::RpcMethod load_method_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_CLIENT_REMOTE_LOADER_H_
