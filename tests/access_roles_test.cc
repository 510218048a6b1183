// Every RPC of the store and loader services against every role (a table; a scoped writer and a
// scoped admin among them): a call the role allows gets past access control (it may still fail for
// other reasons, e.g. NOT_FOUND), a call it does not is PERMISSION_DENIED naming the identity, the
// method and what it lacks; a writer scoped to team-a/* cannot touch team-b's models; an unknown
// token is UNAUTHENTICATED.

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "libs/rpc/access_policy.h"
#include "libs/rpc/grpc_server.h"
#include "libs/status/status_matchers.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/testing/child_process.h"
#include "proto/ckpt/v1/checkpoint_store.grpc.pb.h"
#include "proto/ckpt/v1/loader.grpc.pb.h"
#include "services/checkpoint_store/store_service.h"
#include "services/loader/loader_service.h"

namespace ckpt {
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
      {"team-a", "writer-token", Role::kWriter, {"team-a/*"}},
      {"ops", "admin-token", Role::kAdmin, {}},
      // Model names hold no '/': this scope also covers names like "team-a-x" that can exist.
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

TEST_F(AccessRolesTest, EachRoleMayCallExactlyItsMethodsOnItsModels) {
  const std::vector<Row> rows = Rows(*store_stub_, *loader_stub_);
  ASSERT_EQ(rows.size(), 24u);  // every method of ckpt.v1.CheckpointStore and ckpt.v1.Loader.
  int allowed = 0, denied = 0;
  for (const Row& row : rows) {
    for (const Identity& identity : Identities()) {
      for (const std::string model : {"team-a/m", "team-b/m"}) {
        const bool in_scope =
            identity.models.empty() || !row.names_model || absl::StartsWith(model, "team-a/");
        const bool role_suffices =
            static_cast<int>(identity.role) >= static_cast<int>(RequiredRole(row.method));
        const bool may = role_suffices && in_scope;
        const grpc::Status status = CallAs(row, identity.token, model);
        const std::string where = absl::StrCat(identity.name, " ", row.method, " ", model, ": ",
                                               status.error_code(), " ", status.error_message());
        if (may) {
          ++allowed;
          EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
          EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << where;
        } else {
          ++denied;
          EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << where;
          EXPECT_THAT(status.error_message(),
                      HasSubstr(absl::StrCat("identity '", identity.name, "'")))
              << where;
          EXPECT_THAT(status.error_message(), HasSubstr(row.method)) << where;
          EXPECT_THAT(status.error_message(),
                      !role_suffices
                          ? HasSubstr(absl::StrCat("needs the ", RoleName(RequiredRole(row.method)),
                                                   " role"))
                          : HasSubstr(absl::StrCat("covers only models matching ",
                                                   identity.models.front())))
              << where;
        }
      }
    }
  }
  // The table exercises both outcomes in quantity.
  EXPECT_GT(allowed, 40);
  EXPECT_GT(denied, 20);
}

TEST_F(AccessRolesTest, UnknownOrMissingTokensAreUnauthenticated) {
  for (const Row& row : Rows(*store_stub_, *loader_stub_)) {
    const grpc::Status status = CallAs(row, "no-such-token", "team-a/m");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << row.method;
    grpc::ClientContext context;
    EXPECT_EQ(row.call(context, "team-a/m").error_code(), grpc::StatusCode::UNAUTHENTICATED)
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
  EXPECT_THAT(status.error_message(), HasSubstr("team-a/*"));
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
  const grpc::Status other = CallAs(upload, "writer-token", "team-b/resnet");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other.error_message();
  EXPECT_THAT(other.error_message(), HasSubstr("team-b/resnet"));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ModelInfo> models, store_->ListModels());
  EXPECT_TRUE(models.empty());
}

}  // namespace
}  // namespace ckpt
