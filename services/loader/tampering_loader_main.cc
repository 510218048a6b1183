// tampering_loader: a loader server for tests of checksums to the consumer. It serves a local
// store exactly as //services/loader does, except that it damages chosen bytes on their way out,
// after the loader took their checksums -- what a flipped bit between loader and consumer looks
// like to a client. Never deploy it; it is testonly.
//
//   tampering_loader --store_dir=DIR --port_file=FILE --flips=STREAM:TENSOR:OFFSET,...
//
// STREAM counts the server's Load and Export streams from 0; TENSOR is a Load tensor_index, or
// "file" for an Export; OFFSET is the byte in that tensor (or file) whose bit OFFSET % 8 flips.
// Streams no flip names go out intact. Serves plaintext on 127.0.0.1 until killed.

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "libs/io/atomic_file.h"
#include "libs/rpc/grpc_server.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "services/loader/loader_service.h"

ABSL_FLAG(std::string, store_dir, "", "The RocksDB store to serve.");
ABSL_FLAG(std::string, port_file, "", "Where the port is written once serving.");
ABSL_FLAG(std::string, flips, "", "STREAM:TENSOR|file:OFFSET,... bytes to damage.");

namespace ckpt {
namespace {

using Piece = LoaderServiceOptions::OutgoingPiece;

absl::StatusOr<std::vector<Piece>> ParseFlips(const std::string& text) {
  std::vector<Piece> flips;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    Piece flip;
    flip.export_file = parts.size() == 3 && parts[1] == "file";
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &flip.stream) ||
        !(flip.export_file || absl::SimpleAtoi(parts[1], &flip.tensor_index)) ||
        !absl::SimpleAtoi(parts[2], &flip.offset)) {
      return absl::InvalidArgumentError(absl::StrCat("bad --flips entry '", item, "'"));
    }
    flips.push_back(flip);
  }
  return flips;
}

int Run() {
  absl::StatusOr<std::vector<Piece>> flips = ParseFlips(absl::GetFlag(FLAGS_flips));
  if (!flips.ok()) {
    std::cerr << "tampering_loader: " << flips.status() << "\n";
    return 2;
  }
  StoreOptions store_options;
  store_options.db_path = absl::GetFlag(FLAGS_store_dir);
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(store_options);
  if (!store.ok()) {
    std::cerr << "tampering_loader: " << store.status() << "\n";
    return 1;
  }
  LoaderServiceOptions options;
  options.tamper_for_testing = [flips = *flips](const Piece& piece, absl::Span<char> bytes) {
    for (const Piece& flip : flips) {
      if (flip.stream == piece.stream && flip.export_file == piece.export_file &&
          (flip.export_file || flip.tensor_index == piece.tensor_index) &&
          flip.offset >= piece.offset &&
          flip.offset < piece.offset + static_cast<int64_t>(bytes.size())) {
        bytes[flip.offset - piece.offset] ^= static_cast<char>(1 << (flip.offset % 8));
        std::cerr << "tampering_loader: flipped stream " << flip.stream << " "
                  << (flip.export_file ? std::string("file")
                                       : absl::StrCat("tensor ", flip.tensor_index))
                  << " byte " << flip.offset << std::endl;
      }
    }
  };
  absl::StatusOr<std::unique_ptr<LoaderService>> service =
      LoaderService::Create(store->get(), options);
  if (!service.ok()) {
    std::cerr << "tampering_loader: " << service.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start({}, {{service->get(), v1::Loader::service_full_name()}});
  if (!server.ok()) {
    std::cerr << "tampering_loader: " << server.status() << "\n";
    return 1;
  }
  if (absl::Status written = WriteFileAtomically(absl::GetFlag(FLAGS_port_file),
                                                 absl::StrCat((*server)->port(), "\n"));
      !written.ok()) {
    std::cerr << "tampering_loader: " << written << "\n";
    return 1;
  }
  (*server)->Wait();
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ckpt::Run();
}
