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
//
// For tests of a loader fleet (several of these over one store service, --store=HOST:PORT):
//
//   tampering_loader --store=HOST:PORT --port_file=FILE --stall_marker=PATH --stall_tensor=K
//
// The first Load stream of the whole fleet that reaches the bytes of tensor index K creates
// PATH (exclusively; it holds this process's pid) and stalls there until the process is killed:
// a load cut off in flight at a known tensor. Every other stream goes out intact.

#include <fcntl.h>
#include <unistd.h>

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
#include "libs/client/open_store.h"
#include "libs/io/atomic_file.h"
#include "libs/rpc/grpc_server.h"
#include "services/loader/loader_service.h"

ABSL_FLAG(std::string, store_dir, "", "The RocksDB store to serve.");
ABSL_FLAG(std::string, store, "", "Or HOST:PORT of a checkpoint store service to serve.");
ABSL_FLAG(std::string, stall_marker, "", "File the one stalled stream creates (see above).");
ABSL_FLAG(int, stall_tensor, 0, "Tensor index whose first byte the stalled stream stops at.");
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
  StoreLocation location;
  location.address = absl::GetFlag(FLAGS_store);
  location.directory = absl::GetFlag(FLAGS_store_dir);
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = OpenCheckpointStore(location);
  if (!store.ok()) {
    std::cerr << "tampering_loader: " << store.status() << "\n";
    return 1;
  }
  LoaderServiceOptions options;
  const std::string stall_marker = absl::GetFlag(FLAGS_stall_marker);
  const int stall_tensor = absl::GetFlag(FLAGS_stall_tensor);
  options.tamper_for_testing = [flips = *flips, stall_marker, stall_tensor](
                                   const Piece& piece, absl::Span<char> bytes) {
    if (!stall_marker.empty() && !piece.export_file && piece.tensor_index == stall_tensor &&
        piece.offset == 0) {
      // O_EXCL: of all the loaders sharing the marker, exactly one stream stalls.
      const int fd = open(stall_marker.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd >= 0) {
        const std::string pid = absl::StrCat(getpid(), "\n");
        if (write(fd, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size())) _exit(1);
        close(fd);
        std::cerr << "tampering_loader: stalling stream " << piece.stream << " at tensor "
                  << stall_tensor << std::endl;
        for (;;) pause();  // until the test kills this process.
      }
    }
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
