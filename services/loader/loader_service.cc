#include "services/loader/loader_service.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/auth/access_policy.h"
#include "libs/io/xxh3.h"
#include "libs/loader/export.h"
#include "libs/loader/load_target.h"
#include "libs/loader/loader.h"
#include "libs/loader/loader_proto.h"
#include "libs/loader/served_load.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/version_ref.h"

namespace ckpt {
namespace {

// The piece size a request asks for (libs/rpc/wire_constants.h: 0 is 1 MiB, others are clamped
// into [64 KiB, 1 MiB]).
absl::StatusOr<size_t> PieceBytes(int32_t requested) {
  if (requested < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must not be negative, got ", requested));
  }
  return static_cast<size_t>(StreamedPieceBytes(requested, kMaxLoaderPieceBytes));
}

}  // namespace

// Holds one of max_concurrent_streams while a stream runs.
class LoaderService::StreamSlot {
 public:
  explicit StreamSlot(LoaderService& service) : service_(service) {
    absl::MutexLock lock(&service_.mu_);
    acquired_ = service_.active_streams_ < service_.options_.max_concurrent_streams;
    if (acquired_) ++service_.active_streams_;
  }
  ~StreamSlot() {
    if (!acquired_) return;
    absl::MutexLock lock(&service_.mu_);
    --service_.active_streams_;
  }
  absl::Status status() const {
    if (acquired_) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat("the loader is serving its limit of ",
                                                     service_.options_.max_concurrent_streams,
                                                     " Load / Export streams; retry later"));
  }

 private:
  LoaderService& service_;
  bool acquired_ = false;
};

absl::StatusOr<std::unique_ptr<LoaderService>> LoaderService::Create(CheckpointStore* store,
                                                                     LoaderServiceOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("LoaderService needs a store");
  if (options.cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_bytes must not be negative, got ", options.cache_bytes));
  }
  if (options.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams must be at least 1, got ", options.max_concurrent_streams));
  }
  return std::unique_ptr<LoaderService>(new LoaderService(store, std::move(options)));
}

LoaderService::LoaderService(CheckpointStore* store, LoaderServiceOptions options)
    : store_(*store),
      options_(std::move(options)),
      access_(AccessPolicy::Resolve(options_.access, options_.auth_token)),
      loader_(*store, options_.cache_bytes),
      payload_pool_(PayloadPool::Create(kMaxLoaderPieceBytes, /*max_idle=*/8)) {}

absl::Status LoaderService::Authorize(const grpc::ServerContextBase& context,
                                      absl::string_view method, absl::string_view model) const {
  return access_->Check(context, "loader", method, model).status();
}

// A Load stream: the blocking DoLoad on a thread of the reactor's own, each write waited for.
// Once its thread calls Finish it touches nothing more, so OnDone (on a gRPC thread, or inline
// in that very Finish) can join or release it and delete the reactor.
class LoaderService::LoadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  LoadReactor(LoaderService* service, grpc::CallbackServerContext* context,
              const grpc::ByteBuffer* request)
      : service_(*service), context_(*context) {
    absl::Status ready = ParseFromByteBuffer(*request, "LoadRequest", &request_);
    if (ready.ok()) ready = service_.Authorize(context_, "Load", request_.ref().model());
    if (ready.ok()) {
      slot_.emplace(service_);
      ready = slot_->status();
    }
    if (!ready.ok()) {
      slot_.reset();
      Finish(ToGrpcStatus(ready));
      return;
    }
    thread_ = std::thread([this] {
      const absl::Status status =
          service_.DoLoad(context_, request_,
                          [this](grpc::ByteBuffer message) { return Write(std::move(message)); });
      // The slot is free before the client hears the status, so it may start another stream
      // at once.
      slot_.reset();
      Finish(ToGrpcStatus(status));
    });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_ok_ = ok;
    write_pending_ = false;
  }

  void OnDone() override {
    if (thread_.joinable()) {
      if (thread_.get_id() == std::this_thread::get_id()) {
        thread_.detach();  // inline in the thread's own Finish, its last step.
      } else {
        thread_.join();
      }
    }
    delete this;
  }

 private:
  bool Write(grpc::ByteBuffer message) {
    message_ = std::move(message);
    {
      absl::MutexLock lock(&mu_);
      write_pending_ = true;
    }
    StartWrite(&message_);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* pending) { return !*pending; }, &write_pending_));
    return write_ok_;
  }

  LoaderService& service_;
  grpc::CallbackServerContext& context_;
  std::optional<StreamSlot> slot_;
  v1::LoadRequest request_;
  grpc::ByteBuffer message_;  // the message being written.
  absl::Mutex mu_;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  std::thread thread_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* LoaderService::Load(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new LoadReactor(this, context, request);
}

grpc::Status LoaderService::Preflight(grpc::ServerContext* context,
                                      const v1::PreflightRequest* request,
                                      v1::PreflightResponse* response) {
  if (absl::Status authorized = Authorize(*context, "Preflight", request->ref().model());
      !authorized.ok()) {
    return ToGrpcStatus(authorized);
  }
  return ToGrpcStatus(DoPreflight(*request, *response));
}

grpc::Status LoaderService::Export(grpc::ServerContext* context, const v1::ExportRequest* request,
                                   grpc::ServerWriter<v1::ExportResponse>* writer) {
  if (absl::Status authorized = Authorize(*context, "Export", request->ref().model());
      !authorized.ok()) {
    return ToGrpcStatus(authorized);
  }
  StreamSlot slot(*this);
  if (!slot.status().ok()) return ToGrpcStatus(slot.status());
  return ToGrpcStatus(DoExport(*context, *request, *writer));
}

namespace {

// A Load stream's end of ServedLoad::Send: the manifest went first; here each tensor's bytes go in
// TensorData messages of at most `piece_bytes`, and digests as LoadResponse.digest.
class GrpcLoadSink final : public ServedLoadSink {
 public:
  GrpcLoadSink(const grpc::ServerContextBase& context, const std::string& where, size_t piece_bytes,
               PayloadPool& pool, const LoaderServiceOptions& options, int64_t stream,
               const std::function<bool(grpc::ByteBuffer)>& write)
      : context_(context),
        where_(where),
        piece_bytes_(piece_bytes),
        pool_(pool),
        tamper_(options.tamper_for_testing),
        stream_(stream),
        write_(write) {}

  Placement Place(const ServedTensor&) override { return Placement::kPieces; }

  // Straight from their memory when `owner` keeps it alive (a cached chunk, which stays valid
  // after an eviction while gRPC holds it; a cast tensor), else each piece copied once into a
  // pooled buffer.
  absl::Status Piece(const ServedTensor& tensor, int64_t offset, absl::string_view bytes,
                     const std::shared_ptr<const void>& owner) override {
    while (!bytes.empty()) {
      RETURN_IF_ERROR(Interrupted());
      const size_t n = std::min(bytes.size(), piece_bytes_);
      grpc::ByteBuffer piece;
      if (owner != nullptr && !tamper_) {
        piece = TensorDataResponse(tensor.index, offset, bytes.substr(0, n), owner);
      } else {
        std::shared_ptr<char> copy = pool_.Take();
        const absl::string_view copied(copy.get(), n);  // before `copy` is moved from.
        std::memcpy(copy.get(), bytes.data(), n);
        if (tamper_) tamper_({stream_, false, tensor.index, offset}, absl::MakeSpan(copy.get(), n));
        piece = TensorDataResponse(tensor.index, offset, copied, std::move(copy));
      }
      RETURN_IF_ERROR(Write(std::move(piece)));
      bytes.remove_prefix(n);
      offset += static_cast<int64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Digest(const v1::TensorDigest& digest) override {
    v1::LoadResponse response;
    *response.mutable_digest() = digest;
    return Write(SerializeToByteBuffer(response));
  }

  absl::Status Interrupted() override {
    if (!context_.IsCancelled()) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("the Load of ", where_, " was cancelled"));
  }

  absl::Status Write(grpc::ByteBuffer message) {
    if (write_(std::move(message))) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("the Load stream of ", where_, " broke"));
  }

 private:
  const grpc::ServerContextBase& context_;
  const std::string& where_;
  const size_t piece_bytes_;
  PayloadPool& pool_;
  const std::function<void(const LoaderServiceOptions::OutgoingPiece&, absl::Span<char>)>& tamper_;
  const int64_t stream_;
  const std::function<bool(grpc::ByteBuffer)>& write_;
};

}  // namespace

absl::Status LoaderService::DoLoad(const grpc::ServerContextBase& context,
                                   const v1::LoadRequest& request, const MessageWriter& write) {
  ASSIGN_OR_RETURN(const size_t piece_bytes, PieceBytes(request.max_message_bytes()));
  ASSIGN_OR_RETURN(const std::unique_ptr<VersionReader> reader, store_.OpenVersion(request.ref()));
  ASSIGN_OR_RETURN(const ServedLoad load, ServedLoad::Plan(reader->manifest(), request));
  GrpcLoadSink sink(context, load.where(), piece_bytes, *payload_pool_, options_,
                    streams_started_.fetch_add(1), write);
  v1::LoadResponse response;
  *response.mutable_manifest() = load.manifest();
  RETURN_IF_ERROR(sink.Write(SerializeToByteBuffer(response)));
  return load.Send(*reader, &loader_.cache(), request.send_digests(), sink);
}

absl::Status LoaderService::DoPreflight(const v1::PreflightRequest& request,
                                        v1::PreflightResponse& response) {
  ASSIGN_OR_RETURN(LoadTarget target, LoadTargetFromProto(request.target()));
  ASSIGN_OR_RETURN(std::vector<ExpectedTensor> expected,
                   ExpectedTensorsFromProto(request.expected()));
  ASSIGN_OR_RETURN(PreflightReport report, loader_.Preflight(request.ref(), expected, target));
  response = PreflightReportToProto(report);
  return absl::OkStatus();
}

absl::Status LoaderService::DoExport(grpc::ServerContext& context, const v1::ExportRequest& request,
                                     grpc::ServerWriter<v1::ExportResponse>& writer) {
  ExportOptions options;
  ASSIGN_OR_RETURN(options.format, ExportFormatFromProto(request.format()));
  ASSIGN_OR_RETURN(options.target, LoadTargetFromProto(request.target()));
  ASSIGN_OR_RETURN(const size_t piece_bytes, PieceBytes(request.max_message_bytes()));
  ASSIGN_OR_RETURN(const std::unique_ptr<VersionReader> reader, loader_.OpenVersion(request.ref()));
  const v1::Manifest& manifest = reader->manifest();
  const std::string where = FormatVersionRef(manifest.model(), manifest.version());
  const int64_t stream = streams_started_.fetch_add(1);
  int64_t offset = 0;
  bool first = true;
  return ExportToSink(*reader, options, piece_bytes,
                      [&](const ExportResult& prepared, uint64_t total_bytes,
                          absl::string_view bytes) -> absl::Status {
                        if (context.IsCancelled()) {
                          return absl::CancelledError(
                              absl::StrCat("the Export of ", where, " was cancelled"));
                        }
                        v1::ExportResponse piece;
                        piece.set_data(bytes.data(), bytes.size());
                        piece.set_offset(offset);
                        piece.set_xxh3_64(Xxh3(bytes));
                        if (request.sha256_pieces()) piece.set_sha256(Sha256(bytes));
                        if (options_.tamper_for_testing) {
                          std::string& data = *piece.mutable_data();
                          options_.tamper_for_testing({stream, true, 0, offset},
                                                      absl::MakeSpan(data.data(), data.size()));
                        }
                        offset += static_cast<int64_t>(bytes.size());
                        if (first) {
                          piece.set_total_bytes(static_cast<int64_t>(total_bytes));
                          piece.set_file_name(
                              ExportFileName(manifest.model(), manifest.version(), options.format));
                          piece.set_version(prepared.version);
                          for (const std::string& item : prepared.left_out) {
                            piece.add_left_out(item);
                          }
                          for (const std::string& warning : prepared.warnings) {
                            piece.add_warnings(warning);
                          }
                          first = false;
                        }
                        if (!writer.Write(piece)) {
                          return absl::CancelledError(
                              absl::StrCat("the Export stream of ", where, " broke"));
                        }
                        return absl::OkStatus();
                      })
      .status();
}

}  // namespace ckpt
