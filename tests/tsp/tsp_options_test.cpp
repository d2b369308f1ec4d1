// The attention backward's memory/communication options: keeping the broadcast shards or the
// gathered K/V from forward changes what is moved and held, never the result.
#include <gtest/gtest.h>

#include <cstring>

#include "block_harness.hpp"

namespace tspemu::tsp::testing {
namespace {

struct OptionRun {
  Results<float> results;
  TrafficCounters traffic;  // rank 0
  ArenaStats arena;         // rank 0
};

OptionRun run_with(bool keep_shards, bool keep_kv) {
  Case c;
  c.D = 4;
  c.NH = 8;
  c.NKV = 4;
  c.B = 2;
  c.S = 32;
  c.keep_attention_shards = keep_shards;
  c.keep_kv = keep_kv;
  const TspShape s = c.shape();
  auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, c.seed));
  const std::size_t n = static_cast<std::size_t>(c.B) * c.S * s.model.hidden;
  auto x = random_tensor<float>(n, 1), dy = random_tensor<float>(n, 2);
  World world({.ranks = c.D});
  Outcome memory;
  OptionRun r;
  r.results = run_tsp(c, world, w.layers[0], x, dy, &memory);
  r.traffic = world.counters(0);
  r.arena = memory.arena[0];
  return r;
}

void expect_bitwise_equal(const Results<float>& a, const Results<float>& b) {
  const auto ta = tensors(a, Block::attention), tb = tensors(b, Block::attention);
  for (std::size_t i = 0; i < ta.size(); ++i)
    EXPECT_EQ(0, std::memcmp(ta[i].second->data(), tb[i].second->data(),
                             ta[i].second->size() * sizeof(float)))
        << ta[i].first;
}

TEST(TspAttentionOptions, KeepingShardsSkipsTheBackwardBroadcastsWithTheSameResult) {
  const OptionRun base = run_with(false, false), kept = run_with(true, false);
  expect_bitwise_equal(base.results, kept.results);
  EXPECT_EQ(base.traffic[CollectiveKind::broadcast].calls, 2u * 4);  // D in forward, D in backward
  EXPECT_EQ(kept.traffic[CollectiveKind::broadcast].calls, 4u);
  EXPECT_GT(kept.arena.category_peak[static_cast<std::size_t>(Category::comm)],
            base.arena.category_peak[static_cast<std::size_t>(Category::comm)]);
}

TEST(TspAttentionOptions, KeepingKvSkipsTheBackwardAllGathersWithTheSameResult) {
  const OptionRun base = run_with(false, false), kept = run_with(false, true);
  expect_bitwise_equal(base.results, kept.results);
  EXPECT_EQ(base.traffic[CollectiveKind::all_gather].calls, 2u * 4);
  EXPECT_EQ(kept.traffic[CollectiveKind::all_gather].calls, 4u);
  EXPECT_GT(kept.arena.category_peak[static_cast<std::size_t>(Category::kv)],
            base.arena.category_peak[static_cast<std::size_t>(Category::kv)]);
}

TEST(TspAttentionOptions, BothOptionsTogetherStillMatch) {
  expect_bitwise_equal(run_with(false, false).results, run_with(true, true).results);
}

}  // namespace
}  // namespace tspemu::tsp::testing
