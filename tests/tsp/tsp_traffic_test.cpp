// Bytes each rank receives in a TSP layer, from the runtime's exact counters, against the closed
// forms (TSP-NOTES.md, ring cost model), in bytes.
//   forward (paper):  (D-1)/D · (2 + 2/g + 3F/h) · h²  +  2(D-1)/D · B·S·h/g        elements
//     = D-1 broadcast attention shards + D-1 ring hops of MLP shards + the K/V all-gathers.
//   backward (derived, the adjoint): the same broadcasts and K/V all-gathers again (recompute),
//     the dK/dV reduce-scatters 2(D-1)/D · B·S·h/g, the attention weight-gradient reduce at the
//     owner (D-1 shards), D-1 weight hops and D gradient hops of the MLP ring, and the two norm
//     weight gradients all-reduced (2(D-1)/D · h each, counted as the ring all-reduce).
#include <gtest/gtest.h>

#include "strategy_checks.hpp"
#include "tspemu/tsp/tsp_layer.hpp"

namespace tspemu::tsp::testing {
namespace {

std::uint64_t received(const TrafficCounters& t) {
  return t.total_received();
}

TEST(TspTraffic, LayerForwardAndBackwardMoveExactlyTheModelledBytes) {
  for (int D : {2, 3, 4})
    for (int g : {1, 2}) {
      Case c;
      c.D = D;
      c.NH = 2 * D;
      c.NKV = 2 * D / g;
      c.B = 2;
      c.S = 4 * D;
      const TspShape s = c.shape();
      auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 3));
      const std::size_t local = static_cast<std::size_t>(c.B) * s.Tl() * s.model.hidden;
      World world({.ranks = D});
      std::vector<TrafficCounters> fwd(static_cast<std::size_t>(D)), bwd(fwd.size());
      world.run([&](Rank& r) {
        TspLayer layer(r, s, w.layers[0]);
        auto x = r.arena().allocate<float>(local, Category::activations, true);
        auto y = r.arena().allocate<float>(local, Category::activations);
        auto dx = r.arena().allocate<float>(local, Category::workspace);
        r.counters().clear();
        layer.forward(x.data(), y.data());
        fwd[static_cast<std::size_t>(r.id())] = r.counters();
        r.counters().clear();
        layer.backward(x.data(), y.data(), dx.data());
        bwd[static_cast<std::size_t>(r.id())] = r.counters();
      });
      const double h = s.model.hidden, F = s.model.ffn, B = c.B, S = c.S, Dd = D;
      const double gq = static_cast<double>(s.model.n_heads) / s.model.n_kv_heads;
      const double weights = (Dd - 1) / Dd * (2 + 2 / gq) * h * h;
      const double mlp_hop = 3 * F * h / Dd;  // one MLP shard
      const double kv = 2 * (Dd - 1) / Dd * B * S * h / gq;
      const double forward = weights + (Dd - 1) * mlp_hop + kv;
      const double backward =
          weights + kv + kv + weights + (2 * Dd - 1) * mlp_hop + 2 * (2 * (Dd - 1) / Dd * h);
      for (int r = 0; r < D; ++r) {
        EXPECT_EQ(received(fwd[static_cast<std::size_t>(r)]),
                  static_cast<std::uint64_t>(forward * 4))
            << "forward, D=" << D << " g=" << gq << " rank " << r;
        EXPECT_EQ(received(bwd[static_cast<std::size_t>(r)]),
                  static_cast<std::uint64_t>(backward * 4))
            << "backward, D=" << D << " g=" << gq << " rank " << r;
      }
    }
}

}  // namespace
}  // namespace tspemu::tsp::testing
