#include "libs/ddp/distributed_sampler.h"

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "c10/util/Exception.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/testing/python_runner.h"

namespace ckpt::ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Config {
  int64_t n;
  int world;
  bool shuffle;
  uint64_t seed;
  int64_t epoch;
  bool drop_last;
  std::vector<int64_t> blocks = {};  // set_block_sizes; empty: none.
};

std::string Describe(const Config& c) {
  std::ostringstream out;
  out << "n=" << c.n << " world=" << c.world << " shuffle=" << c.shuffle << " seed=" << c.seed
      << " epoch=" << c.epoch << " drop_last=" << c.drop_last << " blocks=" << c.blocks.size();
  return out.str();
}

// Parses the script's "CONFIG RANK: i0 i1 ..." lines.
std::map<std::pair<int, int>, std::vector<int64_t>> ParseReference(const std::string& output) {
  std::map<std::pair<int, int>, std::vector<int64_t>> indices;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream head(line.substr(0, colon));
    int config = -1;
    int rank = -1;
    if (!(head >> config >> rank)) continue;
    std::istringstream tail(line.substr(colon + 1));
    std::vector<int64_t>& values = indices[{config, rank}];
    for (int64_t value; tail >> value;) values.push_back(value);
  }
  return indices;
}

TEST(DistributedSamplerTest, IndicesEqualPyTorchDistributedSamplerForEveryRank) {
  const std::vector<Config> configs = {
      {10, 3, true, 0, 0, false},    // uneven: padded from the start
      {10, 3, true, 0, 0, true},     // uneven: tail dropped
      {10, 3, false, 0, 0, false},   // no shuffle, padded
      {12, 4, true, 42, 3, false},   // even split, another seed and epoch
      {1000, 8, true, 7, 1, false},  // large enough for randperm's general path
      {5, 8, true, 1, 0, false},     // fewer samples than ranks: padding repeats the list
      {3, 4, true, 7, 2, true},      // fewer samples than ranks with drop_last: nothing
      {7, 2, false, 0, 5, true},     // no shuffle, drop_last
      {1, 1, true, 123, 9, false},   // single rank, single sample
      {0, 2, true, 0, 0, false},     // empty dataset
      // Shuffled by blocks (shards): uneven blocks, an empty one, padding, drop_last, 1 block.
      {23, 2, true, 5, 0, false, {7, 0, 9, 4, 3}},
      {23, 3, true, 5, 2, true, {7, 0, 9, 4, 3}},
      {10, 3, false, 0, 0, false, {4, 6}},
      {300, 4, true, 9, 1, false, {100, 100, 100}},
      {6, 2, true, 1, 0, false, {6}},
  };
  std::string args;
  for (const Config& c : configs) {
    args += std::to_string(c.n) + "," + std::to_string(c.world) + "," + std::to_string(c.shuffle) +
            "," + std::to_string(c.seed) + "," + std::to_string(c.epoch) + "," +
            std::to_string(c.drop_last);
    for (size_t b = 0; b < c.blocks.size(); ++b) {
      args += (b == 0 ? "," : "+") + std::to_string(c.blocks[b]);
    }
    args += " ";
  }
  const auto reference = ParseReference(ckpt::testing::RunPythonOrAddFailure(
      "libs/ddp/testdata/distributed_sampler_reference.py", args));
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    int64_t total = 0;
    for (int rank = 0; rank < c.world; ++rank) {
      auto it = reference.find({static_cast<int>(i), rank});
      ASSERT_NE(it, reference.end()) << "no Python output for " << Describe(c) << " rank " << rank;
      DistributedSampler sampler(c.n, rank, c.world, c.shuffle, c.seed, c.drop_last);
      if (!c.blocks.empty()) sampler.set_block_sizes(c.blocks);
      sampler.set_epoch(c.epoch);
      EXPECT_EQ(sampler.EpochIndices(), it->second) << Describe(c) << " rank " << rank;
      EXPECT_EQ(sampler.num_samples(), static_cast<int64_t>(it->second.size())) << Describe(c);
      EXPECT_EQ(sampler.total_size(), sampler.num_samples() * c.world) << Describe(c);
      total += static_cast<int64_t>(it->second.size());
    }
    EXPECT_EQ(total,
              DistributedSampler(c.n, 0, c.world, c.shuffle, c.seed, c.drop_last).total_size())
        << Describe(c);
  }
}

TEST(DistributedSamplerTest, DifferentEpochsShuffleDifferently) {
  DistributedSampler sampler(100, 0, 1, /*shuffle=*/true, /*seed=*/5);
  const std::vector<int64_t> epoch0 = sampler.EpochIndices();
  sampler.set_epoch(1);
  EXPECT_NE(sampler.EpochIndices(), epoch0);
  sampler.set_epoch(0);
  EXPECT_EQ(sampler.EpochIndices(), epoch0);
}

TEST(DistributedSamplerTest, NextBatchWalksTheEpochAndStopsAtItsEnd) {
  DistributedSampler sampler(10, 1, 2, /*shuffle=*/false);
  EXPECT_THAT(sampler.NextBatch(2), ElementsAre(1, 3));
  EXPECT_EQ(sampler.position(), 2);
  EXPECT_THAT(sampler.NextBatch(2), ElementsAre(5, 7));
  EXPECT_THAT(sampler.NextBatch(2), ElementsAre(9));
  EXPECT_EQ(sampler.position(), 5);
  EXPECT_THAT(sampler.NextBatch(2), IsEmpty());
  sampler.set_epoch(1);
  EXPECT_EQ(sampler.position(), 0);
  EXPECT_THAT(sampler.NextBatch(1), ElementsAre(1));
}

TEST(DistributedSamplerTest, SetPositionOnAFreshSamplerResumesWithTheSameRemainingIndices) {
  for (int64_t consumed : {0, 1, 7, 13, 18}) {  // num_samples() is 18
    DistributedSampler original(53, 2, 3, /*shuffle=*/true, /*seed=*/11);
    original.set_epoch(4);
    std::vector<int64_t> taken;
    while (static_cast<int64_t>(taken.size()) < consumed) {
      const std::vector<int64_t> batch = original.NextBatch(3);
      ASSERT_FALSE(batch.empty());
      taken.insert(taken.end(), batch.begin(), batch.end());
    }
    taken.resize(static_cast<size_t>(consumed));
    original.set_position(consumed);  // a checkpoint stores how many were consumed
    std::vector<int64_t> rest_original;
    for (auto b = original.NextBatch(4); !b.empty(); b = original.NextBatch(4)) {
      rest_original.insert(rest_original.end(), b.begin(), b.end());
    }

    DistributedSampler resumed(53, 2, 3, /*shuffle=*/true, /*seed=*/11);
    resumed.set_epoch(4);
    resumed.set_position(consumed);
    EXPECT_EQ(resumed.position(), consumed);
    std::vector<int64_t> rest_resumed;
    for (auto b = resumed.NextBatch(4); !b.empty(); b = resumed.NextBatch(4)) {
      rest_resumed.insert(rest_resumed.end(), b.begin(), b.end());
    }
    EXPECT_EQ(rest_resumed, rest_original) << "consumed " << consumed;
    std::vector<int64_t> whole = taken;
    whole.insert(whole.end(), rest_resumed.begin(), rest_resumed.end());
    EXPECT_EQ(whole, resumed.EpochIndices()) << "consumed " << consumed;
  }
}

TEST(DistributedSamplerTest, ABlockShuffleKeepsEachRanksBlocksTogether) {
  // 4 blocks of 50: a rank's 100 indices change block at most 3 times (4 runs), each block's
  // indices once per epoch across the ranks.
  for (int rank = 0; rank < 2; ++rank) {
    DistributedSampler sampler(200, rank, 2, /*shuffle=*/true, /*seed=*/3);
    sampler.set_block_sizes({50, 50, 50, 50});
    sampler.set_epoch(1);
    const std::vector<int64_t> indices = sampler.EpochIndices();
    int runs = 1;
    for (size_t i = 1; i < indices.size(); ++i) runs += indices[i] / 50 != indices[i - 1] / 50;
    EXPECT_EQ(runs, 4) << "rank " << rank;
  }
}

TEST(DistributedSamplerTest, PeekShowsTheNextBatchWithoutTakingIt) {
  DistributedSampler sampler(10, 0, 2, /*shuffle=*/false);
  EXPECT_THAT(sampler.Peek(2), ElementsAre(0, 2));
  EXPECT_THAT(sampler.NextBatch(2), ElementsAre(0, 2));
  EXPECT_THAT(sampler.Peek(9), ElementsAre(4, 6, 8));
  sampler.set_position(5);
  EXPECT_THAT(sampler.Peek(1), IsEmpty());
}

TEST(DistributedSamplerTest, RejectsInvalidArguments) {
  DistributedSampler sampler(10, 0, 2);
  try {
    sampler.set_position(6);
    ADD_FAILURE() << "set_position past the end did not throw";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("position must be in [0, num_samples()=5]"));
  }
  EXPECT_THROW(sampler.set_position(-1), c10::Error);
  EXPECT_THROW(sampler.NextBatch(0), c10::Error);
  EXPECT_THROW(DistributedSampler(10, 2, 2), c10::Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), c10::Error);
  EXPECT_THROW(DistributedSampler(-1, 0, 1), c10::Error);
  EXPECT_THROW(sampler.set_block_sizes({5, 4}), c10::Error);    // sums to 9, not 10
  EXPECT_THROW(sampler.set_block_sizes({11, -1}), c10::Error);  // negative
}

}  // namespace
}  // namespace ckpt::ddp
