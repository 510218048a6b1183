#include "libs/store/s3_chunk_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "libs/status/status_macros.h"
#include "libs/store/s3_change_log.h"

namespace ckpt {
namespace {

// Appends to one pack object: parts go up in the background as they fill (see the header).
class S3PackWriter final : public ChunkWriter {
 public:
  S3PackWriter(std::shared_ptr<s3::S3Client> client, std::string key, std::string url,
               uint64_t pack_id, uint64_t part_size)
      : client_(std::move(client)),
        key_(std::move(key)),
        url_(std::move(url)),
        pack_id_(pack_id),
        part_size_(part_size) {}

  ~S3PackWriter() override {
    WaitForPart().IgnoreError();
    // Abandoned before Sync (a failed or cancelled upload): its parts would be stored, and
    // billed, until GC's sweep; drop them now while the upload id is at hand. Best effort.
    if (!sealed_ && !upload_id_.empty()) {
      client_->AbortMultipartUpload(key_, upload_id_).IgnoreError();
    }
  }

  uint64_t pack_id() const override { return pack_id_; }
  int64_t size() const override { return size_; }

  absl::StatusOr<int64_t> Append(absl::string_view bytes, int64_t alignment) override {
    if (sealed_) {
      return absl::FailedPreconditionError(
          absl::StrCat("appending to ", url_, " after Sync: a synced pack object is immutable"));
    }
    if (!failed_.ok()) return failed_;
    int64_t offset = size_;
    if (alignment > 1 && offset % alignment != 0) offset += alignment - offset % alignment;
    // Padding is real zeros here (an object has no holes).
    buffer_.append(static_cast<size_t>(offset - size_), '\0');
    buffer_.append(bytes.data(), bytes.size());
    size_ = offset + static_cast<int64_t>(bytes.size());
    if (buffer_.size() >= PartTarget()) {
      absl::Status shipped = ShipPart();
      if (!shipped.ok()) return Fail(shipped);
    }
    return offset;
  }

  absl::Status Sync() override {
    if (sealed_) return absl::OkStatus();  // nothing can have been appended since.
    if (!failed_.ok()) return failed_;
    absl::Status waited = WaitForPart();
    if (!waited.ok()) return Fail(waited);
    if (upload_id_.empty()) {
      // Smaller than one part: one PUT, refused if the key exists.
      absl::Status put = client_->PutObjectIfAbsent(key_, buffer_);
      if (absl::IsAlreadyExists(put)) put = AcceptOwnObject(put);
      if (!put.ok()) return Fail(put);
    } else {
      if (!buffer_.empty()) {
        absl::Status last = UploadPart(std::move(buffer_), static_cast<int>(parts_.size()) + 1);
        if (last.ok()) last = WaitForPart();  // takes the last part into parts_.
        if (!last.ok()) return Fail(last);
      }
      absl::Status completed =
          client_->CompleteMultipartUpload(key_, upload_id_, parts_, /*if_none_match=*/true);
      // NoSuchUpload: a retry of a Complete whose first attempt got through but whose answer was
      // lost finds the upload already assembled (and gone). The object is then there, ours.
      if (absl::IsAlreadyExists(completed) ||
          (absl::IsNotFound(completed) && absl::StrContains(completed.message(), "NoSuchUpload"))) {
        completed = AcceptOwnObject(completed);
      }
      if (!completed.ok()) return Fail(completed);
    }
    sealed_ = true;
    std::string().swap(buffer_);
    return absl::OkStatus();
  }

 private:
  absl::Status Fail(absl::Status status) {
    failed_ =
        absl::Status(status.code(), absl::StrCat("pack object ", url_, ": ", status.message()));
    return failed_;
  }

  // A retried PUT or Complete whose first attempt got through finds its own object: accepted when
  // the object has exactly this pack's size (pack ids are random and never reused, so another
  // writer's object of the same id and size is not a practical case).
  absl::Status AcceptOwnObject(const absl::Status& exists) {
    absl::StatusOr<s3::ObjectInfo> info = client_->HeadObject(key_);
    if (info.ok() && static_cast<int64_t>(info->size) == size_) return absl::OkStatus();
    return exists;
  }

  // S3 allows 10,000 parts per upload, and a store writes one pack per upload however big the
  // checkpoint: with a fixed 8 MiB part a pack would stop at 78 GiB. Parts double in size every
  // kPartsPerSizeDoubling parts (as S3Client::PutMultipart grows its parts), up to S3's 5 GiB:
  // 8 MiB parts reach about 8 TiB.
  uint64_t PartTarget() const {
    constexpr uint64_t kMaxPartBytes = uint64_t{5} << 30;
    const size_t doublings = std::min<size_t>(shipped_parts_ / kPartsPerSizeDoubling, 20);
    const uint64_t target = part_size_ << doublings;
    return std::min(target, std::max(kMaxPartBytes, part_size_));
  }

  // Sends the buffer as the next part in the background, after the part before it is done: at
  // most one part in flight and one filling.
  absl::Status ShipPart() {
    RETURN_IF_ERROR(WaitForPart());
    if (upload_id_.empty()) {
      ASSIGN_OR_RETURN(upload_id_, client_->CreateMultipartUpload(key_));
    }
    const int part_number = static_cast<int>(parts_.size()) + 1;  // none in flight now.
    ++shipped_parts_;
    std::string part;
    part.swap(buffer_);
    buffer_.reserve(part.capacity());
    in_flight_ =
        std::async(std::launch::async, [this, part = std::move(part), part_number]() mutable {
          return UploadPart(std::move(part), part_number);
        });
    return absl::OkStatus();
  }

  absl::Status UploadPart(std::string part, int part_number) {
    absl::StatusOr<std::string> etag = client_->UploadPart(key_, upload_id_, part_number, part);
    if (!etag.ok()) return etag.status();
    completed_parts_.push_back(s3::CompletedPart{part_number, *std::move(etag)});
    return absl::OkStatus();
  }

  absl::Status WaitForPart() {
    if (in_flight_.valid()) {
      absl::Status uploaded = in_flight_.get();
      if (!uploaded.ok()) return uploaded;
    }
    // Parts complete in order (one in flight at a time), so appending keeps them ascending.
    for (s3::CompletedPart& part : completed_parts_) parts_.push_back(std::move(part));
    completed_parts_.clear();
    return absl::OkStatus();
  }

  const std::shared_ptr<s3::S3Client> client_;
  const std::string key_;
  const std::string url_;
  const uint64_t pack_id_;
  const uint64_t part_size_;
  static constexpr size_t kPartsPerSizeDoubling = 1000;
  size_t shipped_parts_ = 0;
  std::string buffer_;  // appended, not yet sent.
  int64_t size_ = 0;
  std::string upload_id_;  // of the multipart upload, once the first part fills.
  std::vector<s3::CompletedPart> parts_;
  // Written by the part in flight only, read after waiting for it.
  std::vector<s3::CompletedPart> completed_parts_;
  std::future<absl::Status> in_flight_;
  bool sealed_ = false;
  absl::Status failed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<S3ChunkBackend>> S3ChunkBackend::Create(
    std::shared_ptr<s3::S3Client> client, S3ChunkBackendOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("S3ChunkBackend: no S3 client");
  if (!options.prefix.empty() && !absl::EndsWith(options.prefix, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 chunk prefix must be empty or end in '/', got \"", options.prefix, "\""));
  }
  if (absl::StartsWith(options.prefix, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 chunk prefix must not start with '/' (keys are relative to the bucket), got \"",
        options.prefix, "\""));
  }
  if (options.part_size < kMinS3PackPartSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 pack part size must be >= ", kMinS3PackPartSize, " bytes, got ", options.part_size));
  }
  auto backend =
      std::unique_ptr<S3ChunkBackend>(new S3ChunkBackend(std::move(client), std::move(options)));
  if (backend->options_.check_access) {
    absl::StatusOr<s3::ListPage> listed =
        backend->client_->ListObjectsV2(backend->PacksPrefix(), "", 1);
    if (!listed.ok()) {
      return absl::Status(listed.status().code(), absl::StrCat("cannot list ", backend->Describe(),
                                                               " (endpoint, bucket, "
                                                               "credentials?): ",
                                                               listed.status().message()));
    }
  }
  return backend;
}

S3ChunkBackend::S3ChunkBackend(std::shared_ptr<s3::S3Client> client, S3ChunkBackendOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ChangeLog>> S3ChunkBackend::OpenChangeLog() {
  return std::unique_ptr<ChangeLog>(std::make_unique<S3ChangeLog>(client_, options_.prefix));
}

std::string S3ChunkBackend::PacksPrefix() const { return absl::StrCat(options_.prefix, "packs/"); }

std::string S3ChunkBackend::ObjectKey(uint64_t pack_id) const {
  return absl::StrCat(PacksPrefix(), PackFileName(pack_id));
}

std::string S3ChunkBackend::ObjectUrl(uint64_t pack_id) const {
  return absl::StrCat("s3://", client_->options().bucket, "/", ObjectKey(pack_id));
}

std::string S3ChunkBackend::Describe() const {
  return absl::StrCat("pack objects in s3://", client_->options().bucket, "/", PacksPrefix(),
                      " at ", client_->options().endpoint);
}

absl::StatusOr<std::unique_ptr<ChunkWriter>> S3ChunkBackend::NewPack(uint64_t pack_id) {
  absl::StatusOr<s3::ObjectInfo> existing = client_->HeadObject(ObjectKey(pack_id));
  if (existing.ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("pack object ", ObjectUrl(pack_id), " already exists"));
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();
  return std::make_unique<S3PackWriter>(client_, ObjectKey(pack_id), ObjectUrl(pack_id), pack_id,
                                        options_.part_size);
}

absl::Status S3ChunkBackend::Read(const PackLocation& location, char* destination) const {
  const std::string what = absl::StrCat("pack object ", ObjectUrl(location.pack_id), " bytes ",
                                        location.offset, "..", location.offset + location.length);
  if (location.offset < 0 || location.length < 0) {
    return absl::DataLossError(absl::StrCat(what, ": not a byte range"));
  }
  if (location.length == 0) return absl::OkStatus();
  absl::StatusOr<uint64_t> got = client_->GetObjectInto(
      ObjectKey(location.pack_id),
      s3::ByteRange{static_cast<uint64_t>(location.offset), static_cast<uint64_t>(location.length)},
      destination);
  if (absl::IsNotFound(got.status())) {
    return absl::DataLossError(absl::StrCat(what, ": the object is missing"));
  }
  if (absl::IsOutOfRange(got.status())) {
    return absl::DataLossError(absl::StrCat(what, " lie beyond the end of the object"));
  }
  if (!got.ok()) {
    return absl::Status(got.status().code(), absl::StrCat(what, ": ", got.status().message()));
  }
  if (*got != static_cast<uint64_t>(location.length)) {
    return absl::DataLossError(
        absl::StrCat(what, ": the object ends after ", location.offset + *got, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<MappedPackRegion>> S3ChunkBackend::MapWhole(uint64_t pack_id) const {
  return absl::UnimplementedError(
      absl::StrCat(ObjectUrl(pack_id), ": pack objects cannot be mapped; read them"));
}

absl::StatusOr<std::vector<PackInfo>> S3ChunkBackend::List() const {
  ASSIGN_OR_RETURN(std::vector<s3::ListedObject> objects, client_->ListAllObjects(PacksPrefix()));
  absl::flat_hash_set<uint64_t> removed;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pack_id, generation] : removed_) removed.insert(pack_id);
  }
  std::vector<PackInfo> packs;
  for (const s3::ListedObject& object : objects) {
    absl::string_view name = object.key;
    if (!absl::ConsumePrefix(&name, PacksPrefix())) continue;
    const std::optional<uint64_t> pack_id = PackIdFromFileName(name);
    if (!pack_id.has_value()) continue;  // not ours: left alone.
    if (removed.contains(*pack_id)) continue;
    PackInfo& pack = packs.emplace_back();
    pack.pack_id = *pack_id;
    pack.size = static_cast<int64_t>(object.size);
    pack.last_modified = object.last_modified;
  }
  return packs;
}

absl::Status S3ChunkBackend::Remove(uint64_t pack_id, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  for (const auto& [removed, at] : removed_) {
    if (removed == pack_id) return absl::OkStatus();
  }
  removed_.emplace_back(pack_id, generation);
  return absl::OkStatus();
}

int S3ChunkBackend::ReleaseRemoved(uint64_t up_to) {
  std::vector<std::pair<uint64_t, uint64_t>> due;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<uint64_t, uint64_t>> kept;
    for (const auto& removed : removed_) (removed.second <= up_to ? due : kept).push_back(removed);
    removed_.swap(kept);
  }
  // Deleted outside the lock (network round trips). One failure does not stop the others: it is
  // logged and retried by the next call.
  std::vector<std::pair<uint64_t, uint64_t>> failed;
  for (const auto& removed : due) {
    absl::Status deleted = client_->DeleteObject(ObjectKey(removed.first));
    if (deleted.ok()) continue;
    std::fprintf(stderr,
                 "ckpt store: deleting removed pack object %s failed (kept for the next "
                 "GC): %s\n",
                 ObjectUrl(removed.first).c_str(), deleted.ToString().c_str());
    failed.push_back(removed);
  }
  if (failed.empty()) return 0;
  absl::MutexLock lock(&mu_);
  removed_.insert(removed_.end(), failed.begin(), failed.end());
  return static_cast<int>(failed.size());
}

absl::StatusOr<std::vector<PendingPack>> S3ChunkBackend::ListPending() const {
  ASSIGN_OR_RETURN(std::vector<s3::PendingUpload> uploads,
                   client_->ListMultipartUploads(PacksPrefix()));
  std::vector<PendingPack> pending;
  for (const s3::PendingUpload& upload : uploads) {
    absl::string_view name = upload.key;
    if (!absl::ConsumePrefix(&name, PacksPrefix())) continue;
    const std::optional<uint64_t> pack_id = PackIdFromFileName(name);
    if (!pack_id.has_value()) continue;
    pending.push_back(PendingPack{*pack_id, upload.upload_id, upload.initiated});
  }
  return pending;
}

absl::Status S3ChunkBackend::AbortPending(const PendingPack& pending) {
  absl::Status aborted = client_->AbortMultipartUpload(ObjectKey(pending.pack_id), pending.handle);
  if (absl::IsNotFound(aborted)) return absl::OkStatus();  // finished or aborted meanwhile.
  return aborted;
}

absl::Status LoadS3Credentials(const std::string& credentials_file, S3ChunkStorageConfig& config) {
  if (credentials_file.empty()) {
    const char* access_key = std::getenv("AWS_ACCESS_KEY_ID");
    const char* secret_key = std::getenv("AWS_SECRET_ACCESS_KEY");
    if (access_key == nullptr || *access_key == '\0' || secret_key == nullptr ||
        *secret_key == '\0') {
      return absl::InvalidArgumentError(
          "S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment, or "
          "name a credentials file");
    }
    config.access_key = access_key;
    config.secret_key = secret_key;
    return absl::OkStatus();
  }
  std::ifstream in(credentials_file);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("S3 credentials file '", credentials_file, "' cannot be read"));
  }
  std::string access_key, secret_key, line;
  while (std::getline(in, line)) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#' || text[0] == ';' || text[0] == '[') continue;
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos) continue;
    const std::string key =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(0, equals)));
    const std::string value(absl::StripAsciiWhitespace(text.substr(equals + 1)));
    if (key == "aws_access_key_id" && access_key.empty()) access_key = value;
    if (key == "aws_secret_access_key" && secret_key.empty()) secret_key = value;
  }
  if (access_key.empty() || secret_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 credentials file '", credentials_file,
                     "' needs aws_access_key_id = ... and aws_secret_access_key = ... lines"));
  }
  config.access_key = std::move(access_key);
  config.secret_key = std::move(secret_key);
  return absl::OkStatus();
}

absl::StatusOr<S3ChunkStorageConfig> S3ChunkStorageFromFlags(const S3ChunkFlags& flags) {
  S3ChunkStorageConfig config;
  if (flags.endpoint.empty()) {
    std::vector<std::string> given;
    for (const auto& [name, value] :
         {std::pair<const char*, const std::string*>{"bucket", &flags.bucket},
          {"prefix", &flags.prefix},
          {"region", &flags.region},
          {"credentials_file", &flags.credentials_file},
          {"ca_file", &flags.ca_file}}) {
      if (!value->empty()) given.push_back(absl::StrCat("--chunks_s3_", name));
    }
    if (!given.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(absl::StrJoin(given, ", "), " need", given.size() == 1 ? "s" : "",
                       " --chunks_s3_endpoint (and --chunks_s3_bucket)"));
    }
    return config;
  }
  if (flags.bucket.empty()) {
    return absl::InvalidArgumentError("--chunks_s3_endpoint needs --chunks_s3_bucket");
  }
  config.endpoint = flags.endpoint;
  config.bucket = flags.bucket;
  config.prefix = flags.prefix;
  if (!flags.region.empty()) config.region = flags.region;
  config.ca_file = flags.ca_file;
  RETURN_IF_ERROR(LoadS3Credentials(flags.credentials_file, config));
  return config;
}

absl::StatusOr<std::shared_ptr<ChunkBackend>> OpenS3ChunkStorage(
    const S3ChunkStorageConfig& config) {
  if (config.endpoint.empty()) return nullptr;
  if (config.bucket.empty()) {
    return absl::InvalidArgumentError("S3 chunk storage needs a bucket");
  }
  s3::S3ClientOptions options;
  options.endpoint = config.endpoint;
  options.bucket = config.bucket;
  options.region = config.region;
  options.ca_file = config.ca_file;
  options.access_key = config.access_key;
  options.secret_key = config.secret_key;
  ASSIGN_OR_RETURN(std::unique_ptr<s3::S3Client> client, s3::S3Client::Create(options));
  S3ChunkBackendOptions backend_options;
  backend_options.prefix = config.prefix;
  ASSIGN_OR_RETURN(std::unique_ptr<S3ChunkBackend> backend,
                   S3ChunkBackend::Create(std::move(client), backend_options));
  return std::shared_ptr<ChunkBackend>(std::move(backend));
}

}  // namespace ckpt
