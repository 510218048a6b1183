#ifndef CKPT_LIBS_HA_TESTING_ETCD_SERVER_H_
#define CKPT_LIBS_HA_TESTING_ETCD_SERVER_H_

// A real etcd (Debian's etcd-server, /usr/bin/etcd) as a child process on 127.0.0.1, one member,
// its data in a directory of the test's, for the tests of the writer lease (issue #53).
//
//   CKPT_REQUIRE(EtcdServer::Available(), "etcd (Debian's etcd-server)");
//   EtcdServer etcd;
//   ASSERT_TRUE(etcd.ok());
//   EtcdClientOptions options;  options.endpoints = etcd.endpoint();

#include <memory>
#include <string>

#include "libs/testing/child_process.h"

namespace ckpt::ha::testing {

// TLS for the client port: the server's certificate and key, and the CA whose client
// certificates it requires (--client-cert-auth); the readiness probe presents `client_cert`.
struct EtcdServerTls {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  std::string client_cert_file;
  std::string client_key_file;
};

class EtcdServer {
 public:
  static bool Available();
  // Starts it and waits (up to 20 s) until it answers; with `tls`, on https:// only.
  explicit EtcdServer(std::string dir = "", const EtcdServerTls* tls = nullptr);
  ~EtcdServer();

  bool ok() const { return !endpoint_.empty(); }
  const std::string& endpoint() const { return endpoint_; }  // http(s)://127.0.0.1:PORT
  ckpt::testing::ChildProcess* process() { return process_.get(); }

 private:
  std::unique_ptr<ckpt::testing::ChildProcess> process_;
  std::string endpoint_;
};

// A TCP port on 127.0.0.1 free at the moment of asking (for servers that cannot take port 0 and
// report what they bound, as etcd cannot).
int UnusedLoopbackPort();

}  // namespace ckpt::ha::testing

#endif  // CKPT_LIBS_HA_TESTING_ETCD_SERVER_H_
