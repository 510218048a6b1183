// EtcdClient against a real etcd (Debian's etcd-server) on loopback.

#include "libs/ha/etcd_client.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/ha/testing/etcd_server.h"
#include "libs/status/status_matchers.h"
#include "libs/testing/child_process.h"
#include "libs/testing/requirements.h"
#include "libs/testing/test_certificates.h"

namespace ckpt::ha {
namespace {

using ::ckpt::testing::StatusIs;

TEST(EtcdClientTest, OneLeaseHolderAtATimeAndTheKeyGoesWithTheLease) {
  CKPT_REQUIRE(testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  testing::EtcdServer server;
  ASSERT_TRUE(server.ok());
  EtcdClientOptions options;
  // A dead endpoint first: every call goes on to the live one.
  options.endpoints = absl::StrCat("http://127.0.0.1:", testing::UnusedLoopbackPort(), ",",
                                   server.endpoint());
  ASSERT_OK_AND_ASSIGN(EtcdClient etcd, EtcdClient::Create(options));
  ASSERT_OK_AND_ASSIGN(int64_t first, etcd.GrantLease(absl::Seconds(2)));
  ASSERT_OK_AND_ASSIGN(int64_t second, etcd.GrantLease(absl::Seconds(2)));
  EtcdValue holder;
  ASSERT_OK_AND_ASSIGN(bool created, etcd.CreateIfAbsent("/ckpt/writer", "store-a", first, &holder));
  EXPECT_TRUE(created);
  ASSERT_OK_AND_ASSIGN(created, etcd.CreateIfAbsent("/ckpt/writer", "store-b", second, &holder));
  EXPECT_FALSE(created);
  EXPECT_EQ(holder.value, "store-a");
  EXPECT_EQ(holder.lease, first);
  ASSERT_OK_AND_ASSIGN(absl::Duration ttl, etcd.KeepAlive(first));
  EXPECT_GE(ttl, absl::Seconds(1));

  ASSERT_OK(etcd.RevokeLease(first));
  ASSERT_OK_AND_ASSIGN(std::optional<EtcdValue> gone, etcd.Get("/ckpt/writer"));
  EXPECT_FALSE(gone.has_value());
  EXPECT_THAT(etcd.KeepAlive(first), StatusIs(absl::StatusCode::kNotFound, "expired"));
  ASSERT_OK_AND_ASSIGN(created, etcd.CreateIfAbsent("/ckpt/writer", "store-b", second, &holder));
  EXPECT_TRUE(created);
  // Unrenewed, the lease expires and takes the key with it.
  absl::SleepFor(absl::Seconds(4));
  ASSERT_OK_AND_ASSIGN(gone, etcd.Get("/ckpt/writer"));
  EXPECT_FALSE(gone.has_value());
}

// A cluster that requires client certificates (--client-cert-auth): the lease is taken only by a
// client that presents one its CA signed; without one, or with another CA's, the handshake fails
// and nothing is granted. Bad TLS options are refused before any call.
TEST(EtcdClientTest, MutualTlsLetsOnlyCertifiedClientsHoldTheLease) {
  CKPT_REQUIRE(testing::EtcdServer::Available(), "etcd (Debian's etcd-server)");
  const std::string dir = ckpt::testing::TestCaseDir() + "-certs";
  std::filesystem::create_directories(dir);
  ASSERT_OK_AND_ASSIGN(ckpt::testing::TestCertificates certs,
                       ckpt::testing::MakeTestCertificates(dir));
  const testing::EtcdServerTls tls{certs.server.cert, certs.server.key, certs.ca,
                                   certs.client.cert, certs.client.key};
  testing::EtcdServer server("", &tls);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(absl::StartsWith(server.endpoint(), "https://"));

  EtcdClientOptions options;
  options.endpoints = server.endpoint();
  options.ca_file = certs.ca;
  options.cert_file = certs.client.cert;
  options.key_file = certs.client.key;
  ASSERT_OK_AND_ASSIGN(EtcdClient certified, EtcdClient::Create(options));
  ASSERT_OK_AND_ASSIGN(int64_t lease, certified.GrantLease(absl::Seconds(2)));
  EtcdValue holder;
  ASSERT_OK_AND_ASSIGN(bool created,
                       certified.CreateIfAbsent("/ckpt/writer", "store-a", lease, &holder));
  EXPECT_TRUE(created);

  options.request_timeout = absl::Milliseconds(500);
  // No client certificate, and one from a CA the cluster does not trust.
  const std::vector<const ckpt::testing::CertificateFiles*> others = {nullptr,
                                                                      &certs.foreign_client};
  for (const ckpt::testing::CertificateFiles* client : others) {
    EtcdClientOptions other = options;
    other.cert_file = client == nullptr ? "" : client->cert;
    other.key_file = client == nullptr ? "" : client->key;
    ASSERT_OK_AND_ASSIGN(EtcdClient uncertified, EtcdClient::Create(other));
    EXPECT_THAT(uncertified.GrantLease(absl::Seconds(2)),
                StatusIs(absl::StatusCode::kUnavailable, "no etcd endpoint answered"));
  }

  EtcdClientOptions bad = options;
  bad.key_file = "";
  EXPECT_THAT(EtcdClient::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument, "key_file"));
  bad = options;
  bad.ca_file = dir + "/missing.pem";
  EXPECT_THAT(EtcdClient::Create(bad), StatusIs(absl::StatusCode::kNotFound, "missing.pem"));
  bad = options;
  bad.endpoints = "http://127.0.0.1:2379";
  EXPECT_THAT(EtcdClient::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument, "https://"));
}

TEST(EtcdClientTest, NoLiveEndpointIsUnavailableNamingThem) {
  EtcdClientOptions options;
  options.endpoints = absl::StrCat("http://127.0.0.1:", testing::UnusedLoopbackPort());
  options.request_timeout = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(EtcdClient etcd, EtcdClient::Create(options));
  EXPECT_THAT(etcd.GrantLease(absl::Seconds(2)),
              StatusIs(absl::StatusCode::kUnavailable, "no etcd endpoint answered"));
  options.endpoints = "127.0.0.1:2379";
  EXPECT_THAT(EtcdClient::Create(options), StatusIs(absl::StatusCode::kInvalidArgument, "http://"));
}

}  // namespace
}  // namespace ckpt::ha
