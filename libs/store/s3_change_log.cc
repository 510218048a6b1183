#include "libs/store/s3_change_log.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libs/status/status_macros.h"

namespace ckpt {

S3ChangeLog::S3ChangeLog(std::shared_ptr<s3::S3Client> client, std::string prefix,
                         int read_threads)
    : client_(std::move(client)),
      changes_prefix_(absl::StrCat(prefix, "changes/")),
      snapshots_prefix_(absl::StrCat(prefix, "snapshots/")),
      read_threads_(std::max(1, read_threads)) {}

std::string S3ChangeLog::Describe() const {
  return absl::StrCat("change log in s3://", client_->options().bucket, "/", changes_prefix_);
}

std::string S3ChangeLog::ObjectKey(int64_t sequence) const {
  return absl::StrCat(changes_prefix_, ChangeName(sequence));
}

absl::Status S3ChangeLog::Append(int64_t sequence, absl::string_view bytes) {
  if (sequence < 1) return absl::InvalidArgumentError("change numbers start at 1");
  if (bytes.size() > client_->options().multipart_threshold) {
    // A multipart completion is not conditional on radosgw: such a record could overwrite
    // another writer's.
    return absl::InvalidArgumentError(absl::StrCat(
        "a change record of ", bytes.size(), " bytes is over the S3 client's multipart threshold (",
        client_->options().multipart_threshold, "), which cannot be written conditionally"));
  }
  const std::string key = ObjectKey(sequence);
  absl::Status put = client_->PutObjectIfAbsent(key, bytes);
  if (!absl::IsAlreadyExists(put)) return put;
  // Ours (an attempt whose answer was lost) or another writer's.
  absl::StatusOr<std::string> existing = client_->GetObject(key);
  if (!existing.ok()) {
    return absl::UnavailableError(absl::StrCat("change ", sequence, " exists in ", Describe(),
                                               " and cannot be read back: ",
                                               existing.status().message()));
  }
  if (*existing == bytes) return absl::OkStatus();
  return absl::AlreadyExistsError(
      absl::StrCat("change ", sequence, " in ", Describe(), " holds another writer's record"));
}

absl::StatusOr<std::vector<LoggedChange>> S3ChangeLog::ReadAfter(int64_t after,
                                                                 int max_count) const {
  if (max_count < 1) return absl::InvalidArgumentError("ReadAfter needs max_count >= 1");
  if (after < 0) after = 0;
  const int page_size = std::min(max_count, 1000);
  ASSIGN_OR_RETURN(s3::ListPage page,
                   client_->ListObjectsV2(changes_prefix_, "", page_size,
                                          after > 0 ? ObjectKey(after) : std::string()));
  std::vector<LoggedChange> changes;
  int64_t expected = after + 1;
  for (const s3::ListedObject& object : page.objects) {
    const int64_t sequence =
        ChangeNumberFromName(absl::string_view(object.key).substr(changes_prefix_.size()));
    if (sequence < 1) continue;  // not a record (a stray object under the prefix).
    if (sequence != expected) {
      return absl::DataLossError(absl::StrCat("change ", expected, " is missing from ", Describe(),
                                              " while change ", sequence, " exists"));
    }
    changes.push_back(LoggedChange{sequence, ""});
    ++expected;
  }
  // The bytes, several GETs at a time.
  std::atomic<size_t> next{0};
  std::vector<absl::Status> failures(changes.size());
  auto read = [&] {
    for (size_t i = next++; i < changes.size(); i = next++) {
      absl::StatusOr<std::string> bytes = client_->GetObject(ObjectKey(changes[i].sequence));
      if (bytes.ok()) {
        changes[i].bytes = *std::move(bytes);
      } else {
        failures[i] = absl::Status(
            absl::IsNotFound(bytes.status()) ? absl::StatusCode::kDataLoss : bytes.status().code(),
            absl::StrCat("reading change ", changes[i].sequence, " from ", Describe(), ": ",
                         bytes.status().message()));
      }
    }
  };
  const int threads = std::min<int>(read_threads_, static_cast<int>(changes.size()));
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(read);
  read();
  for (std::thread& worker : workers) worker.join();
  for (const absl::Status& failure : failures) RETURN_IF_ERROR(failure);
  return changes;
}

absl::StatusOr<std::vector<int64_t>> S3ChangeLog::ListSnapshots() const {
  ASSIGN_OR_RETURN(std::vector<s3::ListedObject> objects,
                   client_->ListAllObjects(snapshots_prefix_));
  std::vector<int64_t> numbers;
  for (const s3::ListedObject& object : objects) {
    const int64_t sequence =
        ChangeNumberFromName(absl::string_view(object.key).substr(snapshots_prefix_.size()));
    if (sequence > 0) numbers.push_back(sequence);
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

absl::Status S3ChangeLog::PutSnapshot(int64_t sequence, absl::string_view bytes) {
  if (sequence < 1) return absl::InvalidArgumentError("change numbers start at 1");
  RETURN_IF_ERROR(client_->PutObject(absl::StrCat(snapshots_prefix_, ChangeName(sequence)), bytes));
  // The two newest stay: the one just put, and the one before in case this one turns out bad.
  ASSIGN_OR_RETURN(std::vector<int64_t> numbers, ListSnapshots());
  for (size_t i = 0; i + 2 < numbers.size(); ++i) {
    RETURN_IF_ERROR(client_->DeleteObject(absl::StrCat(snapshots_prefix_, ChangeName(numbers[i]))));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> S3ChangeLog::LatestSnapshot() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> numbers, ListSnapshots());
  return numbers.empty() ? 0 : numbers.back();
}

absl::StatusOr<std::string> S3ChangeLog::ReadSnapshot(int64_t sequence) const {
  return client_->GetObject(absl::StrCat(snapshots_prefix_, ChangeName(sequence)));
}

}  // namespace ckpt
