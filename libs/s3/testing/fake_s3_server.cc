#include "libs/s3/testing/fake_s3_server.h"

#include <curl/curl.h>
#include <sys/stat.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ckpt::testing {
namespace {

size_t AppendTo(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

}  // namespace

FakeS3Server::FakeS3Server(std::vector<std::string> flags, bool tls, std::string dir) : tls_(tls) {
  static std::atomic<int> instance{0};
  dir_ = dir.empty() ? absl::StrCat(TestCaseDir(), "-fake", instance++) : std::move(dir);
  EXPECT_EQ(mkdir(dir_.c_str(), 0755), 0) << dir_;
  process_ = std::make_unique<ChildProcess>("/usr/bin/python3", dir_);
  const std::string port_file = dir_ + "/port";
  flags.insert(flags.begin(),
               {RunfilesPath("libs/s3/testdata/fake_s3_server.py"), "--port_file=" + port_file});
  EXPECT_TRUE(process_->Start(flags));
  port_ = process_->WaitForPort(port_file, absl::Seconds(30));
  EXPECT_GT(port_, 0) << process_->stderr_text();
}

std::string FakeS3Server::endpoint() const {
  return absl::StrCat(tls_ ? "https" : "http", "://127.0.0.1:", port_);
}

s3::S3ClientOptions FakeS3Server::ClientOptions() const {
  s3::S3ClientOptions options;
  options.endpoint = endpoint();
  options.access_key = kAccessKey;
  options.secret_key = kSecretKey;
  options.bucket = kBucket;
  options.initial_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(20);
  return options;
}

void FakeS3Server::Fault(const nlohmann::json& fault) { Control("/_control/fault", fault.dump()); }

nlohmann::json FakeS3Server::Log() { return nlohmann::json::parse(Control("/_control/log")); }

nlohmann::json FakeS3Server::OpenUploads() {
  return nlohmann::json::parse(Control("/_control/uploads"));
}

int FakeS3Server::Count(const std::string& method, const std::string& query_name) {
  int n = 0;
  for (const nlohmann::json& entry : Log()) {
    if (entry["method"] == method && (query_name.empty() || entry["query"].contains(query_name))) {
      ++n;
    }
  }
  return n;
}

std::string FakeS3Server::Control(const std::string& path, const std::string& post_body) {
  const std::string url = endpoint() + path;
  CURL* curl = curl_easy_init();
  std::string out;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendTo);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out);
  // The control endpoints are the test's own; with TLS the fake's certificate is a test one.
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  if (!post_body.empty()) curl_easy_setopt(curl, CURLOPT_POSTFIELDS, post_body.c_str());
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  EXPECT_EQ(code, CURLE_OK) << url << ": " << curl_easy_strerror(code);
  return out;
}

}  // namespace ckpt::testing
