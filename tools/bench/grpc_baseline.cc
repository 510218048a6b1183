#include "tools/bench/grpc_baseline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/server_builder.h"
#include "libs/io/prefault.h"
#include "libs/rpc/grpc_server.h"
#include "libs/rpc/wire_constants.h"
#include "libs/status/status_macros.h"

namespace ckpt::bench {
namespace {

constexpr char kStreamMethod[] = "/ckpt.bench.GrpcBaseline/Stream";

// Reads the one request, then writes the workload's bytes one message at a time (the callback
// API allows one write in flight, as for the store's Download reactor).
class StreamReactor : public grpc::ServerGenericBidiReactor {
 public:
  explicit StreamReactor(const Workload* workload) : workload_(workload) {
    if (workload_ == nullptr) {
      Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no workload to send"));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client sent no request"));
      return;
    }
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const std::vector<at::Tensor>& tensors = workload_->tensors;
    while (tensor_ < tensors.size() && offset_ >= tensors[tensor_].nbytes()) {
      ++tensor_;
      offset_ = 0;
    }
    if (tensor_ == tensors.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const at::Tensor& tensor = tensors[tensor_];
    const size_t length =
        std::min<size_t>(static_cast<size_t>(kMaxTensorDataBytes), tensor.nbytes() - offset_);
    // A static slice: gRPC sends from the tensor's memory and frees nothing.
    grpc::Slice slice(static_cast<const char*>(tensor.data_ptr()) + offset_, length,
                      grpc::Slice::STATIC_SLICE);
    message_ = grpc::ByteBuffer(&slice, 1);
    offset_ += length;
    StartWrite(&message_);
  }

  const Workload* const workload_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer message_;
  size_t tensor_ = 0;
  size_t offset_ = 0;
};

// Any other method: UNIMPLEMENTED, naming the one method this server has.
class UnknownMethodReactor : public grpc::ServerGenericBidiReactor {
 public:
  explicit UnknownMethodReactor(const std::string& method) {
    Finish(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("the gRPC baseline serves only ", kStreamMethod, ", not ", method)));
  }
  void OnDone() override { delete this; }
};

class StreamService : public grpc::CallbackGenericService {
 public:
  void set_workload(const Workload* workload) {
    absl::MutexLock lock(&mu_);
    workload_ = workload;
  }
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    if (context->method() != kStreamMethod) {
      return new UnknownMethodReactor(context->method());
    }
    absl::MutexLock lock(&mu_);
    return new StreamReactor(workload_);
  }

 private:
  absl::Mutex mu_;
  const Workload* workload_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class GrpcBaselineImpl : public GrpcBaseline {
 public:
  GrpcBaselineImpl() : method_(kStreamMethod, grpc::internal::RpcMethod::SERVER_STREAMING) {}
  ~GrpcBaselineImpl() override {
    if (server_ != nullptr)
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  absl::Status Init() {
    const GrpcServerOptions defaults;  // the store's server limits.
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.SetMaxReceiveMessageSize(defaults.max_message_bytes);
    builder.SetMaxSendMessageSize(defaults.max_message_bytes);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::InternalError("gRPC baseline: the server did not start on 127.0.0.1");
    }
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(64 << 20);  // ClientOptions' default.
    arguments.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // as ClientChannel sets it.
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), arguments);
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      return absl::UnavailableError("gRPC baseline: no connection to its own server");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> TimeStream(const Workload& workload, std::vector<at::Tensor>& destinations,
                                    bool prefault) override {
    service_.set_workload(&workload);
    const auto start = std::chrono::steady_clock::now();
    if (prefault) {
      for (at::Tensor& destination : destinations) {
        PrefaultForWrite(destination.data_ptr(), destination.nbytes());
      }
    }
    grpc::ClientContext context;
    grpc::Slice empty;
    const grpc::ByteBuffer request(&empty, 1);
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), method_,
                                                                      &context, request));
    size_t destination = 0;
    size_t placed = 0;  // bytes of destinations[destination] already written.
    int64_t total = 0;
    grpc::ByteBuffer message;
    std::vector<grpc::Slice> slices;
    absl::Status placing = absl::OkStatus();
    while (stream->Read(&message)) {
      if (!placing.ok()) continue;  // drain, so Finish reports the server's status.
      if (!message.Dump(&slices).ok()) {
        placing = absl::InternalError("gRPC baseline: a message could not be read");
        continue;
      }
      for (const grpc::Slice& slice : slices) {
        if (!placing.ok()) break;
        const char* bytes = reinterpret_cast<const char*>(slice.begin());
        size_t left = slice.size();
        while (left > 0) {
          while (destination < destinations.size() &&
                 placed == destinations[destination].nbytes()) {
            ++destination;
            placed = 0;
          }
          if (destination == destinations.size()) {
            placing = absl::InternalError(
                absl::StrCat("gRPC baseline: more bytes arrived than the destinations hold (",
                             total, " bytes)"));
            break;
          }
          at::Tensor& into = destinations[destination];
          const size_t length = std::min(left, into.nbytes() - placed);
          std::memcpy(static_cast<char*>(into.data_ptr()) + placed, bytes, length);
          placed += length;
          bytes += length;
          left -= length;
          total += static_cast<int64_t>(length);
        }
      }
    }
    const grpc::Status finished = stream->Finish();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    service_.set_workload(nullptr);
    if (!finished.ok()) {
      return absl::InternalError(
          absl::StrCat("gRPC baseline: the stream failed: ", finished.error_message()));
    }
    RETURN_IF_ERROR(placing);
    if (total != workload.bytes) {
      return absl::InternalError(
          absl::StrCat("gRPC baseline: received ", total, " bytes of ", workload.bytes));
    }
    return seconds;
  }

 private:
  StreamService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  const grpc::internal::RpcMethod method_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcBaseline>> GrpcBaseline::Start() {
  auto baseline = std::make_unique<GrpcBaselineImpl>();
  RETURN_IF_ERROR(baseline->Init());
  return baseline;
}

}  // namespace ckpt::bench
