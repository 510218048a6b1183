#ifndef CKPT_SERVICES_TRAINER_RANK_STORES_H_
#define CKPT_SERVICES_TRAINER_RANK_STORES_H_

// Where a trainer rank's checkpoints go: the binary's decision, made here, so that libs/train
// receives a CheckpointStore& and never knows where it runs.
//
//  - With a store address every rank is a client of that store service.
//  - Otherwise the store is embedded: RocksDB admits one process, so rank 0 opens the directory
//    and, when there are other ranks, lends it to them through a StoreService on an ephemeral
//    port with a random bearer token; rank 0 sends "HOST:PORT TOKEN" over the process group.
//    When the ranks meet on a loopback address (one node) the service listens on 127.0.0.1
//    only. Across machines it listens on every address with TLS, using a certificate made for
//    the run (libs/server/run_certificate.h) for the master address; the certificate (not its key)
//    travels with the address and token, and the other ranks trust exactly it.
//  - Audit: rank 0's own changes to the embedded store are recorded as
//    "trainer:<user>@<host>" (peer "local"); the other ranks' reach it through the StoreService,
//    which records them as its callers. With a store address the service audits every rank.
//
// Example:
//   RankStoreOptions options;
//   options.store_dir = "ckpt-data";
//   ASSIGN_OR_RETURN(std::unique_ptr<RankStores> stores, OpenRankStores(options, group));
//   RunTrainingRank(config, group, stores->store(), &control);

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libs/ddp/process_group.h"
#include "libs/rpc/client_channel.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt {

struct RankStoreOptions {
  // HOST:PORT of a store service; empty: the embedded store in store_dir.
  std::string store_address;
  // Bearer token for store_address (empty: none).
  std::string store_auth_token;
  // TLS towards store_address (plaintext when ca_file is empty).
  ClientTlsOptions store_tls;
  // The embedded store's directory (created if missing).
  std::string store_dir = "ckpt-data";
  // The address other ranks reach rank 0 on (the rendezvous master address).
  std::string master_addr = "127.0.0.1";
};

// Owns whatever this rank's store needs (a RocksDB store and the server lending it, or a
// client); destroying it shuts the server down. Thread-safe as CheckpointStore is.
class RankStores {
 public:
  virtual ~RankStores() = default;
  virtual CheckpointStore& store() = 0;
  // The directory or address, for people: "/abs/ckpt-data" or "host:port".
  virtual const std::string& location() const = 0;
};

// Opens this rank's store; a collective over `group` when the store is embedded and there are
// several ranks (every rank must call it). Errors from RocksDB, from starting the server, from
// connecting, and UNAVAILABLE from the broadcast.
absl::StatusOr<std::unique_ptr<RankStores>> OpenRankStores(const RankStoreOptions& options,
                                                           const ddp::ProcessGroupHandle& group);

}  // namespace ckpt

#endif  // CKPT_SERVICES_TRAINER_RANK_STORES_H_
