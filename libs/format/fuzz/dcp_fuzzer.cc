// Fuzz target: the PyTorch Distributed Checkpoint reader (dcp_reader.h) on a directory made from
// the input -- a 4-byte little-endian length L, L bytes of `.metadata`, and the rest as the one
// data file `__0_0.distcp` -- then bundle extraction on whatever it read. Seeds: directories real
// PyTorch writes (libs/format/testdata/dcp_fixtures.py with the seed directory alone).
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/string_view.h"
#include "libs/format/dcp_reader.h"
#include "libs/format/module_state.h"

namespace {

// One directory per process, rewritten for every input.
const std::string& FuzzDir() {
  static const std::string* dir = [] {
    const char* base = getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/dcp-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) abort();
    return new std::string(pattern);
  }();
  return *dir;
}

void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t metadata_size = 0;
  for (int i = 0; i < 4; ++i) metadata_size |= static_cast<uint32_t>(data[i]) << (8 * i);
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  if (metadata_size > rest.size()) return 0;
  const std::string& dir = FuzzDir();
  WriteFile(dir + "/.metadata", rest.substr(0, metadata_size));
  WriteFile(dir + "/__0_0.distcp", rest.substr(metadata_size));
  absl::StatusOr<ckpt::DcpCheckpoint> read = ckpt::ReadDcpDirectory(dir);
  if (read.ok()) (void)ckpt::ExtractCheckpointBundle(read->root);
  return 0;
}
