#include "libs/ddp/tcp_store_node_rendezvous.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libs/ddp/local_launcher.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

namespace ckpt::ddp {
namespace {

std::vector<uint8_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string Text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

class StoreNodeRendezvous final : public NodeRendezvous {
 public:
  StoreNodeRendezvous(NodeRendezvousOptions options, c10::intrusive_ptr<c10d::TCPStore> store)
      : options_(std::move(options)), store_(std::move(store)) {}

  absl::StatusOr<int> Join(int attempt) override {
    try {
      const std::string joined = Key(attempt, "joined");
      store_->add(joined, 1);
      const absl::Time deadline = absl::Now() + options_.timeout;
      int64_t in = 0;
      while ((in = store_->add(joined, 0)) < options_.nnodes) {
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(absl::StrCat(in, " of ", options_.nnodes,
                                                          " nodes joined within ",
                                                          absl::FormatDuration(options_.timeout)));
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
      const std::string port_key = Key(attempt, "port");
      if (options_.node_rank == 0) {
        // A new port every round: the previous round's rank 0 store is gone with its ranks.
        store_->set(port_key, Bytes(std::to_string(ddp::PickFreeLoopbackPort())));
      }
      store_->wait({port_key},
                   std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout)));
      int port = 0;
      if (!absl::SimpleAtoi(Text(store_->get(port_key)), &port)) {
        return absl::InternalError("node 0 published a malformed port");
      }
      return port;
    } catch (const std::exception& error) {
      return absl::UnavailableError(
          absl::StrCat("the launchers' rendezvous on ", Where(), " failed: ", error.what()));
    }
  }

  void ReportFailure(int attempt, const std::string& cause) override {
    try {
      // The first failure of the round is the one the other nodes report.
      store_->compareSet(Key(attempt, "failure"), {},
                         Bytes(absl::StrCat("node ", options_.node_rank, ": ", cause)));
    } catch (const std::exception&) {
      // Node 0 is gone: the other nodes' ranks lost their peers and fail on their own.
    }
  }

  std::string PeerFailure(int attempt) override {
    try {
      const std::string key = Key(attempt, "failure");
      if (!store_->check({key})) return "";
      std::string failure = Text(store_->get(key));
      if (failure.rfind(absl::StrCat("node ", options_.node_rank, ":"), 0) == 0) return "";
      return failure;
    } catch (const std::exception& error) {
      return absl::StrCat("lost the launchers' rendezvous on ", Where(), " (", error.what(), ")");
    }
  }

  void Done(int attempt, bool succeeded) override {
    try {
      if (succeeded)
        store_->set(Key(attempt, "succeeded"), Bytes(std::to_string(options_.node_rank)));
      store_->add(Key(attempt, "done"), 1);
    } catch (const std::exception&) {
    }
  }

  bool AnyNodeSucceeded(int attempt) override {
    try {
      return store_->check({Key(attempt, "succeeded")});
    } catch (const std::exception&) {
      return false;
    }
  }

  void Leave(int attempt, absl::Duration timeout) override {
    if (options_.node_rank != 0) return;
    const absl::Time deadline = absl::Now() + timeout;
    try {
      while (store_->add(Key(attempt, "done"), 0) < options_.nnodes && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(50));
      }
    } catch (const std::exception&) {
    }
  }

 private:
  static std::string Key(int attempt, const char* name) {
    return absl::StrCat("round/", attempt, "/", name);
  }
  std::string Where() const {
    return absl::StrCat(options_.master_addr, ":", options_.master_port);
  }

  const NodeRendezvousOptions options_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NodeRendezvous>> ConnectNodes(const NodeRendezvousOptions& options) {
  if (options.nnodes < 2 || options.node_rank < 0 || options.node_rank >= options.nnodes ||
      options.master_port <= 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(
        "the launchers' rendezvous needs nnodes >= 2, 0 <= node_rank < nnodes and a master port");
  }
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.master_port);
  store_options.isServer = options.node_rank == 0;
  store_options.waitWorkers = false;  // Join counts the launchers, round by round.
  store_options.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout));
  try {
    return std::make_unique<StoreNodeRendezvous>(
        options, c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options));
  } catch (const std::exception& error) {
    return absl::UnavailableError(absl::StrCat(
        options.node_rank == 0 ? "cannot serve" : "cannot reach", " the launchers' rendezvous on ",
        options.master_addr, ":", options.master_port, ": ", error.what()));
  }
}

}  // namespace ckpt::ddp
