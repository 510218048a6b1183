// main() for fuzz targets outside libFuzzer: replays seed files, and deterministic mutations of
// them, through LLVMFuzzerTestOneInput. It makes every fuzz target a bounded regression test in
// the ordinary build; a crash, sanitizer report or hang fails it like any test.
//
//   NAME_regression --seed_script=make_seeds.py [--mutations_per_seed=200] [FILE...]
//   NAME_regression --seed_generator=BINARY [--seed_arg=ARG...] [--mutations_per_seed=200]
//
// With --seed_script, runs `/usr/bin/python3 SCRIPT DIR` (real PyTorch writes the seeds into
// DIR, under $TEST_TMPDIR) and replays every file in DIR; FILEs are replayed as they are. With
// --seed_generator, runs `BINARY DIR ARG...` instead (seeds that only our own C++ can write, such
// as the store's manifests of real PyTorch files).

#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void Run(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// Truncations at every power of two and near the end, then random byte flips / overwrites with
// "interesting" values (0, 0xFF, 0x7F, 0x80), seeded per file so runs repeat exactly.
int Mutate(const std::string& seed, int count, uint32_t rng_seed) {
  int runs = 0;
  for (size_t cut = 1; cut < seed.size(); cut *= 2) {
    Run(seed.substr(0, cut));
    Run(seed.substr(0, seed.size() - cut));
    runs += 2;
  }
  std::mt19937 rng(rng_seed);
  const unsigned char interesting[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE};
  for (int i = 0; i < count && !seed.empty(); ++i) {
    std::string mutated = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % mutated.size();
      switch (rng() % 3) {
        case 0:
          mutated[at] = static_cast<char>(mutated[at] ^ (1u << (rng() % 8)));
          break;
        case 1:
          mutated[at] = static_cast<char>(interesting[rng() % sizeof(interesting)]);
          break;
        default:
          mutated[at] = static_cast<char>(rng());
      }
    }
    Run(mutated);
    ++runs;
  }
  return runs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string seed_script;
  std::string seed_generator;
  std::string seed_args;
  int mutations = 200;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seed_script=", 0) == 0) {
      seed_script = arg.substr(14);
    } else if (arg.rfind("--seed_generator=", 0) == 0) {
      seed_generator = arg.substr(17);
    } else if (arg.rfind("--seed_arg=", 0) == 0) {
      seed_args += " '" + arg.substr(11) + "'";
    } else if (arg.rfind("--mutations_per_seed=", 0) == 0) {
      mutations = std::atoi(arg.c_str() + 21);
    } else {
      files.push_back(arg);
    }
  }
  if (!seed_script.empty() || !seed_generator.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string dir = std::string(tmp ? tmp : "/tmp") + "/fuzz_seeds";
    const std::string command =
        "mkdir -p '" + dir + "' && " +
        (seed_generator.empty() ? "/usr/bin/python3 '" + seed_script + "' '" + dir + "'"
                                : "'" + seed_generator + "' '" + dir + "'" + seed_args);
    if (std::system(command.c_str()) != 0) {
      std::cerr << "seed generation failed: " << command << "\n";
      return 1;
    }
    DIR* handle = opendir(dir.c_str());
    while (dirent* entry = handle ? readdir(handle) : nullptr) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") files.push_back(dir + "/" + name);
    }
    if (handle) closedir(handle);
  }
  if (files.empty()) {
    std::cerr << "no seed files: pass FILEs, --seed_script or --seed_generator\n";
    return 1;
  }
  int runs = 0;
  uint32_t rng_seed = 1;
  for (const std::string& file : files) {
    const std::string bytes = ReadFile(file);
    Run(bytes);
    runs += 1 + Mutate(bytes, mutations, rng_seed++);
  }
  std::cout << "replayed " << files.size() << " seeds and " << runs - files.size()
            << " mutations: no crash\n";
  return 0;
}
