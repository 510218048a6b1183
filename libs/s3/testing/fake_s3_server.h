#ifndef CKPT_LIBS_S3_TESTING_FAKE_S3_SERVER_H_
#define CKPT_LIBS_S3_TESTING_FAKE_S3_SERVER_H_

// libs/s3/testdata/fake_s3_server.py (SigV4-checking, in memory, with injectable faults) as a
// child process on 127.0.0.1 and a port it picked, for the tests of the S3 client and of the
// store's S3 chunk backend. Add "//libs/s3:testdata/fake_s3_server.py" to the test's data.
//
//   FakeS3Server server;
//   s3::S3ClientOptions options = server.ClientOptions();
//   server.Fault({{"method", "PUT"}, {"status", 503}, {"count", 1}});
//   ... requests ...
//   EXPECT_EQ(server.Count("PUT"), 2);

#include <memory>
#include <string>
#include <vector>

#include "libs/s3/s3_client.h"
#include "libs/testing/child_process.h"
#include "nlohmann/json.hpp"

namespace ckpt::testing {

class FakeS3Server {
 public:
  // The credentials and bucket the fake accepts by default.
  static constexpr char kBucket[] = "test-bucket";
  static constexpr char kAccessKey[] = "AKIDTEST";
  static constexpr char kSecretKey[] = "test/secret+key";

  // `flags` go to fake_s3_server.py after its port file (e.g. TLS certificate flags with
  // `tls`). Its files go to `dir` (created); by default a directory named after the running
  // test. A failure to start is a test failure; port() is then 0.
  explicit FakeS3Server(std::vector<std::string> flags = {}, bool tls = false,
                        std::string dir = "");

  int port() const { return port_; }
  std::string endpoint() const;  // http(s)://127.0.0.1:PORT
  const std::string& dir() const { return dir_; }

  // Client options for this server: its endpoint, the default credentials and bucket, and
  // millisecond backoffs so retry tests run fast.
  s3::S3ClientOptions ClientOptions() const;

  // Injects a fault (see fake_s3_server.py) into the next matching requests.
  void Fault(const nlohmann::json& fault);
  // The requests served so far, and the multipart uploads still open.
  nlohmann::json Log();
  nlohmann::json OpenUploads();
  // Requests in the log with `method` (and the query parameter `query_name`, if given).
  int Count(const std::string& method, const std::string& query_name = "");

 private:
  // A request to the fake's unsigned /_control/ endpoints; its body.
  std::string Control(const std::string& path, const std::string& post_body = "");

  bool tls_;
  std::string dir_;
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
};

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_S3_TESTING_FAKE_S3_SERVER_H_
