// console: the registry's HTTP/JSON API (/api/v1/..., libs/console/console_api.h) over a
// checkpoint_store service, for callers without a gRPC client (curl, a browser).
//
//   bazel run //services/console -- --store=127.0.0.1:50051
//   curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8080/api/v1/models
//
// The console holds no rights: each request goes to the store with the caller's own bearer token
// ("Authorization: Bearer ..."), so the store's identities and scopes decide what the caller sees
// (--store_auth_token_file is refused). HTTPS with --tls_cert_file / --tls_key_file (the gRPC
// servers' flags, rotated files re-read); with --tls_client_ca_file every browser must present a
// client certificate, and a caller without a token is the identity the store lists for that
// certificate: the console forwards the certificate's names with its own certificate
// (--store_tls_cert_file), which the store lists as a forwarding front end
// (libs/auth/access_policy.h). Plain HTTP only on a loopback address.
//
// Prints "console serving STORE on http(s)://ADDRESS/" once serving (with --port_file, the port
// is written there after that line). SIGINT / SIGTERM stop it (requests in flight finish), exit
// status 0. Bad flags or TLS files exit 2; an address that cannot be bound exits 1.

#include <signal.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "httplib.h"
#include "libs/client/open_store.h"
#include "libs/console/caller_stores.h"
#include "libs/console/console_api.h"
#include "libs/console/https_tls.h"
#include "libs/rpc/grpc_server.h"
#include "libs/server/server_main.h"
#include "libs/server/service_flags.h"
#include "services/console/web_assets.h"

CKPT_DEFINE_STORE_CLIENT_FLAGS("");
CKPT_DEFINE_LISTEN_FLAGS(, "127.0.0.1:8080");
CKPT_DEFINE_SERVER_TLS_FLAGS();
CKPT_DEFINE_SHUTDOWN_GRACE_FLAG();
ABSL_FLAG(int, max_watches, ckpt::ConsoleApi::kDefaultMaxWatches,
          "Pages following a model (live updates) open at once at most; each holds one of the "
          "server's threads. One more is answered 429. Default 64.");
ABSL_FLAG(std::string, web_dir, "",
          "Serve the page from this directory (index.html, app.js, app.css, favicon.svg) "
          "instead of the copy built into the binary: services/console/web while working on "
          "the page. 'none': no page, the API only. Default: the built-in copy, whatever the "
          "working directory.");

namespace ckpt {
namespace {

// Threads for requests other than watches.
constexpr size_t kRequestThreads = 8;

int BadFlag(const std::string& message) {
  std::cerr << "console: " << message << "\n";
  return 2;
}

// The token of "Authorization: Bearer TOKEN"; empty when there is none.
std::string BearerToken(const httplib::Request& request) {
  const std::string header = request.get_header_value("Authorization");  // a copy, by value.
  absl::string_view value = header;
  if (!absl::ConsumePrefix(&value, "Bearer ")) return "";
  return std::string(absl::StripAsciiWhitespace(value));
}

// The Content-Type of a page file, by its extension.
const char* ContentTypeOf(absl::string_view name) {
  if (absl::EndsWith(name, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(name, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(name, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(name, ".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

// Every file built into the binary (web_assets.h) at "/NAME", and index.html at "/" too.
void ServeBuiltInPage(httplib::Server& server) {
  for (size_t i = 0; i < console_web::kEmbeddedFileCount; ++i) {
    const console_web::EmbeddedFile& file = console_web::kEmbeddedFiles[i];
    const auto serve = [&file](const httplib::Request&, httplib::Response& response) {
      response.set_content(file.data, file.size, ContentTypeOf(file.name));
    };
    server.Get(absl::StrCat("/", file.name), serve);
    if (absl::string_view(file.name) == "index.html") server.Get("/", serve);
  }
}

int Run() {
  const StoreClientFlags store_flags = CKPT_STORE_CLIENT_FROM_FLAGS();
  if (store_flags.store.empty()) {
    return BadFlag(
        "--store is required: the console sends each caller's token to a checkpoint_store "
        "service, which decides what the caller may see");
  }
  if (!store_flags.auth_token_file.empty()) {
    return BadFlag(
        "--store_auth_token_file is refused: the console holds no rights of its own; callers "
        "send their tokens with each request");
  }
  absl::StatusOr<StoreLocation> location = StoreLocationFromFlags(store_flags);
  if (!location.ok()) return BadFlag(std::string(location.status().message()));
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return BadFlag("--listen must be HOST:PORT, got '" + listen + "'");
  }
  const std::string host = listen.substr(0, colon);
  const ServerTlsOptions tls_options{
      absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
      absl::GetFlag(FLAGS_tls_client_ca_file), absl::GetFlag(FLAGS_tls_reload_interval)};
  const bool https = !tls_options.cert_file.empty() || !tls_options.key_file.empty();
  std::unique_ptr<HttpsTls> tls;
  if (https) {
    absl::StatusOr<std::unique_ptr<HttpsTls>> loaded = HttpsTls::Load(tls_options);
    if (!loaded.ok()) return BadFlag(std::string(loaded.status().message()));
    tls = *std::move(loaded);
  } else if (!tls_options.client_ca_file.empty()) {
    return BadFlag("--tls_client_ca_file needs --tls_cert_file and --tls_key_file (HTTPS)");
  } else if (!IsLoopbackHost(host)) {
    return BadFlag("--listen=" + listen +
                   ": without --tls_cert_file the console serves plain HTTP, so only on a "
                   "loopback address (127.0.0.1); give it a certificate to serve other machines");
  }
  const int max_watches = absl::GetFlag(FLAGS_max_watches);
  if (max_watches < 1) return BadFlag("--max_watches must be at least 1");
  const sigset_t stop_signals = BlockStopSignals();

  ClientOptions options;
  options.address = location->address;
  options.tls = location->tls;
  CallerStores stores(options);
  const ConsoleApi api(
      [&stores](const CallerCredentials& caller) { return stores.For(caller); }, location->address,
      [&stores](const CallerCredentials& caller, const v1::WhoAmIRequest& request) {
        return stores.WhoAmI(caller, request);
      },
      max_watches);

  std::unique_ptr<httplib::Server> server_holder;
  if (tls != nullptr) {
    server_holder = std::make_unique<httplib::SSLServer>(
        [&tls](SSL_CTX& context) { return tls->Configure(context); });
  } else {
    server_holder = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *server_holder;
  if (!server.is_valid()) {
    std::cerr << "console: cannot set up TLS\n";
    return 2;
  }
  // A thread per open watch, and as many again as cpp-httplib's default for everything else, so
  // that the API still answers while every watch is open.
  server.new_task_queue = [max_watches] {
    return new httplib::ThreadPool(static_cast<size_t>(max_watches) + kRequestThreads);
  };
  const std::string scheme = tls != nullptr ? "https" : "http";
  server.set_default_headers({{"Cache-Control", "no-store"},
                              {"X-Content-Type-Options", "nosniff"},
                              {"Content-Security-Policy", "default-src 'self'"}});
  // Set before the server stops, so that open watches end within a second.
  std::atomic<bool> stopping{false};
  const auto handle = [&api, &stopping, &scheme](const httplib::Request& request,
                                                 httplib::Response& response) {
    ApiRequest call;
    call.method = request.method;
    call.path = request.path;
    for (const auto& [name, value] : request.params) call.query.emplace(name, value);
    call.body = request.body;
    call.content_type = request.get_header_value("Content-Type");
    call.bearer_token = BearerToken(request);
    call.certificate_names = PeerCertificateNames(request.ssl);
    call.origin = request.get_header_value("Origin");
    call.own_origin = absl::StrCat(scheme, "://", request.get_header_value("Host"));
    call.fetch_site = request.get_header_value("Sec-Fetch-Site");
    if (ConsoleApi::IsWatch(call)) {
      // An EventSource reconnecting says where it stopped.
      if (call.query.count("after") == 0 && request.has_header("Last-Event-ID")) {
        call.query.emplace("after", request.get_header_value("Last-Event-ID"));
      }
      absl::StatusOr<ConsoleApi::OpenedWatch> opened = api.OpenWatch(call);
      if (!opened.ok()) {
        const ApiResponse refused = ErrorResponse(opened.status());
        response.status = refused.status;
        response.set_content(refused.body, refused.content_type.c_str());
        return;
      }
      auto watch = std::make_shared<ConsoleApi::OpenedWatch>(*std::move(opened));
      response.set_chunked_content_provider(
          "text/event-stream", [watch, &stopping](size_t, httplib::DataSink& sink) {
            ConsoleApi::StreamWatch(
                std::move(*watch),
                [&sink](absl::string_view chunk) {
                  return sink.is_writable() && sink.write(chunk.data(), chunk.size());
                },
                [&stopping] { return stopping.load(); });
            sink.done();
            return true;
          });
      return;
    }
    const ApiResponse answer = api.Handle(call);
    response.status = answer.status;
    response.set_content(answer.body, answer.content_type.c_str());
  };
  // The page (services/console/web: static files, no inline script) at "/".
  const std::string web_dir = absl::GetFlag(FLAGS_web_dir);
  if (web_dir == "none") {
    server.Get("/", [](const httplib::Request&, httplib::Response& response) {
      response.set_content(
          "ckpt console: started with --web_dir=none, so no page. The HTTP/JSON API is under "
          "/api/v1/ (e.g. /api/v1/models, with \"Authorization: Bearer TOKEN\"); "
          "docs/console.md lists every endpoint.\n",
          "text/plain; charset=utf-8");
    });
  } else if (web_dir.empty()) {
    ServeBuiltInPage(server);
  } else if (!server.set_mount_point("/", web_dir)) {
    return BadFlag("--web_dir=" + web_dir +
                   " is not a directory (leave it out for the page built into the binary, or "
                   "--web_dir=none for the API only)");
  }
  const char* const kApi = R"(/api/.*)";
  server.Get(kApi, handle);
  server.Post(kApi, handle);
  server.Put(kApi, handle);
  server.Patch(kApi, handle);
  server.Delete(kApi, handle);
  const std::string bind_host =
      host == "localhost" ? "127.0.0.1" : (host == "[::1]" ? "::1" : host);
  const int bound = port == 0 ? server.bind_to_any_port(bind_host)
                              : (server.bind_to_port(bind_host, port) ? port : -1);
  if (bound <= 0) {
    std::cerr << "console: cannot listen on " << listen << "\n";
    return 1;
  }
  std::thread serving([&server] { server.listen_after_bind(); });
  const std::string url = absl::StrCat(scheme, "://", host, ":", bound, "/");
  std::cout << "console serving " << location->address << " on " << url << " (API: " << url
            << "api/v1/models)" << std::endl;
  // The port file comes last: whoever waits for it (a test, a supervisor) may then read the
  // serving line too. The other order raced and lost on a loaded CI machine.
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status written = WritePortFile(port_file, bound); !written.ok()) {
      std::cerr << "console: " << written << "\n";
      server.stop();
      serving.join();
      return 1;
    }
  }
  WaitForStopSignal(stop_signals, "console", absl::GetFlag(FLAGS_shutdown_grace));
  stopping = true;
  server.stop();
  serving.join();
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  ckpt::SetHelpFlagsFile("services/console/main.cc");
  absl::SetProgramUsageMessage(
      "The registry's HTTP/JSON API over a checkpoint_store service:\n"
      "  console --store=HOST:PORT [--listen=127.0.0.1:8080] [--tls_cert_file=PEM "
      "--tls_key_file=PEM [--tls_client_ca_file=PEM]]\n"
      "Each request is sent to the store with the caller's own bearer token, or under mutual "
      "TLS with the names of the caller's client certificate.");
  absl::ParseCommandLine(argc, argv);
  return ckpt::Run();
}
