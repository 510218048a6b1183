// The conformance suite's parted uploads (see store_conformance.h): several writers (the ranks of
// a job) each write byte ranges of one upload through CheckpointStore::JoinUpload, and the
// session's Commit makes one version of them, the same as one writer's upload of the same bytes;
// a part that never finishes, or an upload that is never committed, leaves no version and
// nothing GarbageCollect does not reclaim.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/chunk_hasher.h"
#include "libs/store/testing/store_conformance.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

// 2.5 chunks of float32, a small tensor, and an Adam state of both (state tensors 2..7: step,
// exp_avg, exp_avg_sq of each).
CheckpointContents TwoTensorsWithAdam() {
  const at::Tensor big = Seeded({kChunkBytes * 5 / 2 / 4}, 1);
  const at::Tensor small = Seeded({10}, 2);
  CheckpointContents contents = WeightsOnly({{"module.big", big}, {"module.small", small}});
  contents.optimizer = AdamState({big, small}, 4, 3);
  return contents;
}

// The tensor_index of `key` in `header` (model tensors, then state tensors); -1 when absent.
int IndexOf(const v1::Manifest& header, const std::string& key) {
  for (int i = 0; i < header.tensors_size(); ++i) {
    if (header.tensors(i).key() == key) return i;
  }
  for (int i = 0; i < header.state_tensors_size(); ++i) {
    if (header.state_tensors(i).key() == key) return header.tensors_size() + i;
  }
  return -1;
}

}  // namespace

TEST_P(StoreConformanceTest, PartsFromSeveralWritersCommitAsTheVersionOneWriterWouldMake) {
  const CheckpointContents contents = TwoTensorsWithAdam();
  ASSERT_OK_AND_ASSIGN(PreparedUpload prepared, PrepareUpload(contents, CommitOptions()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("parted", prepared.header, CommitOptions()));
  const std::string id = session->upload_id();
  const int exp_avg = IndexOf(prepared.header, "optimizer/state/0/exp_avg");
  ASSERT_GE(exp_avg, 2);
  absl::StatusOr<std::unique_ptr<UploadPart>> first =
      store_->JoinUpload(id, {{0, 0, kChunkBytes}, {exp_avg, 0, kChunkBytes}});
  ASSERT_OK(first.status());
  const int64_t big_bytes = prepared.tensors[0].nbytes();
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<UploadPart> second,
      store_->JoinUpload(
          id, {{0, kChunkBytes, big_bytes}, {exp_avg, kChunkBytes, big_bytes}, {1, 0, 40}}));
  // The rest of the state tensors come from a third writer; finishing order is free.
  std::vector<UploadRange> rest;
  for (int index = 2; index < static_cast<int>(prepared.tensors.size()); ++index) {
    if (index == exp_avg) continue;
    const int64_t bytes = prepared.tensors[index].nbytes();
    if (bytes > 0) rest.push_back({index, 0, bytes});
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadPart> third, store_->JoinUpload(id, rest));
  EXPECT_EQ(third->header().model(), "parted");
  ASSERT_OK(UploadTensorRanges(*second, prepared.tensors));
  ASSERT_OK(UploadTensorRanges(*third, prepared.tensors));
  ASSERT_OK(UploadTensorRanges(**first, prepared.tensors));
  second.reset();  // a finished part needs its writer no longer.
  ASSERT_OK_AND_ASSIGN(CommitResult committed, session->Commit());

  // The same chunks and content hashes as one writer's commit, which therefore stores nothing new.
  ASSERT_OK_AND_ASSIGN(CommitResult alone, CommitCheckpoint(*store_, "alone", contents));
  EXPECT_EQ(alone.new_bytes, 0);
  EXPECT_EQ(committed.logical_bytes, alone.logical_bytes);
  ASSERT_OK_AND_ASSIGN(v1::Manifest parted, store_->GetManifest(committed.version));
  ASSERT_OK_AND_ASSIGN(v1::Manifest reference, store_->GetManifest(alone.version));
  ASSERT_EQ(parted.tensors_size(), reference.tensors_size());
  ASSERT_EQ(parted.state_tensors_size(), reference.state_tensors_size());
  for (int i = 0; i < parted.tensors_size(); ++i) {
    EXPECT_EQ(parted.tensors(i).key(), reference.tensors(i).key());
    EXPECT_EQ(parted.tensors(i).content_hash(), reference.tensors(i).content_hash());
    EXPECT_EQ(parted.tensors(i).chunks_size(), reference.tensors(i).chunks_size());
  }
  for (int i = 0; i < parted.state_tensors_size(); ++i) {
    EXPECT_EQ(parted.state_tensors(i).content_hash(), reference.state_tensors(i).content_hash())
        << parted.state_tensors(i).key();
  }
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(*store_, committed.version));
  ExpectSameTensor(*loaded.contents.model.Find("big"), prepared.tensors[0], "big");
  ExpectSameTensor(*loaded.contents.model.Find("small"), prepared.tensors[1], "small");
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_TRUE(verified.problems().empty());
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(stats.uploads_in_progress(), 0);
}

TEST_P(StoreConformanceTest, AGapOrOverlapBetweenPartsFailsTheCommitAndLeavesNothing) {
  const CheckpointContents contents = TwoTensorsWithAdam();
  ASSERT_OK_AND_ASSIGN(PreparedUpload prepared, PrepareUpload(contents, CommitOptions()));
  std::vector<UploadRange> all_but_big;
  for (int index = 1; index < static_cast<int>(prepared.tensors.size()); ++index) {
    const int64_t bytes = prepared.tensors[index].nbytes();
    if (bytes > 0) all_but_big.push_back({index, 0, bytes});
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("gap", prepared.header, CommitOptions()));
    absl::StatusOr<std::unique_ptr<UploadPart>> part =
        store_->JoinUpload(session->upload_id(), all_but_big);
    ASSERT_OK(part.status());
    ASSERT_OK(UploadTensorRanges(**part, prepared.tensors));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadPart> head,
                         store_->JoinUpload(session->upload_id(), {{0, 0, kChunkBytes}}));
    ASSERT_OK(UploadTensorRanges(*head, prepared.tensors));
    EXPECT_THAT(session->Commit(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("tensor 'big' (index 0): no part holds its bytes 4194304..")));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("overlap", prepared.header, CommitOptions()));
    const std::string id = session->upload_id();
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadPart> rest, store_->JoinUpload(id, all_but_big));
    ASSERT_OK(UploadTensorRanges(*rest, prepared.tensors));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadPart> whole,
                         store_->JoinUpload(id, {{0, 0, prepared.tensors[0].nbytes()}}));
    ASSERT_OK(UploadTensorRanges(*whole, prepared.tensors));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadPart> again,
                         store_->JoinUpload(id, {{0, kChunkBytes, 2 * kChunkBytes}}));
    ASSERT_OK(UploadTensorRanges(*again, prepared.tensors));
    EXPECT_THAT(session->Commit(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("two parts hold its bytes 4194304..")));
  }
  EXPECT_THAT(store_->GetManifest(Ref("gap")), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->GetManifest(Ref("overlap")), StatusIs(absl::StatusCode::kNotFound));
  // Every byte the failed uploads and their parts stored is reclaimed (no grace period here).
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_GE(collected.abandoned_uploads_reclaimed(), 7);
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(stats.chunks(), 0);
  EXPECT_EQ(stats.physical_bytes(), 0);
  EXPECT_EQ(stats.uploads_in_progress(), 0);
}

// A writer that dies mid-part, and an upload whose leader dies after parts finished: no version,
// and GarbageCollect reclaims all of it; the next upload of the same bytes stores them again.
TEST_P(StoreConformanceTest, APartOrLeaderThatDiesLeavesNoVersionAndNothingUnreclaimed) {
  const CheckpointContents contents = TwoTensorsWithAdam();
  ASSERT_OK_AND_ASSIGN(PreparedUpload prepared, PrepareUpload(contents, CommitOptions()));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", prepared.header, CommitOptions()));
    absl::StatusOr<std::unique_ptr<UploadPart>> finished =
        store_->JoinUpload(session->upload_id(), {{0, 0, kChunkBytes}});
    ASSERT_OK(finished.status());
    ASSERT_OK(UploadTensorRanges(**finished, prepared.tensors));
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<UploadPart> dying,
        store_->JoinUpload(session->upload_id(), {{0, kChunkBytes, prepared.tensors[0].nbytes()}}));
    const char* bytes = static_cast<const char*>(prepared.tensors[0].data_ptr());
    ASSERT_OK(dying->AddRangeData(0, 0, absl::string_view(bytes + kChunkBytes, kChunkBytes)));
    // Both writers and the leader go without a commit.
  }
  EXPECT_THAT(store_->GetManifest(Ref("m")), StatusIs(absl::StatusCode::kNotFound));
  // A remote store ends the uploads once their cancelled streams reach it.
  int64_t in_progress = -1;
  for (absl::Time deadline = absl::Now() + absl::Seconds(20);
       in_progress != 0 && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(10))) {
    ASSERT_OK_AND_ASSIGN(v1::StoreStats live, store_->GetStats());
    in_progress = live.uploads_in_progress();
  }
  EXPECT_EQ(in_progress, 0);
  ASSERT_OK_AND_ASSIGN(v1::GarbageCollectResponse collected, store_->GarbageCollect(false));
  EXPECT_EQ(collected.abandoned_uploads_reclaimed(), 3);
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
  EXPECT_EQ(stats.chunks(), 0);
  EXPECT_EQ(stats.physical_bytes(), 0);

  // A part finishing after its upload ended is refused, and the store is still sound after it.
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                         store_->BeginUpload("m", prepared.header, CommitOptions()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadPart> late,
                         store_->JoinUpload(session->upload_id(), {{1, 0, 40}}));
    session.reset();
    // Once the store has ended the upload (a remote one when the cancellation reaches it), only
    // the late part is in progress.
    int64_t live = -1;
    for (absl::Time deadline = absl::Now() + absl::Seconds(20); live != 1 && absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(10))) {
      ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, store_->GetStats());
      live = stats.uploads_in_progress();
    }
    EXPECT_THAT(UploadTensorRanges(*late, prepared.tensors),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ended")));
  }
  MustCommit("m", contents);
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, store_->Verify("", 0));
  EXPECT_TRUE(verified.problems().empty());
}

TEST_P(StoreConformanceTest, JoinUploadRefusesUnknownUploadsAndRangesOffChunkBoundaries) {
  const CheckpointContents contents = TwoTensorsWithAdam();
  ASSERT_OK_AND_ASSIGN(PreparedUpload prepared, PrepareUpload(contents, CommitOptions()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> session,
                       store_->BeginUpload("m", prepared.header, CommitOptions()));
  const std::string id = session->upload_id();
  absl::StatusOr<std::unique_ptr<UploadPart>> ok = store_->JoinUpload(id, {{1, 0, 40}});
  ASSERT_OK(ok.status());
  EXPECT_THAT(store_->JoinUpload(id + "0", {{1, 0, 40}}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  const int64_t big = prepared.tensors[0].nbytes();
  for (const UploadRange& bad : std::vector<UploadRange>{
           {0, 4, kChunkBytes}, {0, 0, kChunkBytes + 4}, {0, 0, big + 4}, {1, 0, 0}, {99, 0, 4}}) {
    EXPECT_THAT(store_->JoinUpload(id, {bad}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << bad.tensor_index << " " << bad.begin << ".." << bad.end;
  }
  EXPECT_THAT(store_->JoinUpload(id, {{0, 0, 2 * kChunkBytes}, {0, kChunkBytes, big}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(store_->JoinUpload(id, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs ranges")));

  // A name the writers agreed on, unique while its upload lives.
  CommitOptions named;
  named.joinable_as = "job-7/step-100";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<UploadSession> first,
                       store_->BeginUpload("m", prepared.header, named));
  EXPECT_EQ(first->upload_id(), "job-7/step-100");
  ASSERT_OK(store_->JoinUpload("job-7/step-100", {{1, 0, 40}}).status());
  EXPECT_THAT(store_->BeginUpload("m", prepared.header, named).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("job-7/step-100")));
  first.reset();
  // The name is free again once the store has ended that upload (a remote one when the
  // cancellation reaches it).
  absl::Status again = absl::AlreadyExistsError("not tried");
  for (absl::Time deadline = absl::Now() + absl::Seconds(20);
       absl::IsAlreadyExists(again) && absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(10))) {
    again = store_->BeginUpload("m", prepared.header, named).status();
  }
  ASSERT_OK(again);
}

}  // namespace ckpt::testing
