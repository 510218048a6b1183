#include "services/checkpoint_store/store_service.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/auth/access_policy.h"
#include "libs/auth/model_scope.h"
#include "libs/status/grpc_status.h"
#include "libs/status/status_macros.h"
#include "libs/store/audited_store.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/listing_page.h"
#include "libs/store/refused_call_log.h"
#include "libs/store/scoped_store.h"
#include "libs/store/version_ref.h"
#include "services/checkpoint_store/internal/requests.h"
#include "services/checkpoint_store/internal/work_queue.h"

namespace ckpt {
namespace {

using store_service_internal::Because;
using store_service_internal::Cancelled;
using store_service_internal::PageSize;
using store_service_internal::WorkQueue;

// Warnings travel in initial metadata, whose size gRPC limits (8 KiB by default); the complete
// list comes with the commit's UploadResponse.
constexpr size_t kMaxWarningMetadataBytes = 4096;

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
      part_.reset();
      Finish(Cancelled());
      return;
    }
    bool accepted_header = false;
    absl::Status status = Parse();
    if (status.ok()) status = Handle(accepted_header);
    if (!status.ok()) {
      session_.reset();
      part_.reset();
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
      if (part_ != nullptr) context_.AddInitialMetadata(kUploadJoinedModelMetadata, part_model_);
      size_t metadata_bytes = 0;
      for (const std::string& warning :
           session_ != nullptr ? session_->warnings() : std::vector<std::string>()) {
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
        if (session_ != nullptr || part_ != nullptr) {
          return absl::InvalidArgumentError("the Upload stream sent a second UploadHeader");
        }
        const v1::UploadHeader& header = request_.header();
        if (header.has_join()) {
          RETURN_IF_ERROR(Join(header));
          accepted_header = true;
          return absl::OkStatus();
        }
        absl::Status allowed = AccessPolicy::Authorize(caller_, "Upload", header.model());
        service_.NoteRefusal(caller_, "Upload", header.model(), allowed);
        RETURN_IF_ERROR(allowed);
        CommitOptions options;
        options.expected_latest_version = header.expected_latest_version();
        options.aliases.assign(header.aliases().begin(), header.aliases().end());
        options.attribution.reason = header.reason();
        options.joinable_as = header.joinable_as();
        options.idempotency_key = header.idempotency_key();
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
        if (session_ == nullptr && part_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of an Upload must be an UploadHeader; got TensorData");
        }
        if (data.data().size() > static_cast<size_t>(kMaxTensorDataBytes)) {
          return absl::InvalidArgumentError(
              absl::StrCat("TensorData for tensor ", data.tensor_index(), " at offset ",
                           data.offset(), " holds ", data.data().size(),
                           " bytes; a message may hold at most ", kMaxTensorDataBytes, " (1 MiB)"));
        }
        if (part_ != nullptr) {
          return part_->AddRangeData(data.tensor_index(), data.offset(), data.data());
        }
        return session_->AddTensorData(data.tensor_index(), data.offset(), data.data());
      }
      case v1::UploadRequest::kStoredChunk: {
        const v1::StoredChunk& chunk = request_.stored_chunk();
        if (part_ != nullptr) {
          return absl::InvalidArgumentError(
              "a part of an upload sends the bytes of its ranges; StoredChunk is refused");
        }
        if (session_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of an Upload must be an UploadHeader; got StoredChunk");
        }
        return session_->AddStoredChunk(chunk.tensor_index(), chunk.offset(), chunk.sha256(),
                                        chunk.length());
      }
      case v1::UploadRequest::kCommit: {
        if (part_ != nullptr) {
          if (request_.commit().aliases_size() > 0) {
            return absl::InvalidArgumentError("the UploadCommit of a part names no aliases");
          }
          RETURN_IF_ERROR(part_->Finish());
          int64_t bytes = 0;
          for (const UploadRange& range : part_->ranges()) bytes += range.end - range.begin;
          part_.reset();
          response_.set_logical_bytes(bytes);
          committed_ = true;
          return absl::OkStatus();
        }
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
        response_.set_replayed(result.replayed);
        for (std::string& warning : result.warnings) response_.add_warnings(std::move(warning));
        committed_ = true;
        return absl::OkStatus();
      }
      case v1::UploadRequest::PART_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError(
        "an UploadRequest holds no header, data, stored chunk or commit");
  }

  // A header with `join`: this stream writes a part of another upload. The caller's scope is
  // checked against that upload's model (ScopedStore::JoinUpload), and its role as for an upload.
  absl::Status Join(const v1::UploadHeader& header) {
    if (header.has_manifest() || header.aliases_size() > 0 ||
        header.expected_latest_version() != 0 || !header.joinable_as().empty() ||
        !header.idempotency_key().empty()) {
      return absl::InvalidArgumentError(
          "an UploadHeader that joins an upload has no manifest, aliases, "
          "expected_latest_version, joinable_as or idempotency_key of its own: the joined upload "
          "has them");
    }
    std::vector<UploadRange> ranges;
    for (const v1::UploadByteRange& range : header.join().ranges()) {
      ranges.push_back(UploadRange{range.tensor_index(), range.begin(), range.end()});
    }
    scoped_ =
        std::make_unique<ScopedStore>(service_.store_, ModelScope(caller_.models), Who(caller_));
    ASSIGN_OR_RETURN(std::unique_ptr<UploadPart> part,
                     scoped_->JoinUpload(header.join().upload_id(), std::move(ranges)));
    const std::string& model = part->header().model();
    if (!header.model().empty() && header.model() != model) {
      return absl::InvalidArgumentError(
          absl::StrCat("the UploadHeader names model '", header.model(), "' but upload '",
                       header.join().upload_id(), "' is of '", model, "'"));
    }
    absl::Status allowed = AccessPolicy::Authorize(caller_, "Upload", model);
    service_.NoteRefusal(caller_, "Upload", model, allowed);
    RETURN_IF_ERROR(allowed);
    part_model_ = model;
    part_ = std::move(part);
    return absl::OkStatus();
  }

  void EndWithoutCommit() {
    const bool had_session = session_ != nullptr || part_ != nullptr;
    session_.reset();
    part_.reset();
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
  std::unique_ptr<UploadPart> part_;  // instead of session_: a part of another upload.
  std::string part_model_;            // the joined upload's model.
  std::set<std::string> aliases_;
  Caller caller_;  // who opened the stream (the model scope is checked at the header).
  bool committed_ = false;
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
  return RunUnary(context, "ListModels", "",
                  [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
                    ASSIGN_OR_RETURN(const int page_size, PageSize(request->page_size()));
                    ASSIGN_OR_RETURN(std::vector<v1::ModelInfo> models, store.ListModels());
                    ASSIGN_OR_RETURN(
                        ListingPage<v1::ModelInfo> page,
                        PageOfModels(std::move(models), request->page_token(), page_size));
                    for (v1::ModelInfo& model : page.entries)
                      *response->add_models() = std::move(model);
                    response->set_next_page_token(page.next_page_token);
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* StoreService::ListVersions(grpc::CallbackServerContext* context,
                                                     const v1::ListVersionsRequest* request,
                                                     v1::ListVersionsResponse* response) {
  return RunUnary(context, "ListVersions", request->model(),
                  [this, request, response](const Caller&, CheckpointStore& store) -> absl::Status {
                    ASSIGN_OR_RETURN(const int page_size, PageSize(request->page_size()));
                    ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> versions,
                                     request->has_filter()
                                         ? store.FindVersions(request->model(), request->filter())
                                         : store.ListVersions(request->model()));
                    ASSIGN_OR_RETURN(
                        ListingPage<v1::VersionInfo> page,
                        PageOfVersions(std::move(versions), request->page_token(), page_size));
                    for (v1::VersionInfo& info : page.entries)
                      *response->add_versions() = std::move(info);
                    response->set_next_page_token(page.next_page_token);
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
