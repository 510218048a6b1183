// Writes seed inputs for the store's and the wire's fuzz targets into DIR, from real files:
// real PyTorch (libs/format/fuzz/make_seeds.py, /usr/bin/python3) writes state dicts, a training
// bundle (Adam + StepLR), views and dtypes and safetensors; they are imported into a real
// RocksDB store as `ckpt import` does, and what the store then serves is written out:
//
//   make_seeds DIR --kind=manifest --torch_seeds=make_seeds.py
//       DIR/NAME.manifest: each version's ckpt.v1.Manifest, serialized (manifest_fuzzer).
//   make_seeds DIR --kind=tensor_data --torch_seeds=make_seeds.py
//       DIR/NAME.*: DownloadResponse / LoadResponse messages as the services put them on the wire
//       (the manifest message, and TensorDataResponse of every chunk), each behind one byte that
//       tensor_data_fuzzer reads as its slice split (tensor_data_fuzzer).
//
// Nothing is committed: the seeds are regenerated, deterministically, on every run.
#include <dirent.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/byte_buffer.h"
#include "libs/rpc/tensor_data_message.h"
#include "libs/store/checkpoint_import.h"
#include "libs/store/rocksdb_checkpoint_store.h"
#include "libs/store/version_ref.h"
#include "proto/ckpt/v1/loader.pb.h"

namespace ckpt {
namespace {

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return static_cast<bool>(out);
}

std::string BufferBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// The split byte spreads seeds over 1..4 slices (tensor_data_fuzzer.cc).
std::string Seed(int split, const std::string& message) {
  return std::string(1, static_cast<char>(split)) + message;
}

int Run(const std::string& out, const std::string& kind, const std::string& torch_seeds) {
  char scratch_template[] = "/tmp/ckpt_store_seeds.XXXXXX";
  const char* tmp_env = std::getenv("TEST_TMPDIR");
  std::string scratch_pattern =
      tmp_env ? absl::StrCat(tmp_env, "/store_seeds.XXXXXX") : std::string(scratch_template);
  if (::mkdtemp(scratch_pattern.data()) == nullptr) {
    std::cerr << "make_seeds: cannot create a scratch directory\n";
    return 1;
  }
  const std::string scratch = scratch_pattern;
  const std::string torch_dir = scratch + "/torch";
  const std::string command =
      absl::StrCat("/usr/bin/python3 '", torch_seeds, "' '", torch_dir, "' >/dev/null");
  if (std::system(command.c_str()) != 0) {
    std::cerr << "make_seeds: " << command << " failed\n";
    return 1;
  }
  StoreOptions options;
  options.db_path = scratch + "/store";
  absl::StatusOr<std::unique_ptr<RocksDbCheckpointStore>> store =
      RocksDbCheckpointStore::Open(options);
  if (!store.ok()) {
    std::cerr << "make_seeds: " << store.status() << "\n";
    return 1;
  }
  std::vector<std::string> files;
  DIR* dir = ::opendir(torch_dir.c_str());
  while (dirent* entry = dir ? ::readdir(dir) : nullptr) {
    const std::string name = entry->d_name;
    if (absl::EndsWith(name, ".pt") || absl::EndsWith(name, ".safetensors")) files.push_back(name);
  }
  if (dir) ::closedir(dir);
  std::sort(files.begin(), files.end());
  int written = 0;
  for (const std::string& file : files) {
    const std::string model = file.substr(0, file.find('.'));
    absl::StatusOr<ImportResult> imported =
        ImportCheckpointFile(**store, torch_dir + "/" + file, model);
    if (!imported.ok()) {
      std::cerr << "make_seeds: importing " << file << ": " << imported.status() << "\n";
      return 1;
    }
    absl::StatusOr<std::unique_ptr<VersionReader>> reader =
        (*store)->OpenVersion(MakeVersionRef(model, 1));
    if (!reader.ok()) {
      std::cerr << "make_seeds: " << reader.status() << "\n";
      return 1;
    }
    const v1::Manifest& manifest = (*reader)->manifest();
    bool ok = true;
    if (kind == "manifest") {
      ok = WriteFile(absl::StrCat(out, "/", model, ".manifest"), manifest.SerializeAsString());
      ++written;
    } else {
      v1::DownloadResponse download;
      *download.mutable_manifest() = manifest;
      v1::LoadResponse load;
      *load.mutable_manifest() = manifest;
      ok = WriteFile(absl::StrCat(out, "/", model, ".download_manifest"),
                     Seed(0, download.SerializeAsString())) &&
           WriteFile(absl::StrCat(out, "/", model, ".load_manifest"),
                     Seed(1, load.SerializeAsString()));
      written += 2;
      // Every tensor's chunks as the services send them (at most 64 KiB of each: enough bytes
      // for the decoder, a corpus that stays small).
      const int model_count = manifest.tensors_size();
      for (int i = 0; ok && i < model_count + manifest.state_tensors_size(); ++i) {
        const v1::TensorMeta& meta =
            i < model_count ? manifest.tensors(i) : manifest.state_tensors(i - model_count);
        absl::Status read = (*reader)->ReadTensorChunks(
            meta, [&](int64_t offset, absl::string_view bytes) -> absl::Status {
              const absl::string_view sent = bytes.substr(0, 64 << 10);
              const grpc::ByteBuffer message = TensorDataResponse(i, offset, sent, nullptr);
              ok = ok && WriteFile(absl::StrCat(out, "/", model, ".t", i, ".at", offset),
                                   Seed(i % 4, BufferBytes(message)));
              ++written;
              return absl::OkStatus();
            });
        if (!read.ok()) {
          std::cerr << "make_seeds: " << read << "\n";
          return 1;
        }
      }
    }
    if (!ok) {
      std::cerr << "make_seeds: cannot write into " << out << "\n";
      return 1;
    }
  }
  std::cout << "make_seeds: " << written << " " << kind << " seeds from " << files.size()
            << " PyTorch files in " << out << "\n";
  store->reset();
  std::error_code ignored;  // a scratch directory left behind is harmless.
  std::filesystem::remove_all(scratch, ignored);
  return written > 0 ? 0 : 1;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  std::string out, kind, torch_seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--kind=")) {
      kind = arg.substr(7);
    } else if (absl::StartsWith(arg, "--torch_seeds=")) {
      torch_seeds = arg.substr(14);
    } else {
      out = arg;
    }
  }
  if (out.empty() || (kind != "manifest" && kind != "tensor_data") || torch_seeds.empty()) {
    std::cerr << "usage: make_seeds DIR --kind=manifest|tensor_data --torch_seeds=make_seeds.py\n";
    return 2;
  }
  return ckpt::Run(out, kind, torch_seeds);
}
