// Watch over the network: RemoteCheckpointStore's watch against a real store service on loopback
// over a real RocksDB store -- resuming across server restarts without gaps or repeats, many
// watchers at once, and watchers that stop reading (cut off by the server without slowing
// anyone else).

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/full.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "services/checkpoint_store/store_service.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

template <typename Condition>
bool Eventually(Condition condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return condition();
}

CheckpointContents Small(float value) {
  CheckpointContents contents;
  EXPECT_OK(contents.model.Insert("w", at::full({4}, value)));
  return contents;
}

class RemoteWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    db_path_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/",
                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    OpenStore();
  }

  void TearDown() override { StopServer(); }

  void OpenStore() {
    StoreOptions options;
    options.db_path = db_path_;
    // The tests make thousands of small changes; durability is not what they check.
    options.sync_commits = false;
    ASSERT_OK_AND_ASSIGN(local_, RocksDbCheckpointStore::Open(options));
  }

  void StartServer(StoreServiceOptions options = {}, const std::string& address = "") {
    ASSERT_OK_AND_ASSIGN(service_, StoreService::Create(local_.get(), options));
    GrpcServerOptions server_options;
    if (!address.empty()) server_options.listen_address = address;
    ASSERT_OK_AND_ASSIGN(
        server_, GrpcServer::Start(server_options,
                                   {{service_.get(), v1::CheckpointStore::service_full_name()}}));
  }

  void StopServer() {
    if (server_ != nullptr) {
      server_->Shutdown(absl::ZeroDuration());
      server_->Wait();
    }
    server_.reset();
    service_.reset();
  }

  std::unique_ptr<RemoteCheckpointStore> Connect() {
    RemoteStoreOptions options;
    options.address = server_->address();
    options.deadline = absl::Seconds(20);
    options.connect_timeout = absl::Seconds(5);
    options.initial_backoff = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> remote =
        RemoteCheckpointStore::Connect(options);
    EXPECT_OK(remote.status());
    return remote.ok() ? *std::move(remote) : nullptr;
  }

  // The sequences of `model`'s events after `after`, as the history has them.
  std::vector<int64_t> HistorySequences(const std::string& model, int64_t after) {
    HistoryQuery query;
    query.model = model;
    query.after_sequence = after;
    absl::StatusOr<std::vector<v1::RegistryEvent>> events = local_->ListHistory(query);
    EXPECT_OK(events.status());
    std::vector<int64_t> sequences;
    for (const v1::RegistryEvent& event : events.value_or(std::vector<v1::RegistryEvent>())) {
      sequences.push_back(event.sequence());
    }
    return sequences;
  }

  // Takes events from `watch` until it has `count` of them (each with its resume token), failing
  // when one does not come within `patience`.
  static void TakeEvents(RegistryWatch& watch, size_t count, std::vector<int64_t>& sequences,
                         int64_t& token, absl::Duration patience = absl::Seconds(20)) {
    while (sequences.size() < count) {
      absl::StatusOr<std::optional<v1::WatchResponse>> next = watch.Next(absl::Now() + patience);
      ASSERT_OK(next.status());
      ASSERT_TRUE(next->has_value())
          << "no update within " << patience << " after " << sequences.size() << " events";
      ASSERT_TRUE((*next)->has_event());
      EXPECT_EQ((*next)->resume_token(), (*next)->event().sequence());
      sequences.push_back((*next)->event().sequence());
      token = (*next)->resume_token();
    }
  }

  std::string db_path_;
  std::unique_ptr<RocksDbCheckpointStore> local_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(RemoteWatchTest, ResumesAfterTheServerRestartedSeeingEveryChangeOnceInOrder) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  CommitOptions best;
  best.aliases = {"best"};
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(1), best).status());

  v1::WatchRequest request;
  request.add_models("m");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, remote->Watch(request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> state,
                       watch->Next(absl::Now() + absl::Seconds(20)));
  ASSERT_TRUE(state.has_value() && state->has_state());
  ASSERT_EQ(state->state().models_size(), 1);
  EXPECT_EQ(state->state().models(0).aliases().at("best"), 1);
  const int64_t state_token = state->resume_token();

  // A commit and an alias move while it watches.
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(2)).status());
  ASSERT_OK(remote->SetAlias("m", "best", 2, 1, {"", "better"}).status());
  std::vector<int64_t> seen;
  int64_t token = state_token;
  TakeEvents(*watch, 2, seen, token);
  ASSERT_FALSE(HasFailure());

  // The watcher goes away; the server stops, the store is closed and reopened, and it is served
  // again on another port, where more changes happen before the watcher comes back.
  watch.reset();
  remote.reset();
  StopServer();
  local_.reset();
  OpenStore();
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> other = Connect();
  ASSERT_NE(other, nullptr);
  ASSERT_OK(CommitCheckpoint(*other, "m", Small(3)).status());
  v1::AnnotationChange change;
  (*change.mutable_set_metrics())["val_acc"] = 0.93;
  ASSERT_OK(other->AnnotateVersion("m", 3, change, {"", "evaluated"}).status());
  ASSERT_OK(other->SetAlias("m", "best", 3, 2, {"", "val_acc 0.93"}).status());
  ASSERT_OK(CommitCheckpoint(*other, "unwatched", Small(1)).status());
  ASSERT_OK(other->DeleteAlias("m", "best", {"", "retired"}));

  // Back with its token: exactly the changes it missed, then live ones.
  std::unique_ptr<RegistryWatch> resumed;
  {
    std::unique_ptr<RemoteCheckpointStore> back = Connect();
    ASSERT_NE(back, nullptr);
    request.set_resume_token(token);
    ASSERT_OK_AND_ASSIGN(resumed, back->Watch(request));  // outlives `back`.
  }
  TakeEvents(*resumed, 6, seen, token);
  ASSERT_FALSE(HasFailure());
  ASSERT_OK(other->DeleteVersion("m", 1, /*force=*/false, {"", "cleanup"}).status());
  TakeEvents(*resumed, 7, seen, token);
  ASSERT_FALSE(HasFailure());
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> nothing,
                       resumed->Next(absl::Now() + absl::Milliseconds(300)));
  EXPECT_FALSE(nothing.has_value()) << nothing->DebugString();
  EXPECT_EQ(seen, HistorySequences("m", state_token));

  // The history has the reasons the remote client sent, and the server's identity.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, other->ListHistory({"m"}));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().reason(), "cleanup");
  EXPECT_EQ(events.back().identity(), "anonymous");
}

TEST_F(RemoteWatchTest, ResumesByItselfWhenTheServerComesBackOnItsAddress) {
  StartServer();
  const std::string address = server_->address();
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(1)).status());
  v1::WatchRequest request;
  request.add_models("m");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, remote->Watch(request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> state,
                       watch->Next(absl::Now() + absl::Seconds(20)));
  ASSERT_TRUE(state.has_value() && state->has_state());
  ASSERT_OK(remote->SetAlias("m", "best", 1).status());
  std::vector<int64_t> seen;
  int64_t token = state->resume_token();
  TakeEvents(*watch, 1, seen, token);
  ASSERT_FALSE(HasFailure());

  // Down, changed behind its back, and up again on the same address.
  StopServer();
  ASSERT_OK(CommitCheckpoint(*local_, "m", Small(2)).status());
  ASSERT_OK(local_->SetAlias("m", "best", 2).status());
  StartServer({}, address);
  ASSERT_OK(remote->SetAlias("m", "production", 2).status());
  TakeEvents(*watch, 4, seen, token);
  ASSERT_FALSE(HasFailure());
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> nothing,
                       watch->Next(absl::Now() + absl::Milliseconds(300)));
  EXPECT_FALSE(nothing.has_value());
  EXPECT_EQ(seen, HistorySequences("m", state->resume_token()));
}

TEST_F(RemoteWatchTest, AShutdownEndsWatchesAndTheyResumeWithoutASecondStateEvenFromNothing) {
  StartServer();
  const std::string address = server_->address();
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  // An empty store: the state's resume token is 0, the same number that asks for a state.
  v1::WatchRequest request;
  request.add_models("m");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, remote->Watch(request));
  ASSERT_OK_AND_ASSIGN(std::optional<v1::WatchResponse> state,
                       watch->Next(absl::Now() + absl::Seconds(20)));
  ASSERT_TRUE(state.has_value() && state->has_state());
  EXPECT_EQ(state->resume_token(), 0);
  EXPECT_EQ(state->state().models_size(), 0);

  // What the service's main does on SIGTERM: end the watches, then shut down with a grace that
  // they no longer hold up.
  service_->EndWatches();
  const absl::Time shutting_down = absl::Now();
  server_->Shutdown(absl::Seconds(30));
  server_->Wait();
  EXPECT_LT(absl::Now() - shutting_down, absl::Seconds(10));
  server_.reset();
  service_.reset();
  ASSERT_OK(CommitCheckpoint(*local_, "m", Small(1)).status());
  StartServer({}, address);
  ASSERT_OK(remote->SetAlias("m", "best", 1).status());
  std::vector<int64_t> seen;
  int64_t token = 0;
  TakeEvents(*watch, 3, seen, token);  // model created, version committed, alias set.
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(seen, HistorySequences("m", 0));
}

TEST_F(RemoteWatchTest, AHundredWatchersOfOneAliasAllSeeItMove) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(1)).status());
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(2)).status());
  ASSERT_OK(remote->SetAlias("m", "production", 1).status());

  constexpr int kWatchers = 100;
  const absl::Duration kBound = absl::Seconds(10);
  std::atomic<int> ready{0};
  absl::Notification moved;
  std::atomic<int> saw_move{0};
  std::vector<std::string> failures(kWatchers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatchers; ++i) {
    threads.emplace_back([&, i] {
      v1::WatchRequest request;
      request.add_models("m");
      request.add_aliases("production");
      absl::StatusOr<std::unique_ptr<RegistryWatch>> watch = remote->Watch(request);
      if (!watch.ok()) {
        failures[i] = watch.status().ToString();
        ++ready;
        return;
      }
      absl::StatusOr<std::optional<v1::WatchResponse>> state =
          (*watch)->Next(absl::Now() + absl::Seconds(30));
      ++ready;
      if (!state.ok() || !state->has_value() || !(*state)->has_state()) {
        failures[i] = "no state";
        return;
      }
      if (!moved.WaitForNotificationWithTimeout(absl::Seconds(60))) return;
      const absl::Time deadline = absl::Now() + kBound;
      absl::StatusOr<std::optional<v1::WatchResponse>> next = (*watch)->Next(deadline);
      if (!next.ok() || !next->has_value() || !(*next)->has_event() ||
          (*next)->event().kind() != v1::RegistryEvent::ALIAS_SET ||
          (*next)->event().version() != 2) {
        failures[i] = next.ok() && next->has_value() ? (*next)->DebugString() : "nothing";
        return;
      }
      ++saw_move;
    });
  }
  ASSERT_TRUE(Eventually([&] { return ready.load() == kWatchers; }, absl::Seconds(30)));
  EXPECT_EQ(service_->active_watches(), kWatchers);
  const absl::Time start = absl::Now();
  ASSERT_OK(remote->SetAlias("m", "production", 2, 1, {"", "release 2"}).status());
  moved.Notify();
  for (std::thread& thread : threads) thread.join();
  const absl::Duration took = absl::Now() - start;
  for (int i = 0; i < kWatchers; ++i) EXPECT_EQ(failures[i], "") << "watcher " << i;
  EXPECT_EQ(saw_move.load(), kWatchers);
  EXPECT_LT(took, kBound);
  std::printf("%d watchers saw the move within %s\n", kWatchers,
              absl::FormatDuration(took).c_str());
  EXPECT_TRUE(Eventually([&] { return service_->active_watches() == 0; }, absl::Seconds(10)));
}

TEST_F(RemoteWatchTest, AStalledWatcherIsCutOffWithoutHoldingUpChanges) {
  StoreServiceOptions options;
  options.watch_write_timeout = absl::Seconds(1);
  StartServer(options);
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(1)).status());

  // A watcher that opens its stream and then reads nothing.
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::CheckpointStore::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  v1::WatchRequest request;
  request.add_models("m");
  std::unique_ptr<grpc::ClientReader<v1::WatchResponse>> stalled = stub->Watch(&context, request);
  ASSERT_TRUE(Eventually([&] { return service_->active_watches() == 1; }, absl::Seconds(10)));

  // Changes whose events (32 KiB of tags each) overflow every flow-control window on the way to
  // the stalled watcher.
  constexpr int kChanges = 2000;
  const std::string blob(32 << 10, 'x');
  absl::Duration slowest;
  const absl::Time start = absl::Now();
  absl::Time cut_off_by = absl::InfiniteFuture();
  for (int i = 0; i < kChanges; ++i) {
    v1::AnnotationChange change;
    (*change.mutable_set_tags())["blob"] = absl::StrCat(i, blob);
    const absl::Time before = absl::Now();
    ASSERT_OK(remote->AnnotateVersion("m", 1, change, {}).status());
    slowest = std::max(slowest, absl::Now() - before);
    if (cut_off_by == absl::InfiniteFuture() && service_->watches_cut_off() == 1) {
      cut_off_by = absl::Now();
    }
  }
  ASSERT_OK(remote->SetAlias("m", "best", 1).status());
  const absl::Duration took = absl::Now() - start;
  std::printf("%d changes in %s (slowest %s) with a stalled watcher\n", kChanges,
              absl::FormatDuration(took).c_str(), absl::FormatDuration(slowest).c_str());
  EXPECT_LT(slowest, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(40));

  // The server cut it off (its write blocked for watch_write_timeout) and its thread is free.
  EXPECT_TRUE(Eventually([&] { return service_->watches_cut_off() == 1; }, absl::Seconds(10)));
  EXPECT_TRUE(Eventually([&] { return service_->active_watches() == 0; }, absl::Seconds(10)));
  if (cut_off_by != absl::InfiniteFuture()) {
    std::printf("cut off %s after the first change\n",
                absl::FormatDuration(cut_off_by - start).c_str());
  }

  // When it finally reads: what made it through, then CANCELLED.
  v1::WatchResponse response;
  int received = 0;
  while (stalled->Read(&response)) ++received;
  const grpc::Status status = stalled->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  EXPECT_GT(received, 0);
  EXPECT_LT(received, kChanges + 1);
}

TEST_F(RemoteWatchTest, AWatcherThatReadsTooSlowlyEndsWithItsTokenAndResumesWithoutGaps) {
  StoreServiceOptions options;
  options.watch_max_lag = 20;
  StartServer(options);
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(1)).status());
  v1::WatchRequest request;
  request.add_models("m");
  request.set_resume_token(HistorySequences("m", 0).back());
  const int64_t first_token = request.resume_token();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> watch, remote->Watch(request));

  constexpr int kChanges = 400;
  std::thread writer([&] {
    const std::string blob(32 << 10, 'y');
    for (int i = 0; i < kChanges; ++i) {
      v1::AnnotationChange change;
      (*change.mutable_set_tags())["blob"] = absl::StrCat(i, blob);
      ASSERT_OK(remote->AnnotateVersion("m", 1, change, {}).status());
    }
  });
  // Reads one update every 20 ms: far slower than the changes come.
  std::vector<int64_t> seen;
  absl::Status ended;
  while (true) {
    absl::StatusOr<std::optional<v1::WatchResponse>> next =
        watch->Next(absl::Now() + absl::Seconds(20));
    if (!next.ok()) {
      ended = next.status();
      break;
    }
    ASSERT_TRUE(next->has_value()) << "nothing within 20 s";
    seen.push_back((*next)->event().sequence());
    absl::SleepFor(absl::Milliseconds(20));
  }
  writer.join();
  EXPECT_THAT(
      ended, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("resume with resume_token")));
  ASSERT_FALSE(seen.empty());
  EXPECT_THAT(std::string(ended.message()), HasSubstr(absl::StrCat(seen.back())));
  EXPECT_GE(service_->watches_cut_off(), 1);

  // Resuming with the last token it got continues exactly.
  request.set_resume_token(seen.back());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RegistryWatch> resumed, remote->Watch(request));
  int64_t token = seen.back();
  TakeEvents(*resumed, kChanges, seen, token);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(seen, HistorySequences("m", first_token));
}

TEST_F(RemoteWatchTest, RegistryStateAndWaitForHistoryGoThroughWatch) {
  StartServer();
  std::unique_ptr<RemoteCheckpointStore> remote = Connect();
  ASSERT_NE(remote, nullptr);
  ASSERT_OK(CommitCheckpoint(*remote, "m", Small(1)).status());
  ASSERT_OK_AND_ASSIGN(RegistryState state, remote->GetRegistryState({"m", "absent"}));
  ASSERT_EQ(state.models.size(), 1u);
  EXPECT_EQ(state.models[0].name(), "m");
  EXPECT_EQ(state.sequence, HistorySequences("m", 0).back());
  // The stream it read the state from is cancelled, and the server lets go of it.
  EXPECT_TRUE(Eventually([&] { return service_->active_watches() == 0; }, absl::Seconds(10)));

  ASSERT_OK_AND_ASSIGN(bool found, remote->WaitForHistory(state.sequence, absl::Now()));
  EXPECT_FALSE(found);
  ASSERT_OK_AND_ASSIGN(
      found, remote->WaitForHistory(state.sequence, absl::Now() + absl::Milliseconds(300)));
  EXPECT_FALSE(found);
  std::thread committer([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_OK(local_->SetAlias("m", "best", 1).status());
  });
  const absl::Time before = absl::Now();
  ASSERT_OK_AND_ASSIGN(found,
                       remote->WaitForHistory(state.sequence, absl::Now() + absl::Seconds(20)));
  committer.join();
  EXPECT_TRUE(found);
  EXPECT_LT(absl::Now() - before, absl::Seconds(10));
  ASSERT_OK_AND_ASSIGN(found, remote->WaitForHistory(0, absl::Now()));
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace ckpt
