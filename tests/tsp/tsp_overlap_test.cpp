// TSP attention's overlapped schedule on the simulated clock: which transfers run under compute.
// Bitwise equality with the serial schedule is tsp_options_test.cpp's.
#include <gtest/gtest.h>

#include <vector>

#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/tsp_attention.hpp"

namespace tspemu::tsp {
namespace {

// D = 4, 8 heads of 8 (C = 64), 256 tokens, two head buckets (one head each). At 1 GFLOP/s a
// bucket's Q projection (65 kFLOP: 65 us) or attention (262 kFLOP) is longer than its K/V
// all-gather or a shard's broadcast (15 us each on a 1 us, 1 GB/s link), so a transfer issued
// before either is hidden in full.
TspShape overlap_shape(bool overlap) {
  TspShape s;
  s.model.hidden = 64;
  s.model.n_heads = 8;
  s.model.n_kv_heads = 8;
  s.model.ffn = 192;
  s.model.vocab = 64;
  s.model.n_layers = 1;
  s.D = 4;
  s.S = 256;
  s.options.head_buckets = 2;
  s.options.overlap = overlap;
  return s;
}

SimClockModel slow_clock() {
  SimClockModel m;
  m.peak_flops = 1e9;
  m.alpha_s = 1e-6;
  m.beta_bytes_s = 1e9;
  return m;
}

std::vector<World::SimulatedTime> forward_times(bool overlap) {
  const TspShape s = overlap_shape(overlap);
  const ref::LayerWeights<float> master = ref::LayerWeights<float>::zeros(s.model);
  World world({.ranks = s.D, .sim_clock = slow_clock()});
  world.run([&](Rank& rank) {
    TspAttention att(rank, s, master);
    const std::size_t n = static_cast<std::size_t>(s.B) * s.Tl() * s.model.hidden;
    std::vector<float> x(n, 0.5f), y(n);
    att.forward(x.data(), y.data());
  });
  std::vector<World::SimulatedTime> t;
  for (int r = 0; r < s.D; ++r) t.push_back(world.simulated_time(r));
  return t;
}

// Forward: each bucket's K/V all-gather is issued before the Q projection (bucket 0) or the
// previous bucket's attention (bucket b+1), and shard r+1's broadcast right after shard r's last
// all-gather: every transfer but shard 0's broadcast runs under compute. The serial schedule
// overlaps nothing.
TEST(TspAttentionOverlap, EveryKvGatherAndEveryPrefetchedShardRunUnderCompute) {
  const TspShape s = overlap_shape(true);
  const SimClockModel m = slow_clock();
  const int nb = s.options.head_buckets;
  const std::uint64_t kv_block =
      2ull * s.B * s.Tl() * (s.model.kv_dim() / s.D / nb) * sizeof(float);
  const double gather = m.collective_seconds(CollectiveKind::all_gather, kv_block, s.D);
  const double bcast =
      m.collective_seconds(CollectiveKind::broadcast, attention_shard_size(s) * sizeof(float), s.D);
  const double hidden = s.D * nb * gather + (s.D - 1) * bcast;
  const std::vector<World::SimulatedTime> overlapped = forward_times(true),
                                          serial = forward_times(false);
  for (int r = 0; r < s.D; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& o = overlapped[static_cast<std::size_t>(r)];
    const auto& q = serial[static_cast<std::size_t>(r)];
    const double ns = 1e-9 * (s.D * nb + s.D);  // whole nanoseconds per transfer
    EXPECT_NEAR(o.overlapped_comm, hidden, ns);
    EXPECT_NEAR(o.exposed_comm, bcast, ns);
    EXPECT_EQ(q.overlapped_comm, 0);
    EXPECT_GE(q.exposed_comm, hidden + bcast - ns);
    EXPECT_NEAR(o.compute, q.compute, 1e-12);
  }
}

}  // namespace
}  // namespace tspemu::tsp
