// StoreService's Download stream (see store_service.h): the DownloadReactor.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/auth/access_policy.h"
#include "libs/auth/model_scope.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/download_plan.h"
#include "libs/store/scoped_store.h"
#include "services/checkpoint_store/internal/requests.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt {
namespace {

using store_service_internal::Cancelled;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Download: the manifest, then the selected tensors' bytes, one store chunk at a time. Each chunk
// is read (and verified, unless the client checks chunks itself) into a buffer of the service's
// PayloadPool on the work queue, and its messages point into that buffer (no copy into a
// protobuf, none into gRPC's slices); the buffer goes back to the pool when gRPC lets go of it.
//
// Reading and sending overlap: while the messages of chunk i are written (OnWriteDone sends the
// next piece), chunk i+1 is read on the work queue, so neither the socket nor the reader waits
// for the other (on two cores a strictly alternating reactor sent 1.7 GiB/s, docs/benchmarks/,
// R4'). At most two chunks are held: `sending_` (being written) and `ready_` (read, waiting for the
// writer). Under mu_:
//   - at most one read task is on the queue or running (reading_), and one is started only when
//     the `ready_` slot is empty;
//   - `ready_` is set only while a write is in flight (writing_); a write that completes moves it
//     to `sending_`, so no read chunk ever waits with no write to pick it up;
//   - a failure (a read error, cancellation, a broken stream) is recorded in `failed_`; chunks
//     read before the failing one are still sent (what arrived is the sound chunks in order), and
//     the call finishes once neither a read nor a write is outstanding. Finish runs exactly once:
//     only from the side that leaves both reading_ and writing_ false, under `finished_`.
class StoreService::DownloadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadReactor(StoreService* service, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer* request)
      : service_(*service), context_(*context) {
    service_.StreamStarted();
    absl::Status ready = ParseFromByteBuffer(*request, "DownloadRequest", &request_);
    if (ready.ok()) {
      absl::StatusOr<Caller> caller =
          service_.Authorize(context_, "Download", request_.ref().model());
      ready = caller.status();
      if (caller.ok()) caller_ = *std::move(caller);
    }
    if (!ready.ok()) {
      Finish(ToGrpcStatus(ready));
      return;
    }
    service_.Schedule([this] { Open(); });
  }

  void OnWriteDone(bool ok) override {
    if (ok && sending_.position < sending_.size) {
      WriteNextPiece();
      return;
    }
    Next next;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && failed_.ok()) {
        failed_ = grpc::Status(grpc::StatusCode::CANCELLED, "the download stream broke");
      }
      next = NextLocked();
    }
    Run(next);
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    // The side that did not finish may still be leaving mu_ (its unlock came before the
    // finishing side's lock); wait until it has.
    { absl::MutexLock lock(&mu_); }
    StoreService& service = service_;
    delete this;
    service.StreamDone();
  }

 private:
  // A chunk read into a pooled buffer, and how much of it was sent.
  struct Chunk {
    std::shared_ptr<char> buffer;
    size_t size = 0;
    size_t position = 0;   // bytes already written.
    int tensor_index = 0;  // the tensor (manifest order) it belongs to...
    int64_t offset = 0;    // ...and where it starts in it.
  };

  // What to do after a state change, decided under mu_ and done outside it (gRPC may run a
  // reaction on another thread as soon as StartWrite or Finish is called).
  struct Next {
    bool write = false;   // sending_ was set: write its first piece.
    bool read = false;    // schedule a read task.
    bool finish = false;  // finish the call with `status`.
    grpc::Status status;
  };

  // Under mu_, with no write in flight: the writer's next step.
  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Next next;
    if (ready_.has_value() && failed_.error_code() != grpc::StatusCode::CANCELLED) {
      sending_ = *std::move(ready_);
      ready_.reset();
      writing_ = true;
      next.write = true;
    } else {
      ready_.reset();  // a broken or cancelled stream sends nothing more.
    }
    if (!reading_ && !reads_done_ && failed_.ok()) {
      reading_ = true;
      next.read = true;
    }
    if (!writing_ && !reading_ && (reads_done_ || !failed_.ok()) && !finished_) {
      finished_ = true;
      next.finish = true;
      next.status = failed_;
    }
    return next;
  }

  void Run(const Next& next) {
    if (next.finish) {
      Finish(next.status);
      return;
    }
    if (next.read) service_.Schedule([this] { ReadTask(); });
    if (next.write) WriteNextPiece();
  }

  // On the work queue.
  void Open() {
    if (cancelled_.load()) {
      Finish(Cancelled());
      return;
    }
    if (absl::Status planned = Plan(); !planned.ok()) {
      Finish(ToGrpcStatus(planned));
      return;
    }
    v1::DownloadResponse manifest;
    *manifest.mutable_manifest() = reader_->manifest();
    response_ = SerializeToByteBuffer(manifest);
    {
      absl::MutexLock lock(&mu_);
      writing_ = true;
      reading_ = true;  // the first chunk is read right here while the manifest goes out.
    }
    StartWrite(&response_);
    ReadTask();
  }

  // Opens the version and decides what to send (DownloadPlan).
  absl::Status Plan() {
    if (request_.max_message_bytes() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("DownloadRequest.max_message_bytes is ",
                                                     request_.max_message_bytes(),
                                                     "; use 0 for the default (1 MiB)"));
    }
    piece_bytes_ = StreamedPieceBytes(request_.max_message_bytes(), kMaxTensorDataBytes);
    ScopedStore scoped(service_.store_, ModelScope(caller_.models), Who(caller_));
    ASSIGN_OR_RETURN(reader_, scoped.OpenVersion(request_.ref()));
    ASSIGN_OR_RETURN(DownloadPlan plan, DownloadPlan::Create(reader_->manifest(), request_));
    plan_.emplace(std::move(plan));
    return absl::OkStatus();
  }

  // On the work queue, the only read task (reading_): reads the next chunk of the plan, then
  // hands it to the writer (or keeps it in ready_ while a write is in flight).
  void ReadTask() {
    Chunk chunk;
    grpc::Status status = cancelled_.load() ? Cancelled() : ReadNextChunk(chunk);
    Next next;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!status.ok()) {
        if (failed_.ok()) failed_ = status;
      } else if (chunk.buffer == nullptr) {
        reads_done_ = true;
      } else if (failed_.ok()) {
        ready_ = std::move(chunk);
      }
      if (!writing_) next = NextLocked();
    }
    Run(next);
  }

  // Reads the next non-empty chunk of the plan into `chunk`; leaves chunk.buffer null when the
  // plan is done.
  grpc::Status ReadNextChunk(Chunk& chunk) {
    const std::optional<DownloadPlan::Chunk> next = plan_->NextChunk();
    if (!next.has_value()) return grpc::Status::OK;
    // Straight into a pooled buffer: one copy from the page cache, the only one before the
    // socket. (Sending from the store's mapped pages instead cost more on the benchmark's
    // 2-vCPU virtual machine: each stream's fresh mapping is page-table work, docs/benchmarks/,
    // R4'.) A client that checks every chunk itself is sent them unchecked: one pass over every
    // byte less here (docs/benchmarks/history.md, R4'). Lengths and locations are checked either
    // way.
    chunk.buffer = service_.payload_pool_->Take();
    chunk.size = static_cast<size_t>(next->length);
    chunk.position = 0;
    chunk.tensor_index = next->tensor_index;
    chunk.offset = next->offset;
    if (absl::Status read = plan_->ReadChunk(*reader_, *next, chunk.buffer.get()); !read.ok()) {
      chunk.buffer.reset();
      return ToGrpcStatus(read);
    }
    if (service_.options_.tamper_for_testing) {
      service_.options_.tamper_for_testing(chunk.tensor_index, chunk.offset,
                                           absl::Span<char>(chunk.buffer.get(), chunk.size));
    }
    return grpc::Status::OK;
  }

  // Writes the next piece of sending_ (only the writer touches sending_: OnWriteDone, or the side
  // that set writing_ under mu_).
  void WriteNextPiece() {
    Chunk& chunk = sending_;
    const size_t size = std::min(chunk.size - chunk.position, static_cast<size_t>(piece_bytes_));
    response_ = TensorDataResponse(
        chunk.tensor_index, chunk.offset + static_cast<int64_t>(chunk.position),
        absl::string_view(chunk.buffer.get() + chunk.position, size), chunk.buffer);
    chunk.position += size;
    // The last piece's slice holds the buffer now; it returns to the pool when gRPC is done.
    if (chunk.position == chunk.size) chunk.buffer.reset();
    StartWrite(&response_);
  }

  StoreService& service_;
  grpc::CallbackServerContext& context_;
  v1::DownloadRequest request_;  // set in the constructor, read-only after.
  Caller caller_;                // likewise.
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<VersionReader> reader_;
  int piece_bytes_ = kMaxTensorDataBytes;
  // What to send; its cursor is the read task's alone.
  std::optional<DownloadPlan> plan_;
  // The writer's (see WriteNextPiece).
  Chunk sending_;
  grpc::ByteBuffer response_;  // the message being written.

  absl::Mutex mu_;
  std::optional<Chunk> ready_ ABSL_GUARDED_BY(mu_);  // read, waiting for the writer.
  bool reading_ ABSL_GUARDED_BY(mu_) = false;        // a read task is queued or running.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;        // a write is in flight.
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;     // the plan was read to its end.
  grpc::Status failed_ ABSL_GUARDED_BY(mu_);         // the first failure; OK while none.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;       // Finish was called.
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* StoreService::Download(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new DownloadReactor(this, context, request);
}

}  // namespace ckpt
