// The attention backward's memory/communication options: keeping the broadcast shards or the
// gathered K/V from forward changes what is moved and held, never the result.
#include <gtest/gtest.h>

#include <cstring>

#include "strategy_checks.hpp"

namespace tspemu::tsp::testing {
namespace {

struct OptionRun {
  std::vector<std::vector<float>> results;  // per rank: y, dx, gradient shard, norm gradient
  TrafficCounters traffic;                  // rank 0
  ArenaStats arena;                         // rank 0
};

// The same seeded inputs on every run (the kit's seed), so results compare bit for bit.
OptionRun run_with(bool keep_shards, bool keep_kv, bool overlap = true, int buckets = 1) {
  Case c;
  c.D = 4;
  c.NH = 8;
  c.NKV = 4 * buckets;  // 2 buckets: two KV heads per shard
  c.B = 2;
  c.S = 32;
  c.keep_attention_shards = keep_shards;
  c.keep_kv = keep_kv;
  c.overlap = overlap;
  c.head_buckets = buckets;
  OptionRun run;
  run.results.resize(static_cast<std::size_t>(c.D));
  const check::Report r = check_tsp(c, [&](const RankBlockResult& rr) {
    std::vector<float>& out = run.results[static_cast<std::size_t>(rr.rb.rank().id())];
    for (std::span<const float> t :
         {std::span<const float>(rr.rb.y()), std::span<const float>(rr.rb.dx()),
          rr.grad_shard.span(), rr.grad_norm.span()})
      out.insert(out.end(), t.begin(), t.end());
    if (rr.rb.rank().id() == 0) {
      run.traffic = rr.rb.rank().counters();
      run.arena = rr.rb.arena().stats();
    }
  });
  EXPECT_TRUE(r.ok()) << printed(r);
  return run;
}

void expect_bitwise_equal(const OptionRun& a, const OptionRun& b) {
  for (std::size_t p = 0; p < a.results.size(); ++p) {
    ASSERT_EQ(a.results[p].size(), b.results[p].size()) << "rank " << p;
    EXPECT_EQ(0, std::memcmp(a.results[p].data(), b.results[p].data(),
                             a.results[p].size() * sizeof(float)))
        << "rank " << p << ": y, dx or a gradient differs";
  }
}

TEST(TspAttentionOptions, KeepingShardsSkipsTheBackwardBroadcastsWithTheSameResult) {
  const OptionRun base = run_with(false, false), kept = run_with(true, false);
  expect_bitwise_equal(base, kept);
  EXPECT_EQ(base.traffic[CollectiveKind::broadcast].calls, 2u * 4);  // D in forward, D in backward
  EXPECT_EQ(kept.traffic[CollectiveKind::broadcast].calls, 4u);
  EXPECT_GT(kept.arena.category_peak[static_cast<std::size_t>(Category::comm)],
            base.arena.category_peak[static_cast<std::size_t>(Category::comm)]);
}

TEST(TspAttentionOptions, KeepingKvSkipsTheBackwardAllGathersWithTheSameResult) {
  const OptionRun base = run_with(false, false), kept = run_with(false, true);
  expect_bitwise_equal(base, kept);
  EXPECT_EQ(base.traffic[CollectiveKind::all_gather].calls, 2u * 4);
  EXPECT_EQ(kept.traffic[CollectiveKind::all_gather].calls, 4u);
  EXPECT_GT(kept.arena.category_peak[static_cast<std::size_t>(Category::kv)],
            base.arena.category_peak[static_cast<std::size_t>(Category::kv)]);
}

// The prefetching schedule (TspOptions::overlap) against the serial one: outputs and gradients bit
// for bit, the same collectives and bytes, and the extra shard buffers under comm.
TEST(TspAttentionOptions, TheOverlappedScheduleIsBitwiseTheSerialOne) {
  for (int keep : {0, 1, 2, 3})
    for (int buckets : {1, 2}) {
      SCOPED_TRACE("keep=" + std::to_string(keep) + " buckets=" + std::to_string(buckets));
      const bool shards = (keep & 1) != 0, kv = (keep & 2) != 0;
      const OptionRun serial = run_with(shards, kv, false, buckets);
      const OptionRun overlapped = run_with(shards, kv, true, buckets);
      expect_bitwise_equal(serial, overlapped);
      for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
        EXPECT_EQ(serial.traffic.by_kind[k].calls, overlapped.traffic.by_kind[k].calls);
        EXPECT_EQ(serial.traffic.by_kind[k].bytes_sent, overlapped.traffic.by_kind[k].bytes_sent);
        EXPECT_EQ(serial.traffic.by_kind[k].bytes_received,
                  overlapped.traffic.by_kind[k].bytes_received);
      }
      EXPECT_GT(overlapped.arena.category_peak[static_cast<std::size_t>(Category::comm)],
                serial.arena.category_peak[static_cast<std::size_t>(Category::comm)]);
    }
}

TEST(TspAttentionOptions, BothOptionsTogetherStillMatch) {
  expect_bitwise_equal(run_with(false, false), run_with(true, true));
}

}  // namespace
}  // namespace tspemu::tsp::testing
