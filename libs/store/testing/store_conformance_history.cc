// The conformance suite's registry half: history, annotations, model records, filters and Watch
// (see store_conformance.h). Identities are not compared here: a remote store's server stamps its
// caller's, whatever the client says (AuditedStore); reasons travel unchanged.

#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "gmock/gmock.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/store/version_filter.h"

namespace ckpt::testing {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// "KIND model@version alias previous->version": one line per event, for comparing histories.
std::string EventLine(const v1::RegistryEvent& event) {
  std::string line = absl::StrCat(v1::RegistryEvent::Kind_Name(event.kind()), " ", event.model());
  if (event.version() > 0) absl::StrAppend(&line, "@", event.version());
  if (!event.alias().empty()) absl::StrAppend(&line, " ", event.alias());
  if (event.kind() == v1::RegistryEvent::ALIAS_SET ||
      event.kind() == v1::RegistryEvent::ALIAS_DELETED) {
    absl::StrAppend(&line, " from ", event.previous_version());
  }
  if (!event.new_name().empty()) absl::StrAppend(&line, " -> ", event.new_name());
  return line;
}

std::vector<std::string> EventLines(const std::vector<v1::RegistryEvent>& events) {
  std::vector<std::string> lines;
  for (const v1::RegistryEvent& event : events) lines.push_back(EventLine(event));
  return lines;
}

TEST_P(StoreConformanceTest, HistoryRecordsEveryChangeInOrderWithReasons) {
  CommitOptions options;
  options.aliases = {"best"};
  options.attribution.reason = "epoch 1";
  CheckpointContents contents = WeightsOnly({{"w", at::full({2}, 1)}});
  v1::Lineage& lineage = *contents.metadata.mutable_lineage();
  lineage.set_run_id("run-1");
  lineage.set_code_revision("abc123");
  MustCommit("m", contents, options);
  MustCommit("m", WeightsOnly({{"w", at::full({2}, 2)}}));
  ASSERT_OK(store_->SetAlias("m", "best", 2, 1, {"", "better val_acc"}).status());
  ASSERT_OK(store_->SetAlias("m", "production", 2, 0, {"", "release"}).status());
  ASSERT_OK(store_->DeleteAlias("m", "best", {"", "not needed"}));
  ASSERT_OK(store_->DeleteVersion("m", 1, /*force=*/false, {"", "cleanup"}).status());
  MustCommit("other", WeightsOnly({{"w", at::full({2}, 3)}}));

  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, store_->ListHistory({}));
  EXPECT_THAT(
      EventLines(events),
      ElementsAre("MODEL_CREATED m", "VERSION_COMMITTED m@1 best", "ALIAS_SET m@1 best from 0",
                  "VERSION_COMMITTED m@2", "ALIAS_SET m@2 best from 1",
                  "ALIAS_SET m@2 production from 0", "ALIAS_DELETED m best from 2",
                  "VERSION_DELETED m@1", "MODEL_CREATED other", "VERSION_COMMITTED other@1"));
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_FALSE(events[i].identity().empty()) << EventLine(events[i]);
    EXPECT_GT(events[i].unix_micros(), 0);
    if (i > 0) {
      EXPECT_GT(events[i].sequence(), events[i - 1].sequence());
      EXPECT_GE(events[i].unix_micros(), events[i - 1].unix_micros());
    }
  }
  EXPECT_EQ(events[1].reason(), "epoch 1");
  EXPECT_EQ(events[4].reason(), "better val_acc");
  EXPECT_EQ(events[7].reason(), "cleanup");

  // Lineage is kept with the version, as committed.
  ASSERT_OK_AND_ASSIGN(v1::Manifest first_of_other, store_->GetManifest(Ref("m@2")));
  EXPECT_FALSE(first_of_other.metadata().has_lineage());

  // Filters: one model; one alias of it; paging after a sequence with a limit.
  HistoryQuery best;
  best.model = "m";
  best.alias = "best";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> moves, store_->ListHistory(best));
  EXPECT_THAT(EventLines(moves),
              ElementsAre("ALIAS_SET m@1 best from 0", "ALIAS_SET m@2 best from 1",
                          "ALIAS_DELETED m best from 2"));
  HistoryQuery page;
  page.after_sequence = events[2].sequence();
  page.limit = 2;
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> paged, store_->ListHistory(page));
  EXPECT_THAT(EventLines(paged), ElementsAre("VERSION_COMMITTED m@2", "ALIAS_SET m@2 best from 1"));
  HistoryQuery other;
  other.model = "other";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> of_other, store_->ListHistory(other));
  EXPECT_EQ(of_other.size(), 2u);

  HistoryQuery alias_alone;
  alias_alone.alias = "best";
  EXPECT_THAT(store_->ListHistory(alias_alone),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs its model"));
  HistoryQuery negative;
  negative.after_sequence = -1;
  EXPECT_THAT(store_->ListHistory(negative), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(StoreConformanceTest, RetentionRecordsWhatItDeletesAndDropsWithItsReason) {
  for (int i = 1; i <= 3; ++i) {
    const at::Tensor weight = at::full({2}, static_cast<float>(i));
    CheckpointContents contents = WeightsOnly({{"w", weight}});
    contents.optimizer = AdamState({weight}, i, i);
    MustCommit("m", contents);
  }
  v1::RetentionPolicy policy;
  policy.set_keep_last(2);
  policy.set_drop_optimizer_state_older_than(1);
  ASSERT_OK(
      store_->ApplyRetention("m", policy, /*dry_run=*/false, {"", "nightly retention"}).status());
  HistoryQuery query;
  query.model = "m";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, store_->ListHistory(query));
  ASSERT_GE(events.size(), 2u);
  const std::vector<std::string> lines = EventLines(events);
  EXPECT_THAT(std::vector<std::string>(lines.end() - 2, lines.end()),
              ElementsAre("VERSION_DELETED m@1", "OPTIMIZER_STATE_DROPPED m@2"));
  EXPECT_EQ(events.back().reason(), "nightly retention");
}

TEST_P(StoreConformanceTest, LineageIsKeptWithTheVersion) {
  CheckpointContents contents = WeightsOnly({{"w", at::full({2}, 1)}});
  MustCommit("base", contents);
  v1::Lineage& lineage = *contents.metadata.mutable_lineage();
  lineage.set_run_id("run-7");
  lineage.set_parent("base@1");
  lineage.set_parent_relation("fine_tuned_from");
  lineage.set_code_revision("0123abcd+dirty");
  lineage.set_dataset("imagenet-1k train, seed 3");
  (*lineage.mutable_producer_info())["world_size"] = "2";
  MustCommit("tuned", contents);
  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("tuned@1")));
  EXPECT_EQ(manifest.metadata().lineage().SerializeAsString(), lineage.SerializeAsString());
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store_->ListVersions("tuned"));
  EXPECT_EQ(versions[0].metadata().lineage().parent(), "base@1");
}

TEST_P(StoreConformanceTest, AnnotationsMergeAndShowInListsManifestsAndHistory) {
  CheckpointContents contents = WeightsOnly({{"w", at::full({2}, 1)}});
  (*contents.metadata.mutable_metrics())["loss"] = 0.5;
  MustCommit("m", contents);
  v1::AnnotationChange change;
  (*change.mutable_set_metrics())["val_acc"] = 0.91;
  (*change.mutable_set_tags())["dataset"] = "imagenet";
  (*change.mutable_set_tags())["stage"] = "candidate";
  change.set_description("first evaluation");
  ASSERT_OK_AND_ASSIGN(v1::VersionAnnotations annotations,
                       store_->AnnotateVersion("m", 1, change, {"", "eval job 17"}));
  EXPECT_EQ(annotations.metrics().at("val_acc"), 0.91);
  EXPECT_FALSE(annotations.updated_by().empty());
  EXPECT_GT(annotations.updated_unix_micros(), 0);

  v1::AnnotationChange second;
  second.add_remove_tags("stage");
  (*second.mutable_set_metrics())["val_acc"] = 0.93;
  ASSERT_OK_AND_ASSIGN(annotations, store_->AnnotateVersion("m", 1, second, {}));
  EXPECT_EQ(annotations.metrics().at("val_acc"), 0.93);
  EXPECT_EQ(annotations.tags().size(), 1u);
  EXPECT_EQ(annotations.description(), "first evaluation");  // kept: not in the change.

  ASSERT_OK_AND_ASSIGN(v1::Manifest manifest, store_->GetManifest(Ref("m@1")));
  EXPECT_EQ(manifest.annotations().metrics().at("val_acc"), 0.93);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> versions, store_->ListVersions("m"));
  ASSERT_EQ(versions.size(), 1u);
  EXPECT_EQ(versions[0].annotations().tags().at("dataset"), "imagenet");
  EXPECT_EQ(EffectiveMetrics(versions[0]).at("loss"), 0.5);

  HistoryQuery query;
  query.model = "m";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, store_->ListHistory(query));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].kind(), v1::RegistryEvent::VERSION_ANNOTATED);
  EXPECT_EQ(events[2].reason(), "eval job 17");
  EXPECT_EQ(events[2].annotations().metrics().at("val_acc"), 0.91);
  EXPECT_EQ(events[3].annotations().metrics().at("val_acc"), 0.93);

  EXPECT_THAT(store_->AnnotateVersion("m", 9, change, {}),
              StatusIs(absl::StatusCode::kNotFound, "m@9"));
  v1::AnnotationChange not_finite;
  (*not_finite.mutable_set_metrics())["val_acc"] = std::nan("");
  EXPECT_THAT(store_->AnnotateVersion("m", 1, not_finite, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "finite"));
}

TEST_P(StoreConformanceTest, FindVersionsSelectsByTagLabelMetricAndTime) {
  for (int i = 1; i <= 3; ++i) {
    CheckpointContents contents = WeightsOnly({{"w", at::full({2}, i)}});
    (*contents.metadata.mutable_labels())["run"] = i < 3 ? "a" : "b";
    MustCommit("m", contents);
    v1::AnnotationChange change;
    (*change.mutable_set_metrics())["val_acc"] = 0.8 + 0.05 * i;
    if (i != 2) (*change.mutable_set_tags())["evaluated"] = "yes";
    ASSERT_OK(store_->AnnotateVersion("m", i, change, {}).status());
  }
  const auto versions_of = [&](const v1::VersionFilter& filter) {
    std::vector<int64_t> numbers;
    absl::StatusOr<std::vector<v1::VersionInfo>> found = store_->FindVersions("m", filter);
    EXPECT_OK(found.status());
    for (const v1::VersionInfo& info : found.value_or(std::vector<v1::VersionInfo>())) {
      numbers.push_back(info.version());
    }
    return numbers;
  };
  v1::VersionFilter filter;
  EXPECT_THAT(versions_of(filter), ElementsAre(1, 2, 3));
  filter.add_tags("evaluated=yes");
  EXPECT_THAT(versions_of(filter), ElementsAre(1, 3));
  ASSERT_OK_AND_ASSIGN(*filter.add_metrics(), ParseMetricCondition("val_acc>=0.88"));
  EXPECT_THAT(versions_of(filter), ElementsAre(3));
  v1::VersionFilter by_label;
  by_label.add_labels("run=a");
  EXPECT_THAT(versions_of(by_label), ElementsAre(1, 2));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::VersionInfo> all, store_->ListVersions("m"));
  v1::VersionFilter since_second;
  since_second.set_created_after_unix_micros(all[1].metadata().created_unix_micros());
  EXPECT_THAT(versions_of(since_second), ElementsAre(2, 3));
  v1::VersionFilter bad;
  bad.add_metrics()->set_name("val_acc");
  EXPECT_THAT(store_->FindVersions("m", bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(StoreConformanceTest, ModelsAreCreatedUpdatedRenamedAndDeletedKeepingTheirNumbers) {
  v1::ModelDetails details;
  details.set_description("ResNet-18 for product photos");
  details.set_owner("vision-team");
  (*details.mutable_tags())["task"] = "classification";
  ASSERT_OK_AND_ASSIGN(v1::ModelInfo created, store_->CreateModel("resnet", details, {}));
  EXPECT_EQ(created.version_count(), 0);
  EXPECT_EQ(created.details().owner(), "vision-team");
  EXPECT_GT(created.details().created_unix_micros(), 0);
  EXPECT_THAT(store_->CreateModel("resnet", details, {}),
              StatusIs(absl::StatusCode::kAlreadyExists, "resnet"));

  v1::ModelDetailsChange change;
  change.set_owner("ml-platform");
  change.add_remove_tags("task");
  (*change.mutable_set_tags())["tier"] = "1";
  ASSERT_OK_AND_ASSIGN(v1::ModelInfo updated, store_->UpdateModel("resnet", change, {}));
  EXPECT_EQ(updated.details().owner(), "ml-platform");
  EXPECT_EQ(updated.details().description(), "ResNet-18 for product photos");
  EXPECT_THAT(updated.details().tags(), ::testing::SizeIs(1));
  EXPECT_FALSE(updated.details().updated_by().empty());

  CommitOptions options;
  options.aliases = {"production"};
  MustCommit("resnet", WeightsOnly({{"w", at::full({2}, 1)}}), options);
  v1::AnnotationChange annotation;
  (*annotation.mutable_set_metrics())["val_acc"] = 0.9;
  ASSERT_OK(store_->AnnotateVersion("resnet", 1, annotation, {}).status());

  ASSERT_OK(store_->RenameModel("resnet", "resnet18", {"", "naming convention"}));
  EXPECT_THAT(store_->GetManifest(Ref("resnet@1")), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(v1::Manifest moved, store_->GetManifest(Ref("resnet18@production")));
  EXPECT_EQ(moved.model(), "resnet18");
  EXPECT_EQ(moved.version(), 1);
  EXPECT_EQ(moved.annotations().metrics().at("val_acc"), 0.9);
  ASSERT_OK_AND_ASSIGN(at::Tensor weights, ReadTensor(*store_, "resnet18", 1, "w"));
  ExpectSameTensor(weights, at::full({2}, 1), "renamed w");
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name(), "resnet18");
  EXPECT_EQ(models[0].details().owner(), "ml-platform");
  EXPECT_THAT(store_->RenameModel("resnet18", "resnet", {}),
              StatusIs(absl::StatusCode::kAlreadyExists, "was a model before"));
  MustCommit("other", WeightsOnly({{"w", at::full({2}, 5)}}));
  EXPECT_THAT(store_->RenameModel("resnet18", "other", {}),
              StatusIs(absl::StatusCode::kAlreadyExists, "exists"));
  EXPECT_THAT(store_->RenameModel("missing", "x", {}), StatusIs(absl::StatusCode::kNotFound));

  EXPECT_THAT(store_->DeleteModel("resnet18", /*force=*/false, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "1 version(s)"));
  ASSERT_OK_AND_ASSIGN(v1::DeleteModelResponse deleted,
                       store_->DeleteModel("resnet18", /*force=*/true, {}));
  EXPECT_EQ(deleted.versions_deleted(), 1);
  EXPECT_THAT(store_->GetManifest(Ref("resnet18")), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(models, store_->ListModels());
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name(), "other");

  // The name comes back with its numbering: MODEL@1 is never handed out twice.
  CommitResult again = MustCommit("resnet18", WeightsOnly({{"w", at::full({2}, 7)}}));
  EXPECT_EQ(again.version.version(), 2);
  ASSERT_OK(store_->GarbageCollect(false).status());
  ASSERT_OK_AND_ASSIGN(weights, ReadTensor(*store_, "other", 1, "w"));
  ExpectSameTensor(weights, at::full({2}, 5), "other w after delete and GC");

  HistoryQuery query;
  query.model = "resnet18";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, store_->ListHistory(query));
  EXPECT_THAT(EventLines(events),
              ElementsAre("MODEL_RENAMED resnet -> resnet18",
                          "VERSION_DELETED resnet18@1 production", "MODEL_DELETED resnet18",
                          "MODEL_CREATED resnet18", "VERSION_COMMITTED resnet18@2"));
  EXPECT_EQ(events[0].reason(), "naming convention");
}

TEST_P(StoreConformanceTest, WatchSendsStateThenChangesAndResumesWithoutGapsOrRepeats) {
  CommitOptions options;
  options.aliases = {"production"};
  MustCommit("m", WeightsOnly({{"w", at::full({2}, 1)}}), options);
  MustCommit("unwatched", WeightsOnly({{"w", at::full({2}, 1)}}));
  v1::WatchRequest request;
  request.add_models("m");
  request.add_aliases("production");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, store_->Watch(request));
  const absl::Duration patience = absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> state, watch->Next(absl::Now() + patience));
  ASSERT_TRUE(state.has_value());
  ASSERT_TRUE(state->has_state());
  ASSERT_EQ(state->state().models_size(), 1);
  EXPECT_EQ(state->state().models(0).aliases().at("production"), 1);
  ASSERT_OK_AND_ASSIGN(RegistryState registry, store_->GetRegistryState({"m"}));
  EXPECT_EQ(state->resume_token(), registry.sequence);

  // Nothing new: Next waits until its deadline and says so.
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> nothing,
                       watch->Next(absl::Now() + absl::Milliseconds(200)));
  EXPECT_FALSE(nothing.has_value());

  // A change made while the watcher waits wakes it.
  std::thread committer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    MustCommit("m", WeightsOnly({{"w", at::full({2}, 2)}}));
    MustCommit("unwatched", WeightsOnly({{"w", at::full({2}, 2)}}));
    ASSERT_OK(store_->SetAlias("m", "staging", 2, 0, {}).status());  // not a watched alias.
    ASSERT_OK(store_->SetAlias("m", "production", 2, 1, {"", "promote"}).status());
  });
  std::vector<v1::WatchResponse> updates;
  while (updates.size() < 2) {
    ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> update,
                         watch->Next(absl::Now() + patience));
    ASSERT_TRUE(update.has_value()) << "no update within " << patience;
    updates.push_back(*update);
  }
  committer.join();
  EXPECT_EQ(EventLine(updates[0].event()), "VERSION_COMMITTED m@2");
  EXPECT_EQ(EventLine(updates[1].event()), "ALIAS_SET m@2 production from 1");
  EXPECT_EQ(updates[1].event().reason(), "promote");
  EXPECT_EQ(updates[1].resume_token(), updates[1].event().sequence());

  // A new watch resuming after the first update sees exactly the second, then nothing.
  watch->Cancel();
  request.set_resume_token(updates[0].resume_token());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> resumed, store_->Watch(request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> next,
                       resumed->Next(absl::Now() + patience));
  ASSERT_TRUE(next.has_value());
  EXPECT_FALSE(next->has_state());
  EXPECT_EQ(next->event().sequence(), updates[1].event().sequence());
  ASSERT_OK_AND_ASSIGN(nothing, resumed->Next(absl::Now() + absl::Milliseconds(200)));
  EXPECT_FALSE(nothing.has_value());

  v1::WatchRequest bad;
  bad.add_models("no/such model");
  EXPECT_THAT(store_->Watch(bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace ckpt::testing
