// Collectives and bytes each rank receives in a baseline block, from the runtime's exact
// counters, against the schedule's closed forms (elements × 4 bytes), forward and backward.
// With P = B·rows·C (this rank's block input), R = B·Tl·C (the row's tokens), KV = 2·B·Tl·NKVl·hs
// (one row's K and V of the local heads), W = the packed weight shard, and ar(N, n, r) =
// N + (n-2)·chunk_r the all-reduce's receive volume (counters.hpp; 2(n-1)/n·N when n | N):
//   forward   TP:          all_reduce(tp) of R                      (one per block)
//             Megatron-SP: all_gather(tp) (T-1)·P, reduce_scatter(tp) (T-1)·P
//             SP axis:     attention only, all_gather(sp) (Sp-1)·KV
//   backward  TP:          all_reduce(tp) of R (dN)
//             Megatron-SP: all_gather(tp) (T-1)·P (dY), reduce_scatter(tp) (T-1)·P (dN),
//                          all_reduce(world) of C (norm weight)
//             SP axis:     attention: all_gather(sp) (Sp-1)·KV (recompute), reduce_scatter(sp)
//                          (Sp-1)·KV (dK, dV); all_reduce(sp) of W and, without Megatron-SP,
//                          of C (norm weight; the row's replicas agree, no tp reduction)
// Collectives over one rank are not called at all.
#include <gtest/gtest.h>

#include <map>

#include "strategy_checks.hpp"

namespace tspemu::tsp::testing {
namespace {

struct Expected {
  std::map<CollectiveKind, std::pair<std::uint64_t, std::uint64_t>> by_kind;  // calls, elements
  void add(CollectiveKind k, std::uint64_t elements) {
    by_kind[k].first += 1;
    by_kind[k].second += elements;
  }
};

// Odd sizes (hs = 6, C not a multiple of the degrees) so the all-reduce chunks are unbalanced.
BaselineCase make_case_for_traffic(Block b, int T, int Sp, bool msp, bool gqa) {
  BaselineCase c;
  c.block = b;
  c.T = T;
  c.Sp = Sp;
  c.sequence_parallel = msp;
  c.NH = 2 * std::max(T, 2);
  c.NKV = gqa ? c.NH / 2 : c.NH;
  c.hs = 6;
  c.B = 2;
  c.S = 2 * T * Sp * 3;
  return c;
}

std::uint64_t ar(std::uint64_t N, int n, int r) {
  const std::uint64_t nn = static_cast<std::uint64_t>(n);
  const std::uint64_t chunk = N / nn + (static_cast<std::uint64_t>(r) < N % nn ? 1 : 0);
  return N + (nn - 2) * chunk;
}

void expect_counters(const TrafficCounters& got, const Expected& want, const std::string& what) {
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto kind = static_cast<CollectiveKind>(k);
    const auto it = want.by_kind.find(kind);
    const std::uint64_t calls = it == want.by_kind.end() ? 0 : it->second.first;
    const std::uint64_t bytes = it == want.by_kind.end() ? 0 : it->second.second * 4;
    EXPECT_EQ(got[kind].calls, calls) << what << ": calls of " << collective_name(kind);
    EXPECT_EQ(got[kind].bytes_received, bytes) << what << ": bytes of " << collective_name(kind);
  }
}

TEST(BaselineTraffic, BlocksCallExactlyTheModelledCollectivesAndMoveTheModelledBytes) {
  struct Mesh {
    int T, Sp;
    bool msp;
  };
  for (Mesh m : {Mesh{1, 1, false}, Mesh{3, 1, false}, Mesh{3, 1, true}, Mesh{1, 3, false},
                 Mesh{2, 3, false}, Mesh{3, 2, false}, Mesh{2, 2, true}})
    for (Block b : {Block::attention, Block::mlp})
      for (bool gqa : {false, true}) {
        BaselineCase c = make_case_for_traffic(b, m.T, m.Sp, m.msp, gqa);
        const BaselineShape s = c.shape();
        const TspShape shard = s.shard_shape();
        auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 3));
        const int D = s.ranks();
        const std::size_t local = static_cast<std::size_t>(c.B) * s.rows() * s.model.hidden;
        World world({.ranks = D});
        std::vector<TrafficCounters> fwd(static_cast<std::size_t>(D)), bwd(fwd.size());
        world.run([&](Rank& r) {
          auto x = r.arena().allocate<float>(local, Category::activations, true);
          auto y = r.arena().allocate<float>(local, Category::activations);
          auto dx = r.arena().allocate<float>(local, Category::workspace);
          auto pass = [&](auto& block) {
            r.counters().clear();
            block.forward(x.data(), y.data());
            fwd[static_cast<std::size_t>(r.id())] = r.counters();
            r.counters().clear();
            block.backward(x.data(), y.data(), dx.data());
            bwd[static_cast<std::size_t>(r.id())] = r.counters();
          };
          if (b == Block::attention) {
            BaselineAttention att(r, s, w.layers[0]);
            pass(att);
          } else {
            BaselineMlp mlp(r, s, w.layers[0]);
            pass(mlp);
          }
        });
        const std::uint64_t C = static_cast<std::uint64_t>(s.model.hidden);
        const std::uint64_t P = local;
        const std::uint64_t R = static_cast<std::uint64_t>(c.B) * s.Tl() * C;
        const std::uint64_t KV = 2ull * c.B * s.Tl() * s.NKVl() * s.hs();
        const std::uint64_t W =
            b == Block::attention ? attention_shard_size(shard) : mlp_shard_size(shard);
        const auto T = static_cast<std::uint64_t>(s.T), Sp = static_cast<std::uint64_t>(s.Sp);
        for (int p = 0; p < D; ++p) {
          const int row = s.row(p), col = s.col(p);
          Expected f, bw;
          if (s.T > 1) {
            if (s.sequence_parallel) {
              f.add(CollectiveKind::all_gather, (T - 1) * P);
              f.add(CollectiveKind::reduce_scatter, (T - 1) * P);
              bw.add(CollectiveKind::all_gather, (T - 1) * P);
              bw.add(CollectiveKind::reduce_scatter, (T - 1) * P);
            } else {
              f.add(CollectiveKind::all_reduce, ar(R, s.T, col));
              bw.add(CollectiveKind::all_reduce, ar(R, s.T, col));
            }
          }
          if (s.Sp > 1) {
            if (b == Block::attention) {
              f.add(CollectiveKind::all_gather, (Sp - 1) * KV);
              bw.add(CollectiveKind::all_gather, (Sp - 1) * KV);
              bw.add(CollectiveKind::reduce_scatter, (Sp - 1) * KV);
            }
            bw.add(CollectiveKind::all_reduce, ar(W, s.Sp, row));
          }
          if (s.sequence_parallel && D > 1) bw.add(CollectiveKind::all_reduce, ar(C, D, p));
          if (!s.sequence_parallel && s.Sp > 1)
            bw.add(CollectiveKind::all_reduce, ar(C, s.Sp, row));
          const std::string what = c.name() + " rank " + std::to_string(p);
          expect_counters(fwd[static_cast<std::size_t>(p)], f, what + " forward");
          expect_counters(bwd[static_cast<std::size_t>(p)], bw, what + " backward");
        }
      }
}

}  // namespace
}  // namespace tspemu::tsp::testing
