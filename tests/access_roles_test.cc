// Every RPC of the store and loader services against every role (a literal table, written out
// here rather than derived from the production one; a scoped writer and a scoped admin among
// them): a call the table allows gets past access control (it may still fail for other reasons,
// e.g. NOT_FOUND), a call it does not is PERMISSION_DENIED naming the identity and what it lacks;
// a writer scoped to team-a-* cannot touch team-b's models; an unknown token is UNAUTHENTICATED.
// Then a scoped team against a store holding two teams' data, through every call including those
// that name no model, checking what comes back; and refused calls in the audit log, also under a
// flood.

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/full.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/auth/access_policy.h"
#include "libs/client/remote_checkpoint_store.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/checkpoint_contents.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/testing/store_conformance.h"
#include "libs/testing/child_process.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"
#include "services/checkpoint_store/store_service.h"
#include "services/loader/loader_service.h"

namespace ckpt {
namespace testing {
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
}  // namespace testing

namespace {

using ::testing::HasSubstr;

struct Identity {
  std::string name;
  std::string token;
  Role role;
  std::vector<std::string> models;  // empty: every model.
};

const std::vector<Identity>& Identities() {
  static const auto* identities = new std::vector<Identity>{
      {"serving", "reader-token", Role::kReader, {}},
      {"team-a", "writer-token", Role::kWriter, {"team-a-*"}},
      {"ops", "admin-token", Role::kAdmin, {}},
      {"team-a-ops", "scoped-admin-token", Role::kAdmin, {"team-a*"}},
  };
  return *identities;
}

std::string Sha256Hex(const std::string& token) {
  const ckpt::testing::ShellResult result =
      ckpt::testing::RunShell("printf %s '" + token + "' | sha256sum");
  return std::string(result.output.substr(0, 64));
}

class AccessRolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(::testing::TempDir()) + "/roles-" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir);
    StoreOptions store_options;
    store_options.db_path = dir + "/db";
    store_options.create_if_missing = true;
    ASSERT_OK_AND_ASSIGN(store_, RocksDbCheckpointStore::Open(store_options));
    std::string json = R"({"identities": [)";
    for (const Identity& identity : Identities()) {
      absl::StrAppend(&json, identity.name == "serving" ? "" : ",", R"({"name": ")", identity.name,
                      R"(", "token_sha256": ")", Sha256Hex(identity.token), R"(", "role": ")",
                      RoleName(identity.role), R"(")");
      if (!identity.models.empty()) {
        absl::StrAppend(&json, R"(, "models": [")", identity.models[0], R"("])");
      }
      absl::StrAppend(&json, "}");
    }
    absl::StrAppend(&json, "]}");
    ckpt::testing::WriteTextFile(dir + "/identities.json", json);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<AccessPolicy> policy,
                         AccessPolicy::FromIdentitiesFile(dir + "/identities.json"));
    std::shared_ptr<const AccessPolicy> access = std::move(policy);

    StoreServiceOptions store_service_options;
    store_service_options.access = access;
    ASSERT_OK_AND_ASSIGN(store_service_, StoreService::Create(store_.get(), store_service_options));
    LoaderServiceOptions loader_options;
    loader_options.access = access;
    ASSERT_OK_AND_ASSIGN(loader_service_, LoaderService::Create(store_.get(), loader_options));
    ASSERT_OK_AND_ASSIGN(server_,
                         GrpcServer::Start({}, {{store_service_.get(), "ckpt.v1.CheckpointStore"},
                                                {loader_service_.get(), "ckpt.v1.Loader"}}));
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    store_stub_ = v1::CheckpointStore::NewStub(channel);
    loader_stub_ = v1::Loader::NewStub(channel);
  }

  void TearDown() override {
    server_->Shutdown(absl::ZeroDuration());
    server_->Wait();
  }

  std::unique_ptr<RocksDbCheckpointStore> store_;
  std::unique_ptr<StoreService> store_service_;
  std::unique_ptr<LoaderService> loader_service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::CheckpointStore::Stub> store_stub_;
  std::unique_ptr<v1::Loader::Stub> loader_stub_;
};

// One RPC made with `context` on `model` ("" for calls that name none).
using Call = std::function<grpc::Status(grpc::ClientContext&, const std::string& model)>;

struct Row {
  std::string method;
  bool names_model;
  Call call;
};

v1::VersionRef Ref(const std::string& model) {
  v1::VersionRef ref;
  ref.set_model(model);
  ref.set_version(1);
  return ref;
}

std::vector<Row> Rows(v1::CheckpointStore::Stub& store, v1::Loader::Stub& loader) {
  std::vector<Row> rows = {
      {"FindMissingChunks", false,
       [&](grpc::ClientContext& c, const std::string&) {
         v1::FindMissingChunksResponse r;
         return store.FindMissingChunks(&c, v1::FindMissingChunksRequest(), &r);
       }},
      {"ListModels", false,
       [&](grpc::ClientContext& c, const std::string&) {
         v1::ListModelsResponse r;
         return store.ListModels(&c, v1::ListModelsRequest(), &r);
       }},
      {"ListVersions", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::ListVersionsRequest q;
         q.set_model(model);
         v1::ListVersionsResponse r;
         return store.ListVersions(&c, q, &r);
       }},
      {"GetManifest", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::GetManifestRequest q;
         *q.mutable_ref() = Ref(model);
         v1::Manifest r;
         return store.GetManifest(&c, q, &r);
       }},
      {"GetStats", false,
       [&](grpc::ClientContext& c, const std::string&) {
         v1::StoreStats r;
         return store.GetStats(&c, v1::GetStatsRequest(), &r);
       }},
      {"Verify", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::VerifyRequest q;
         q.set_model(model);
         v1::VerifyResponse r;
         return store.Verify(&c, q, &r);
       }},
      {"ListAudit", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::ListAuditRequest q;
         q.set_model(model);
         v1::ListAuditResponse r;
         return store.ListAudit(&c, q, &r);
       }},
      {"Download", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::DownloadRequest q;
         *q.mutable_ref() = Ref(model);
         auto reader = store.Download(&c, q);
         v1::DownloadResponse r;
         while (reader->Read(&r)) {
         }
         return reader->Finish();
       }},
      {"Upload", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::UploadResponse r;
         auto writer = store.Upload(&c, &r);
         v1::UploadRequest q;
         q.mutable_header()->set_model(model);
         q.mutable_header()->mutable_manifest()->set_model(model);
         writer->Write(q);
         writer->WritesDone();
         return writer->Finish();
       }},
      {"SetAlias", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::SetAliasRequest q;
         q.set_model(model);
         q.set_alias("best");
         q.set_version(99);
         v1::SetAliasResponse r;
         return store.SetAlias(&c, q, &r);
       }},
      {"DeleteAlias", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::DeleteAliasRequest q;
         q.set_model(model);
         q.set_alias("best");
         v1::DeleteAliasResponse r;
         return store.DeleteAlias(&c, q, &r);
       }},
      {"DeleteVersion", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::DeleteVersionRequest q;
         q.set_model(model);
         q.set_version(99);
         v1::DeleteVersionResponse r;
         return store.DeleteVersion(&c, q, &r);
       }},
      {"ApplyRetention", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::ApplyRetentionRequest q;
         q.set_model(model);
         q.set_dry_run(true);
         q.mutable_policy()->set_keep_last(1);
         v1::ApplyRetentionResponse r;
         return store.ApplyRetention(&c, q, &r);
       }},
      {"GarbageCollect", false,
       [&](grpc::ClientContext& c, const std::string&) {
         v1::GarbageCollectRequest q;
         q.set_dry_run(true);
         v1::GarbageCollectResponse r;
         return store.GarbageCollect(&c, q, &r);
       }},
      {"Load", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::LoadRequest q;
         *q.mutable_ref() = Ref(model);
         auto reader = loader.Load(&c, q);
         v1::LoadResponse r;
         while (reader->Read(&r)) {
         }
         return reader->Finish();
       }},
      {"Preflight", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::PreflightRequest q;
         *q.mutable_ref() = Ref(model);
         v1::PreflightResponse r;
         return loader.Preflight(&c, q, &r);
       }},
      {"Export", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::ExportRequest q;
         *q.mutable_ref() = Ref(model);
         auto reader = loader.Export(&c, q);
         v1::ExportResponse r;
         while (reader->Read(&r)) {
         }
         return reader->Finish();
       }},
      // The model registry.
      {"CreateModel", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::CreateModelRequest q;
         q.set_model(model);
         q.set_reason("roles test");
         v1::ModelInfo r;
         return store.CreateModel(&c, q, &r);
       }},
      {"UpdateModel", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::UpdateModelRequest q;
         q.set_model(model);
         q.mutable_change()->set_description("updated");
         v1::ModelInfo r;
         return store.UpdateModel(&c, q, &r);
       }},
      {"AnnotateVersion", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::AnnotateVersionRequest q;
         q.set_model(model);
         q.set_version(1);
         (*q.mutable_change()->mutable_set_tags())["k"] = "v";
         v1::VersionAnnotations r;
         return store.AnnotateVersion(&c, q, &r);
       }},
      {"RenameModel", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::RenameModelRequest q;
         q.set_model(model);
         q.set_new_name(model + "-renamed");
         v1::RenameModelResponse r;
         return store.RenameModel(&c, q, &r);
       }},
      {"DeleteModel", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::DeleteModelRequest q;
         q.set_model(model + "-absent");
         v1::DeleteModelResponse r;
         return store.DeleteModel(&c, q, &r);
       }},
      {"ListHistory", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::ListHistoryRequest q;
         q.set_model(model);
         v1::ListHistoryResponse r;
         return store.ListHistory(&c, q, &r);
       }},
      {"Watch", true,
       [&](grpc::ClientContext& c, const std::string& model) {
         v1::WatchRequest q;
         q.add_models(model);
         auto reader = store.Watch(&c, q);
         v1::WatchResponse r;
         // Admitted: the state comes first, and the stream would go on; end it here.
         if (reader->Read(&r)) c.TryCancel();
         return reader->Finish();
       }},
  };
  return rows;
}

grpc::Status CallAs(const Row& row, const std::string& token, const std::string& model) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  context.AddMetadata("authorization", "Bearer " + token);
  return row.call(context, model);
}

// What each identity may do, written out: per method, two letters (team-a-m, team-b-m) for each
// of serving (reader), team-a (writer, team-a-*), ops (admin) and team-a-ops (admin, team-a*).
//   Y  past access control (the call may still fail for other reasons, e.g. NOT_FOUND)
//   R  PERMISSION_DENIED: the role does not allow the method
//   S  PERMISSION_DENIED: the scope does not cover the model, or the call acts on the whole store
//      and the identity is scoped
// Calls that name no model (FindMissingChunks, ListModels, GetStats, GarbageCollect) are made
// twice all the same; for a scoped identity their answers are limited (see the next test).
const std::map<std::string, std::string>& ExpectedTable() {
  // clang-format off
  static const auto* table = new std::map<std::string, std::string>{
      //                     serving team-a ops team-a-ops
      {"FindMissingChunks", "YY YY YY YY"},
      {"ListModels",        "YY YY YY YY"},
      {"ListVersions",      "YY YS YY YS"},
      {"GetManifest",       "YY YS YY YS"},
      {"GetStats",          "YY YY YY YY"},
      {"Verify",            "YY YS YY YS"},
      {"ListAudit",         "YY YS YY YS"},
      {"Download",          "YY YS YY YS"},
      {"Upload",            "RR YS YY YS"},
      {"SetAlias",          "RR YS YY YS"},
      {"DeleteAlias",       "RR YS YY YS"},
      {"DeleteVersion",     "RR RR YY YS"},
      {"ApplyRetention",    "RR RR YY YS"},
      {"GarbageCollect",    "RR RR YY SS"},
      {"Load",              "YY YS YY YS"},
      {"Preflight",         "YY YS YY YS"},
      {"Export",            "YY YS YY YS"},
      {"CreateModel",       "RR YS YY YS"},
      {"UpdateModel",       "RR YS YY YS"},
      {"AnnotateVersion",   "RR YS YY YS"},
      {"RenameModel",       "RR RR YY YS"},
      {"DeleteModel",       "RR RR YY YS"},
      {"ListHistory",       "YY YS YY YS"},
      {"Watch",             "YY YS YY YS"},
  };
  // clang-format on
  return *table;
}

TEST_F(AccessRolesTest, EachRoleMayCallExactlyWhatTheTableSays) {
  const std::vector<Row> rows = Rows(*store_stub_, *loader_stub_);
  ASSERT_EQ(rows.size(), 24u);  // every method of ckpt.v1.CheckpointStore and ckpt.v1.Loader.
  ASSERT_EQ(ExpectedTable().size(), rows.size());
  const char* const models[] = {"team-a-m", "team-b-m"};
  for (const Row& row : rows) {
    ASSERT_EQ(ExpectedTable().count(row.method), 1u) << row.method << " is not in the table";
    std::string expected = ExpectedTable().at(row.method);
    expected.erase(std::remove(expected.begin(), expected.end(), ' '), expected.end());
    ASSERT_EQ(expected.size(), 8u) << row.method;
    for (size_t who = 0; who < Identities().size(); ++who) {
      const Identity& identity = Identities()[who];
      for (int m = 0; m < 2; ++m) {
        const char outcome = expected[2 * who + m];
        const grpc::Status status = CallAs(row, identity.token, models[m]);
        const std::string where = absl::StrCat(
            identity.name, " ", row.method, " ", models[m], " (expected ", std::string(1, outcome),
            "): ", status.error_code(), " ", status.error_message());
        if (outcome == 'Y') {
          EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
          EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << where;
          continue;
        }
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
        EXPECT_THAT(status.error_message(),
                    HasSubstr(absl::StrCat("identity '", identity.name, "'")))
            << where;
        if (outcome == 'R') {
          EXPECT_THAT(status.error_message(), HasSubstr(row.method)) << where;
          EXPECT_THAT(status.error_message(), HasSubstr(" role")) << where;
        } else {
          EXPECT_THAT(status.error_message(), HasSubstr(identity.models.front())) << where;
        }
      }
    }
  }
}

TEST_F(AccessRolesTest, UnknownOrMissingTokensAreUnauthenticated) {
  for (const Row& row : Rows(*store_stub_, *loader_stub_)) {
    const grpc::Status status = CallAs(row, "no-such-token", "team-a-m");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << row.method;
    grpc::ClientContext context;
    EXPECT_EQ(row.call(context, "team-a-m").error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << row.method;
  }
}

TEST_F(AccessRolesTest, AScopedCallerNamesItsModelsToReadTheHistoryAndMayNotRenameOutOfScope) {
  // Events of every model would include other teams': a scoped reader must name its models.
  grpc::ClientContext history_context;
  history_context.AddMetadata("authorization", "Bearer writer-token");
  v1::ListHistoryResponse history;
  grpc::Status status =
      store_stub_->ListHistory(&history_context, v1::ListHistoryRequest(), &history);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("team-a-*"));
  grpc::ClientContext watch_context;
  watch_context.AddMetadata("authorization", "Bearer writer-token");
  auto reader = store_stub_->Watch(&watch_context, v1::WatchRequest());
  v1::WatchResponse update;
  EXPECT_FALSE(reader->Read(&update));
  status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("WatchRequest.models"));

  // A scoped admin may rename within its scope, not out of it (the new name is checked too).
  const Row create = Rows(*store_stub_, *loader_stub_)[17];
  ASSERT_EQ(create.method, "CreateModel");
  const grpc::Status created = CallAs(create, "admin-token", "team-a-x");
  ASSERT_TRUE(created.ok()) << created.error_code() << " " << created.error_message();
  grpc::ClientContext rename_context;
  rename_context.AddMetadata("authorization", "Bearer scoped-admin-token");
  v1::RenameModelRequest rename;
  rename.set_model("team-a-x");
  rename.set_new_name("team-b-x");
  v1::RenameModelResponse renamed;
  status = store_stub_->RenameModel(&rename_context, rename, &renamed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("team-b-x"));
  grpc::ClientContext within_context;
  within_context.AddMetadata("authorization", "Bearer scoped-admin-token");
  rename.set_new_name("team-a-y");
  status = store_stub_->RenameModel(&within_context, rename, &renamed);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(AccessRolesTest, AScopedWriterCommitsToItsOwnModelOnly) {
  // Through the real upload path: team-a's header for team-b is refused before any byte.
  const Row upload = Rows(*store_stub_, *loader_stub_)[8];
  ASSERT_EQ(upload.method, "Upload");
  const grpc::Status other = CallAs(upload, "writer-token", "team-b-resnet");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other.error_message();
  EXPECT_THAT(other.error_message(), HasSubstr("team-b-resnet"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  EXPECT_TRUE(models.empty());
}

// The store as an identity sees it over the wire.
std::unique_ptr<RemoteCheckpointStore> ConnectAs(const GrpcServer& server,
                                                 const std::string& token) {
  RemoteStoreOptions options;
  options.address = server.address();
  options.auth_token = token;
  absl::StatusOr<std::unique_ptr<RemoteCheckpointStore>> store =
      RemoteCheckpointStore::Connect(options);
  EXPECT_OK(store.status());
  return store.ok() ? *std::move(store) : nullptr;
}

TEST_F(AccessRolesTest, AScopedTeamSeesNothingOfAnotherTeamThroughAnyCall) {
  // Both teams' data, committed as each team would, so the audit log and history hold both.
  const at::Tensor shared_backbone = at::arange(1 << 20, at::kFloat);  // 4 MiB: one chunk
  const at::Tensor team_a_head = at::full({1000}, 1.0f);
  const at::Tensor team_b_head = at::full({1000}, 2.0f);
  std::unique_ptr<RemoteCheckpointStore> team_b = ConnectAs(*server_, "admin-token");
  ASSERT_NE(team_b, nullptr);
  ASSERT_OK(CommitCheckpoint(*team_b, "team-b-net",
                                   ckpt::testing::WeightsOnly(
                                       {{"backbone", shared_backbone}, {"head", team_b_head}}))
                .status());
  ASSERT_OK(team_b->SetAlias("team-b-net", "production", 1, 0, {"", "launch"}).status());
  std::unique_ptr<RemoteCheckpointStore> team_a = ConnectAs(*server_, "writer-token");
  ASSERT_NE(team_a, nullptr);
  ASSERT_OK(
      CommitCheckpoint(*team_a, "team-a-net", ckpt::testing::WeightsOnly({{"head", team_a_head}}))
          .status());

  // ListModels: its model only.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, team_a->ListModels());
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name(), "team-a-net");
  // GetStats: its figures only.
  ASSERT_OK_AND_ASSIGN(v1::StoreStats stats, team_a->GetStats());
  EXPECT_EQ(stats.models(), 1);
  EXPECT_EQ(stats.versions(), 1);
  EXPECT_EQ(stats.logical_bytes(), 4000);
  EXPECT_EQ(stats.physical_bytes(), 4000);
  EXPECT_EQ(stats.chunks(), 1);
  // Verify without a model: its versions only.
  ASSERT_OK_AND_ASSIGN(v1::VerifyResponse verified, team_a->Verify("", 0));
  EXPECT_EQ(verified.bytes_checked(), 4000);
  // FindMissingChunks: team-b's backbone is "missing" to team-a, its own head is not.
  ASSERT_OK_AND_ASSIGN(v1::Manifest theirs,
                       store_->GetManifest(ckpt::testing::Ref("team-b-net@1")));
  ASSERT_OK_AND_ASSIGN(v1::Manifest mine, store_->GetManifest(ckpt::testing::Ref("team-a-net@1")));
  const std::string their_backbone = theirs.tensors(0).chunks(0).sha256();
  const std::string my_head = mine.tensors(0).chunks(0).sha256();
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> missing,
                       team_a->FindMissingChunks({their_backbone, my_head}));
  EXPECT_EQ(missing, std::vector<std::string>{their_backbone});
  // A commit of team-b's backbone: every byte new to team-a, in the answer and in the audit.
  ASSERT_OK_AND_ASSIGN(
      CommitResult copied,
      CommitCheckpoint(*team_a, "team-a-copy",
                               ckpt::testing::WeightsOnly({{"backbone", shared_backbone}})));
  EXPECT_EQ(copied.new_bytes, 4 << 20);
  // ListAudit without a model: team-a's records only, with that same figure.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, team_a->ListAudit({}));
  ASSERT_EQ(records.size(), 2u);
  for (const v1::AuditRecord& record : records) {
    EXPECT_TRUE(absl::StartsWith(record.model(), "team-a-")) << record.ShortDebugString();
    EXPECT_EQ(record.identity(), "team-a");
  }
  EXPECT_THAT(records[1].detail(), HasSubstr("4194304 bytes, 4194304 new"));
  // History and watches of every model: refused; of its own: only its own.
  HistoryQuery all_history;
  EXPECT_THAT(team_a->ListHistory(all_history).status(),
              ckpt::testing::StatusIs(absl::StatusCode::kPermissionDenied));
  HistoryQuery own_history;
  own_history.model = "team-a-net";
  ASSERT_OK_AND_ASSIGN(std::vector<v1::RegistryEvent> events, team_a->ListHistory(own_history));
  ASSERT_FALSE(events.empty());
  for (const v1::RegistryEvent& event : events) EXPECT_EQ(event.model(), "team-a-net");
  ASSERT_OK_AND_ASSIGN(RegistryState state, team_a->GetRegistryState({"team-a-net"}));
  ASSERT_EQ(state.models.size(), 1u);
  EXPECT_THAT(team_a->GetRegistryState({"team-b-net"}).status(),
              ckpt::testing::StatusIs(absl::StatusCode::kPermissionDenied));
  // Everything that names team-b's model is refused, and reveals nothing of it.
  EXPECT_THAT(team_a->GetManifest(ckpt::testing::Ref("team-b-net@production")).status(),
              ckpt::testing::StatusIs(absl::StatusCode::kPermissionDenied,
                                      ::testing::Not(HasSubstr("production"))));
  EXPECT_THAT(team_a->ListVersions("team-b-net").status(),
              ckpt::testing::StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(team_a->Verify("team-b-net", 0).status(),
              ckpt::testing::StatusIs(absl::StatusCode::kPermissionDenied));
  // An unscoped reader still sees the whole store.
  std::unique_ptr<RemoteCheckpointStore> serving = ConnectAs(*server_, "reader-token");
  ASSERT_OK_AND_ASSIGN(models, serving->ListModels());
  EXPECT_EQ(models.size(), 3u);
  ASSERT_OK_AND_ASSIGN(missing, serving->FindMissingChunks({their_backbone}));
  EXPECT_TRUE(missing.empty());
  // A scoped admin may not collect the whole store's garbage.
  std::unique_ptr<RemoteCheckpointStore> team_a_ops = ConnectAs(*server_, "scoped-admin-token");
  EXPECT_THAT(team_a_ops->GarbageCollect(/*dry_run=*/true).status(),
              ckpt::testing::StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(AccessRolesTest, RefusedCallsAreInTheAuditLogNamingWhoEvenWhenUnknown) {
  const std::vector<Row> rows = Rows(*store_stub_, *loader_stub_);
  const Row& get_manifest = rows[3];
  ASSERT_EQ(get_manifest.method, "GetManifest");
  const Row& garbage_collect = rows[13];
  ASSERT_EQ(garbage_collect.method, "GarbageCollect");
  EXPECT_EQ(CallAs(get_manifest, "writer-token", "team-b-m").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CallAs(garbage_collect, "scoped-admin-token", "").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(CallAs(get_manifest, "stolen-token", "team-a-m").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Written on the service's work queue (several threads, so in any order): wait for them, and
  // key them by identity.
  std::map<std::string, v1::AuditRecord> refused;
  for (int attempt = 0; attempt < 100 && refused.size() < 3; ++attempt) {
    ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store_->ListAudit({}));
    refused.clear();
    for (const v1::AuditRecord& record : records) {
      // Begun and finished by two writes: wait for the finished record.
      if (record.action() == "refused" && record.outcome() != v1::AuditRecord::PENDING) {
        refused[record.identity()] = record;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(refused.size(), 3u);
  const v1::AuditRecord& team_a = refused["team-a"];
  EXPECT_EQ(team_a.model(), "team-b-m");
  EXPECT_EQ(team_a.detail(), "GetManifest");
  EXPECT_THAT(team_a.peer(), HasSubstr("127.0.0.1"));
  EXPECT_EQ(team_a.outcome(), v1::AuditRecord::FAILED);
  EXPECT_EQ(team_a.error_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(refused["team-a-ops"].detail(), "GarbageCollect");
  // The token's hash prefix tells tokens apart without revealing one.
  const std::string unknown =
      absl::StrCat("unknown (token sha256:", Sha256Hex("stolen-token").substr(0, 8), ")");
  ASSERT_EQ(refused.count(unknown), 1u);
  EXPECT_EQ(refused[unknown].error_code(), static_cast<int>(absl::StatusCode::kUnauthenticated));
  // `ckpt audit` reads the same log through ListAudit: an admin sees the refusals.
  std::unique_ptr<RemoteCheckpointStore> ops = ConnectAs(*server_, "admin-token");
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> seen_by_ops, ops->ListAudit({}));
  EXPECT_GE(seen_by_ops.size(), 3u);
}

TEST_F(AccessRolesTest, AFloodOfRefusedCallsLeavesTheAuditBoundedAndServedCallsServed) {
  std::unique_ptr<RemoteCheckpointStore> team_a = ConnectAs(*server_, "writer-token");
  ASSERT_OK(CommitCheckpoint(*team_a, "team-a-net",
                                   ckpt::testing::WeightsOnly({{"w", at::full({1000}, 1.0f)}}))
                .status());
  // 10,000 calls with a wrong token from four threads, while team-a keeps reading.
  std::atomic<bool> flooding{true};
  std::atomic<int> refused{0};
  std::vector<std::thread> flooders;
  for (int t = 0; t < 4; ++t) {
    flooders.emplace_back([&] {
      auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
      auto stub = v1::CheckpointStore::NewStub(channel);
      for (int i = 0; i < 2500; ++i) {
        grpc::ClientContext context;
        context.AddMetadata("authorization", "Bearer flood-token");
        v1::ListModelsResponse response;
        if (stub->ListModels(&context, v1::ListModelsRequest(), &response).error_code() ==
            grpc::StatusCode::UNAUTHENTICATED) {
          ++refused;
        }
      }
    });
  }
  int served = 0, failed = 0;
  std::thread reader([&] {
    while (flooding.load()) {
      absl::StatusOr<v1::Manifest> manifest =
          team_a->GetManifest(ckpt::testing::Ref("team-a-net@1"));
      manifest.ok() ? ++served : ++failed;
    }
  });
  for (std::thread& flooder : flooders) flooder.join();
  flooding.store(false);
  reader.join();
  EXPECT_EQ(refused.load(), 10000);
  EXPECT_GT(served, 0);
  EXPECT_EQ(failed, 0);
  // Bounded: the burst (200) plus 20 a second while the flood lasted, plus summaries -- far
  // below 10,000 -- and the log says how many went unrecorded.
  absl::SleepFor(absl::Milliseconds(500));  // queued writes land
  ASSERT_OK_AND_ASSIGN(std::vector<v1::AuditRecord> records, store_->ListAudit({}));
  int64_t refused_records = 0;
  for (const v1::AuditRecord& record : records) refused_records += record.action() == "refused";
  EXPECT_GE(refused_records, 200);
  EXPECT_LT(refused_records, 2000) << "the flood was not rate-limited";
  // One more refusal after the bucket refilled brings the summary of the last ones dropped (the
  // flood's earlier drops were summarized as it went, whenever the bucket had refilled).
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(CallAs(Rows(*store_stub_, *loader_stub_)[1], "flood-token", "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  int64_t accounted = 0;
  for (int attempt = 0; attempt < 100 && accounted != 10000 + 1; ++attempt) {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_OK_AND_ASSIGN(records, store_->ListAudit({}));
    accounted = 0;
    for (const v1::AuditRecord& record : records) {
      if (record.action() == "refused") ++accounted;
      if (record.action() != "refusals_dropped") continue;
      int64_t dropped = 0;
      ASSERT_TRUE(absl::SimpleAtoi(record.detail().substr(0, record.detail().find(' ')), &dropped))
          << record.detail();
      accounted += dropped;
    }
  }
  // Every refused call is either a record or counted in a summary.
  EXPECT_EQ(accounted, 10000 + 1);
}

}  // namespace
}  // namespace ckpt
