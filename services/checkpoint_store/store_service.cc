#include "services/checkpoint_store/store_service.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/rpc/access_policy.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/audited_store.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/model_scope.h"
#include "libs/store/refused_call_log.h"
#include "libs/store/scoped_store.h"
#include "libs/store/version_ref.h"
#include "services/checkpoint_store/internal/requests.h"
#include "services/checkpoint_store/internal/work_queue.h"

namespace ckpt {
namespace {

using store_service_internal::Because;
using store_service_internal::PageSize;
using store_service_internal::WorkQueue;

// Warnings travel in initial metadata, whose size gRPC limits (8 KiB by default); the complete
// list comes with the commit's UploadResponse.
constexpr size_t kMaxWarningMetadataBytes = 4096;

grpc::Status Cancelled() {
  return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
}

// The tensor `index` counts: Manifest.tensors first, then state_tensors.
const v1::TensorMeta& TensorAt(const v1::Manifest& manifest, int index) {
  return index < manifest.tensors_size() ? manifest.tensors(index)
                                         : manifest.state_tensors(index - manifest.tensors_size());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Upload: header, data..., commit. Each received message is handled on the work queue; the next
// read starts only after it was handled, so the session sees one caller at a time and gRPC's flow
// control pushes back on a client that sends faster than the store stores.
class StoreService::UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(StoreService* service, grpc::CallbackServerContext* context,
                grpc::ByteBuffer* response)
      : service_(*service), context_(*context), response_buffer_(*response) {
    service_.StreamStarted();
    // The role now; the model's scope when the header names it.
    absl::StatusOr<Caller> caller = service_.Authorize(context_, "Upload", "");
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    StartRead(&received_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed, was cancelled, or the server is shutting down: no commit came.
      service_.Schedule([this] { EndWithoutCommit(); });
      return;
    }
    service_.Schedule([this] { HandleRequest(); });
  }

  void OnCancel() override { cancelled_.store(true); }

  void OnDone() override {
    StoreService& service = service_;
    delete this;
    service.StreamDone();
  }

 private:
  // On the work queue. The last statement of every path starts a read or finishes the call; after
  // either, another thread may run this reactor's next reaction (or delete it).
  void HandleRequest() {
    if (cancelled_.load()) {
      session_.reset();  // Abandoned: nothing becomes visible.
      Finish(Cancelled());
      return;
    }
    bool accepted_header = false;
    absl::Status status = Parse();
    if (status.ok()) status = Handle(accepted_header);
    if (!status.ok()) {
      session_.reset();
      Finish(ToGrpcStatus(status));
      return;
    }
    if (committed_) {
      response_buffer_ = SerializeToByteBuffer(response_);
      Finish(grpc::Status::OK);
      return;
    }
    if (accepted_header) {
      context_.AddInitialMetadata(kUploadAcceptedMetadata, "1");
      size_t metadata_bytes = 0;
      for (const std::string& warning : session_->warnings()) {
        metadata_bytes += warning.size();
        if (metadata_bytes > kMaxWarningMetadataBytes) break;
        context_.AddInitialMetadata(kUploadWarningMetadata, warning);
      }
      StartSendInitialMetadata();
    }
    StartRead(&received_);
  }

  // received_ into request_. gRPC would report a message it cannot parse as the end of the
  // stream; parsed here, it is named as what it is.
  absl::Status Parse() {
    ++messages_;
    const size_t size = received_.Length();
    const bool parsed = ParseFromByteBuffer(received_, "UploadRequest", &request_).ok();
    received_.Clear();  // request_ holds a copy; the slices need not wait for the next read.
    if (parsed) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        messages_ == 1 ? "the first message" : absl::StrCat("message ", messages_),
        " of the Upload stream (", size,
        " bytes) could not be parsed as an UploadRequest: it is not one, or it is nested deeper "
        "than protobuf's recursion limit (100 levels); nothing was stored"));
  }

  absl::Status Handle(bool& accepted_header) {
    switch (request_.part_case()) {
      case v1::UploadRequest::kHeader: {
        if (session_ != nullptr) {
          return absl::InvalidArgumentError("the Upload stream sent a second UploadHeader");
        }
        const v1::UploadHeader& header = request_.header();
        absl::Status allowed = AccessPolicy::Authorize(caller_, "Upload", header.model());
        service_.NoteRefusal(caller_, "Upload", header.model(), allowed);
        RETURN_IF_ERROR(allowed);
        CommitOptions options;
        options.expected_latest_version = header.expected_latest_version();
        options.aliases.assign(header.aliases().begin(), header.aliases().end());
        options.attribution.reason = header.reason();
        // The session keeps scoped_, not this AuditedStore; its Commit is audited.
        scoped_ = std::make_unique<ScopedStore>(service_.store_, ModelScope(caller_.models),
                                                Who(caller_));
        AuditedStore audited(*scoped_, ActorOf(caller_));
        v1::Manifest manifest = header.manifest();
        if (header.normalize_keys()) RETURN_IF_ERROR(NormalizeHeaderKeys(manifest));
        ASSIGN_OR_RETURN(session_,
                         audited.BeginUpload(header.model(), std::move(manifest), options));
        aliases_ = std::set<std::string>(header.aliases().begin(), header.aliases().end());
        accepted_header = true;
        return absl::OkStatus();
      }
      case v1::UploadRequest::kData: {
        const v1::TensorData& data = request_.data();
        if (session_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of an Upload must be an UploadHeader; got TensorData");
        }
        if (data.data().size() > static_cast<size_t>(kMaxTensorDataBytes)) {
          return absl::InvalidArgumentError(
              absl::StrCat("TensorData for tensor ", data.tensor_index(), " at offset ",
                           data.offset(), " holds ", data.data().size(),
                           " bytes; a message may hold at most ", kMaxTensorDataBytes, " (1 MiB)"));
        }
        return session_->AddTensorData(data.tensor_index(), data.offset(), data.data());
      }
      case v1::UploadRequest::kCommit: {
        if (session_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of an Upload must be an UploadHeader; got UploadCommit");
        }
        const auto& commit_aliases = request_.commit().aliases();
        const std::set<std::string> at_commit(commit_aliases.begin(), commit_aliases.end());
        if (!at_commit.empty() && at_commit != aliases_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "UploadCommit.aliases [", absl::StrJoin(at_commit, ", "),
              "] differ from UploadHeader.aliases [", absl::StrJoin(aliases_, ", "),
              "]: aliases are fixed when the upload begins; send them in UploadHeader.aliases"));
        }
        ASSIGN_OR_RETURN(CommitResult result, session_->Commit());
        session_.reset();
        *response_.mutable_version() = result.version;
        response_.set_logical_bytes(result.logical_bytes);
        response_.set_new_bytes(result.new_bytes);
        for (std::string& warning : result.warnings) response_.add_warnings(std::move(warning));
        committed_ = true;
        return absl::OkStatus();
      }
      case v1::UploadRequest::PART_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("an UploadRequest holds no header, data or commit");
  }

  void EndWithoutCommit() {
    const bool had_session = session_ != nullptr;
    session_.reset();
    if (cancelled_.load() || context_.IsCancelled()) {
      Finish(Cancelled());
      return;
    }
    Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        had_session ? "the Upload stream ended without an UploadCommit; nothing "
                                      "was stored"
                                    : "the Upload stream ended before its UploadHeader"));
  }

  StoreService& service_;
  grpc::CallbackServerContext& context_;
  grpc::ByteBuffer& response_buffer_;  // gRPC's; the serialized response_ at the commit.
  v1::UploadResponse response_;
  std::atomic<bool> cancelled_{false};
  grpc::ByteBuffer received_;  // the message just read, not parsed yet.
  int64_t messages_ = 0;       // read so far, for messages about them.
  v1::UploadRequest request_;
  // The caller's view of the store, made at the header; the session (destroyed first) uses it.
  std::unique_ptr<ScopedStore> scoped_;
  std::unique_ptr<UploadSession> session_;
  std::set<std::string> aliases_;
  Caller caller_;  // who opened the stream (the model scope is checked at the header).
  bool committed_ = false;
};

// ---------------------------------------------------------------------------------------------
// Download: the manifest, then the selected tensors' bytes, one store chunk at a time. Each chunk
// is read (and verified, unless the client checks chunks itself) into a buffer of the service's
// PayloadPool on the work queue, and its messages point into that buffer (no copy into a
// protobuf, none into gRPC's slices); the buffer goes back to the pool when gRPC lets go of it.
//
// Reading and sending overlap: while the messages of chunk i are written (OnWriteDone sends the
// next piece), chunk i+1 is read on the work queue, so neither the socket nor the reader waits
// for the other (on two cores a strictly alternating reactor sent 1.7 GiB/s, BENCHMARKS.md R4').
// At most two chunks are held: `sending_` (being written) and `ready_` (read, waiting for the
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

  // Opens the version and decides what to send.
  absl::Status Plan() {
    if (request_.max_message_bytes() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("DownloadRequest.max_message_bytes is ",
                                                     request_.max_message_bytes(),
                                                     "; use 0 for the default (1 MiB)"));
    }
    piece_bytes_ = StreamedPieceBytes(request_.max_message_bytes(), kMaxTensorDataBytes);
    ScopedStore scoped(service_.store_, ModelScope(caller_.models), Who(caller_));
    ASSIGN_OR_RETURN(reader_, scoped.OpenVersion(request_.ref()));
    const v1::Manifest& manifest = reader_->manifest();
    const std::string where = FormatVersionRef(manifest.model(), manifest.version());
    const absl::flat_hash_set<std::string> keys(request_.keys().begin(), request_.keys().end());
    const bool everything = keys.empty() && request_.key_prefixes().empty();
    const int candidates =
        manifest.tensors_size() + (request_.include_state() ? manifest.state_tensors_size() : 0);
    absl::flat_hash_set<std::string> found;
    for (int index = 0; index < candidates; ++index) {
      const v1::TensorMeta& meta = TensorAt(manifest, index);
      bool selected = everything || keys.contains(meta.key());
      for (const std::string& prefix : request_.key_prefixes()) {
        selected = selected || absl::StartsWith(meta.key(), prefix);
      }
      if (!selected) continue;
      if (keys.contains(meta.key())) found.insert(meta.key());
      int64_t chunk_bytes = 0;
      for (const v1::ChunkRef& chunk : meta.chunks()) chunk_bytes += chunk.length();
      if (chunk_bytes != meta.byte_length()) {
        return absl::DataLossError(absl::StrCat("tensor '", meta.key(), "' of ", where,
                                                ": its chunks hold ", chunk_bytes,
                                                " bytes, its byte_length is ", meta.byte_length()));
      }
      plan_.push_back(index);
    }
    for (const std::string& key : request_.keys()) {
      if (found.contains(key)) continue;
      const bool is_state =
          std::any_of(manifest.state_tensors().begin(), manifest.state_tensors().end(),
                      [&](const v1::TensorMeta& meta) { return meta.key() == key; });
      return absl::NotFoundError(absl::StrCat(
          "no tensor '", key, "' in ", where,
          is_state ? " among the model tensors (it is a state tensor: set include_state)" : ""));
    }
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
    while (true) {
      while (plan_position_ < plan_.size() &&
             chunk_index_ >= TensorAt(reader_->manifest(), plan_[plan_position_]).chunks_size()) {
        ++plan_position_;
        chunk_index_ = 0;
        tensor_offset_ = 0;
      }
      if (plan_position_ == plan_.size()) return grpc::Status::OK;
      const v1::TensorMeta& meta = TensorAt(reader_->manifest(), plan_[plan_position_]);
      const v1::ChunkRef& ref = meta.chunks(chunk_index_);
      // The store reads whole tensors; a one-chunk view of the tensor reads (and verifies)
      // just this chunk, so the reactor holds one chunk whatever the tensor's size.
      v1::TensorMeta one_chunk;
      one_chunk.set_key(meta.key());
      one_chunk.set_byte_length(ref.length());
      *one_chunk.add_chunks() = ref;
      if (ref.length() < 0 || ref.length() > kChunkBytes) {  // before sizing a buffer by it
        return grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("tensor '", meta.key(), "' names a chunk of ",
                                         ref.length(), " bytes; chunks hold 0..", kChunkBytes));
      }
      // Straight into a pooled buffer: one copy from the page cache, the only one before the
      // socket. (Sending from the store's mapped pages instead cost more on the benchmark's
      // 2-vCPU virtual machine: each stream's fresh mapping is page-table work, BENCHMARKS.md,
      // R4'.)
      chunk.buffer = service_.payload_pool_->Take();
      chunk.size = static_cast<size_t>(ref.length());
      chunk.position = 0;
      chunk.tensor_index = plan_[plan_position_];
      chunk.offset = tensor_offset_;
      // A client that checks every chunk itself is sent them unchecked: one pass over every
      // byte less here (BENCHMARKS.md, R4'). Lengths and locations are checked either way.
      absl::Status read =
          request_.client_checks_chunks()
              ? reader_->ReadTensorIntoForCheckingReceiver(one_chunk, chunk.buffer.get())
              : reader_->ReadTensorInto(one_chunk, chunk.buffer.get());
      if (!read.ok()) {
        chunk.buffer.reset();
        return ToGrpcStatus(absl::Status(
            read.code(),
            absl::StrCat("reading bytes ", tensor_offset_, "..", tensor_offset_ + ref.length(),
                         " of tensor '", meta.key(), "': ", read.message())));
      }
      if (service_.options_.tamper_for_testing) {
        service_.options_.tamper_for_testing(chunk.tensor_index, tensor_offset_,
                                             absl::Span<char>(chunk.buffer.get(), chunk.size));
      }
      ++chunk_index_;
      tensor_offset_ += ref.length();
      if (chunk.size > 0) return grpc::Status::OK;
      chunk.buffer.reset();
    }
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
  std::vector<int> plan_;  // tensor indices to send, in manifest order.
  // The read task's position (only the read task touches these).
  size_t plan_position_ = 0;   // the tensor being read.
  int chunk_index_ = 0;        // its next chunk to read.
  int64_t tensor_offset_ = 0;  // where that chunk starts in the tensor.
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

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<StoreService>> StoreService::Create(CheckpointStore* store,
                                                                   StoreServiceOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("StoreService needs a store");
  if (options.worker_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StoreServiceOptions.worker_threads must be at least 1, got ", options.worker_threads));
  }
  if (options.max_watches < 1 || options.watch_write_timeout <= absl::ZeroDuration() ||
      options.watch_max_lag < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StoreServiceOptions: max_watches (", options.max_watches, ") and watch_max_lag (",
        options.watch_max_lag, ") must be at least 1 and watch_write_timeout (",
        absl::FormatDuration(options.watch_write_timeout), ") positive"));
  }
  return std::unique_ptr<StoreService>(new StoreService(store, std::move(options)));
}

StoreService::StoreService(CheckpointStore* store, StoreServiceOptions options)
    : store_(*store),
      options_(std::move(options)),
      access_(AccessPolicy::Resolve(options_.access, options_.auth_token)),
      payload_pool_(PayloadPool::Create(kChunkBytes, /*max_idle=*/4)),
      refused_(std::make_unique<RefusedCallLog>(
          store_,
          RefusedCallLog::Options{
              options_.refused_calls_per_second, options_.refused_calls_burst,
              [this](std::function<void()> write) { Schedule(std::move(write)); }})),
      work_queue_(std::make_unique<WorkQueue>(options_.worker_threads)) {}

StoreService::~StoreService() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* active) { return *active == 0; }, &active_streams_));
  }
  work_queue_.reset();  // Runs what is queued, joins.
}

absl::StatusOr<Caller> StoreService::Authorize(const grpc::CallbackServerContext& context,
                                               absl::string_view method,
                                               absl::string_view model) const {
  absl::StatusOr<Caller> caller = access_->Authenticate(context, "checkpoint store");
  if (!caller.ok()) {
    refused_->Record({AccessPolicy::UnauthenticatedCallerName(context), context.peer(),
                      std::string(method), std::string(model), caller.status()});
    return caller.status();
  }
  const absl::Status allowed = AccessPolicy::Authorize(*caller, method, model);
  NoteRefusal(*caller, method, model, allowed);
  RETURN_IF_ERROR(allowed);
  return caller;
}

void StoreService::NoteRefusal(const Caller& caller, absl::string_view method,
                               absl::string_view model, const absl::Status& status) const {
  if (!absl::IsPermissionDenied(status) && !absl::IsUnauthenticated(status)) return;
  refused_->Record({caller.identity, caller.peer, std::string(method), std::string(model), status});
}

void StoreService::Schedule(std::function<void()> work) { work_queue_->Schedule(std::move(work)); }

void StoreService::StreamStarted() {
  absl::MutexLock lock(&mu_);
  ++active_streams_;
}

void StoreService::StreamDone() {
  absl::MutexLock lock(&mu_);
  --active_streams_;
}

grpc::ServerUnaryReactor* StoreService::RunUnary(
    grpc::CallbackServerContext* context, absl::string_view method, absl::string_view model,
    std::function<absl::Status(const Caller& caller, CheckpointStore& store)> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = Authorize(*context, method, model);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  Schedule([this, context, reactor, caller = *std::move(caller), method = std::string(method),
            model = std::string(model), work = std::move(work)] {
    // A call whose deadline passed while it waited in the queue is not run at all.
    if (context->IsCancelled()) {
      reactor->Finish(Cancelled());
      return;
    }
    ScopedStore scoped(store_, ModelScope(caller.models), Who(caller));
    const absl::Status status = work(caller, scoped);
    // The scoped store's refusals (a call naming no model that its scope limits) are refusals too.
    NoteRefusal(caller, method, model, status);
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StoreService::Upload(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new UploadReactor(this, context, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StoreService::Download(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new DownloadReactor(this, context, request);
}

grpc::ServerUnaryReactor* StoreService::FindMissingChunks(
    grpc::CallbackServerContext* context, const v1::FindMissingChunksRequest* request,
    v1::FindMissingChunksResponse* response) {
  return RunUnary(context, "FindMissingChunks", "",
                  [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
                    ASSIGN_OR_RETURN(std::vector<std::string> missing,
                                     store.FindMissingChunks(std::vector<std::string>(
                                         request->sha256().begin(), request->sha256().end())));
                    for (std::string& sha256 : missing)
                      response->add_missing_sha256(std::move(sha256));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* StoreService::ListModels(grpc::CallbackServerContext* context,
                                                   const v1::ListModelsRequest* request,
                                                   v1::ListModelsResponse* response) {
  return RunUnary(
      context, "ListModels", "",
      [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
        ASSIGN_OR_RETURN(const int page_size, PageSize(request->page_size()));
        // The token is the last model name of the previous page: models created or deleted between
        // pages neither repeat nor shift the listing.
        const std::string& after = request->page_token();
        if (!after.empty() && !ValidateModelName(after).ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("page_token '", after, "' is not one that ListModels returned"));
        }
        ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store.ListModels());
        std::sort(models.begin(), models.end(), [](const v1::ModelInfo& a, const v1::ModelInfo& b) {
          return a.name() < b.name();
        });
        auto it = after.empty()
                      ? models.begin()
                      : std::upper_bound(models.begin(), models.end(), after,
                                         [](const std::string& name, const v1::ModelInfo& model) {
                                           return name < model.name();
                                         });
        for (; it != models.end() && response->models_size() < page_size; ++it) {
          *response->add_models() = std::move(*it);
        }
        if (it != models.end()) {
          response->set_next_page_token(response->models(response->models_size() - 1).name());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::ListVersions(grpc::CallbackServerContext* context,
                                                     const v1::ListVersionsRequest* request,
                                                     v1::ListVersionsResponse* response) {
  return RunUnary(
      context, "ListVersions", request->model(),
      [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
        ASSIGN_OR_RETURN(const int page_size, PageSize(request->page_size()));
        int64_t after = 0;  // The last version of the previous page.
        if (!request->page_token().empty() &&
            (!absl::SimpleAtoi(request->page_token(), &after) || after < 1)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "page_token '", request->page_token(), "' is not one that ListVersions returned"));
        }
        ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> versions,
                         request->has_filter()
                             ? store.FindVersions(request->model(), request->filter())
                             : store.ListVersions(request->model()));
        std::sort(versions.begin(), versions.end(),
                  [](const v1::VersionInfo& a, const v1::VersionInfo& b) {
                    return a.version() < b.version();
                  });
        auto it = std::upper_bound(
            versions.begin(), versions.end(), after,
            [](int64_t version, const v1::VersionInfo& info) { return version < info.version(); });
        for (; it != versions.end() && response->versions_size() < page_size; ++it) {
          *response->add_versions() = std::move(*it);
        }
        if (it != versions.end()) {
          response->set_next_page_token(
              absl::StrCat(response->versions(response->versions_size() - 1).version()));
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::GetManifest(grpc::CallbackServerContext* context,
                                                    const v1::GetManifestRequest* request,
                                                    v1::Manifest* response) {
  return RunUnary(context, "GetManifest", request->ref().model(),
                  [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
                    ASSIGN_OR_RETURN(*response, store.GetManifest(request->ref()));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* StoreService::SetAlias(grpc::CallbackServerContext* context,
                                                 const v1::SetAliasRequest* request,
                                                 v1::SetAliasResponse* response) {
  return RunUnary(
      context, "SetAlias", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(
            const int64_t previous,
            audited.SetAlias(request->model(), request->alias(), request->version(),
                             request->expected_current_version(), Because(request->reason())));
        response->set_previous_version(previous);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::DeleteAlias(grpc::CallbackServerContext* context,
                                                    const v1::DeleteAliasRequest* request,
                                                    v1::DeleteAliasResponse*) {
  return RunUnary(context, "DeleteAlias", request->model(),
                  [this, request](const Caller& caller, CheckpointStore& store) -> absl::Status {
                    AuditedStore audited(store, ActorOf(caller));
                    return audited.DeleteAlias(request->model(), request->alias(),
                                               Because(request->reason()));
                  });
}

grpc::ServerUnaryReactor* StoreService::DeleteVersion(grpc::CallbackServerContext* context,
                                                      const v1::DeleteVersionRequest* request,
                                                      v1::DeleteVersionResponse* response) {
  return RunUnary(
      context, "DeleteVersion", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(const int64_t released,
                         audited.DeleteVersion(request->model(), request->version(),
                                               request->force(), Because(request->reason())));
        response->set_bytes_released(released);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::ApplyRetention(grpc::CallbackServerContext* context,
                                                       const v1::ApplyRetentionRequest* request,
                                                       v1::ApplyRetentionResponse* response) {
  return RunUnary(
      context, "ApplyRetention", request->model(),
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(*response,
                         audited.ApplyRetention(request->model(), request->policy(),
                                                request->dry_run(), {"", request->reason()}));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::GarbageCollect(grpc::CallbackServerContext* context,
                                                       const v1::GarbageCollectRequest* request,
                                                       v1::GarbageCollectResponse* response) {
  return RunUnary(
      context, "GarbageCollect", "",
      [this, request, response](const Caller& caller, CheckpointStore& store) -> absl::Status {
        AuditedStore audited(store, ActorOf(caller));
        ASSIGN_OR_RETURN(*response, audited.GarbageCollect(request->dry_run()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* StoreService::Verify(grpc::CallbackServerContext* context,
                                               const v1::VerifyRequest* request,
                                               v1::VerifyResponse* response) {
  return RunUnary(context, "Verify", request->model(),
                  [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
                    ASSIGN_OR_RETURN(*response, store.Verify(request->model(), request->version()));
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* StoreService::GetStats(grpc::CallbackServerContext* context,
                                                 const v1::GetStatsRequest*,
                                                 v1::StoreStats* response) {
  return RunUnary(context, "GetStats", "",
                  [this, response](const Caller&, CheckpointStore& store) -> absl::Status {
                    ASSIGN_OR_RETURN(*response, store.GetStats());
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* StoreService::ListAudit(grpc::CallbackServerContext* context,
                                                  const v1::ListAuditRequest* request,
                                                  v1::ListAuditResponse* response) {
  return RunUnary(
      context, "ListAudit", request->model(),
      [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
        ASSIGN_OR_RETURN(const int page_size, PageSize(request->page_size()));
        if (request->after_sequence() < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "after_sequence is ", request->after_sequence(), "; use 0 for the first page"));
        }
        AuditQuery query;
        query.model = request->model();
        if (request->since_unix_micros() != 0) {
          query.since = absl::FromUnixMicros(request->since_unix_micros());
        }
        query.after_sequence = request->after_sequence();
        // One more than the page: whether it comes back says whether another page follows.
        query.limit = int64_t{page_size} + 1;
        ASSIGN_OR_RETURN(std::vector<v1::AuditRecord> records, store.ListAudit(query));
        const bool more = static_cast<int64_t>(records.size()) > page_size;
        if (more) {
          records.resize(page_size);
          response->set_next_after_sequence(records.back().sequence());
        }
        for (v1::AuditRecord& record : records) *response->add_records() = std::move(record);
        return absl::OkStatus();
      });
}

AuditedStore::Actor StoreService::ActorOf(const Caller& caller) {
  return {caller.identity, caller.peer};
}

std::string StoreService::Who(const Caller& caller) {
  return absl::StrCat("identity '", caller.identity, "'");
}

}  // namespace ckpt
