// Memory per rank of the baseline blocks, measured by the arenas against the contracts of
// baseline_attention.hpp / baseline_mlp.hpp: weights and gradients are the rank's shard plus the
// replicated norm weight; the activations kept from forward to backward are the row's normed
// tokens, rstd of the rank's input rows and A + softmax statistics (attention) or G and U (MLP);
// the K/V buffers are the gathered and position-ordered full-sequence K/V (and their gradients).
#include <gtest/gtest.h>

#include "arena_charges.hpp"
#include "strategy_checks.hpp"

namespace tspemu::tsp::testing {
namespace {

TEST(BaselineMemory, WeightsGradientsKeptActivationsAndKvMatchTheContract) {
  struct Mesh {
    int T, Sp;
    bool msp;
  };
  for (Mesh m : {Mesh{1, 1, false}, Mesh{4, 1, false}, Mesh{4, 1, true}, Mesh{1, 4, false},
                 Mesh{2, 2, false}, Mesh{2, 3, false}})
    for (Block b : {Block::attention, Block::mlp}) {
      BaselineCase c;
      c.block = b;
      c.T = m.T;
      c.Sp = m.Sp;
      c.sequence_parallel = m.msp;
      c.NH = 8;
      c.NKV = 4;
      c.hs = 8;
      c.B = 2;
      c.S = 2 * m.T * m.Sp * 4;
      const BaselineShape s = c.shape();
      const TspShape shard = s.shard_shape();
      auto w = ref::convert_weights<float>(ref::init_weights<double>(s.model, 3));
      const std::size_t local = static_cast<std::size_t>(c.B) * s.rows() * s.model.hidden;
      World world({.ranks = s.ranks()});
      std::vector<ArenaStats> built(static_cast<std::size_t>(s.ranks())), forward(built.size()),
          done(built.size());
      world.run([&](Rank& r) {
        Arena& a = r.arena();
        auto x = a.allocate<float>(local, Category::other, true);
        auto y = a.allocate<float>(local, Category::other);
        auto dx = a.allocate<float>(local, Category::other);
        auto pass = [&](auto& block) {
          const auto i = static_cast<std::size_t>(r.id());
          a.reset_peaks();
          built[i] = a.stats();
          block.forward(x.data(), y.data());
          forward[i] = a.stats();
          block.backward(x.data(), y.data(), dx.data());
          done[i] = a.stats();
        };
        if (b == Block::attention) {
          BaselineAttention att(r, s, w.layers[0]);
          pass(att);
        } else {
          BaselineMlp mlp(r, s, w.layers[0]);
          pass(mlp);
        }
      });
      const std::size_t B = static_cast<std::size_t>(c.B), Tl = static_cast<std::size_t>(s.Tl());
      const std::size_t C = static_cast<std::size_t>(s.model.hidden);
      const std::size_t rows = B * static_cast<std::size_t>(s.rows());
      const std::size_t shard_floats =
          b == Block::attention ? attention_shard_size(shard) : mlp_shard_size(shard);
      std::size_t kept = charged(B * Tl * C) + charged(rows);
      std::size_t kv_forward = 0, kv_backward = 0;
      if (b == Block::attention) {
        const std::size_t qc = static_cast<std::size_t>(s.NHl() * s.hs());
        const std::size_t kc = static_cast<std::size_t>(s.NKVl() * s.hs());
        const std::size_t full_kv = B * static_cast<std::size_t>(s.S) * kc;
        kept += charged(B * Tl * qc) + charged(B * static_cast<std::size_t>(s.NHl()) * Tl);
        if (s.Sp > 1)
          kv_forward =
              charged(2 * B * Tl * kc * static_cast<std::size_t>(s.Sp)) + 2 * charged(full_kv);
        kv_backward = kv_forward + 2 * charged(full_kv);
      } else {
        kept += 2 * charged(B * Tl * static_cast<std::size_t>(s.Fl()));
      }
      for (std::size_t i = 0; i < built.size(); ++i) {
        const std::string what = c.name() + " rank " + std::to_string(i);
        EXPECT_EQ(current(built[i], Category::weights), charged(shard_floats) + charged(C)) << what;
        EXPECT_EQ(current(forward[i], Category::activations), kept) << what;
        EXPECT_EQ(peak(forward[i], Category::kv), kv_forward) << what;
        EXPECT_EQ(peak(done[i], Category::kv), kv_backward) << what;
        EXPECT_EQ(current(done[i], Category::gradients), charged(shard_floats) + charged(C))
            << what;
        // Nothing transient outlives a pass.
        EXPECT_EQ(current(done[i], Category::workspace), 0u) << what;
        EXPECT_EQ(current(done[i], Category::comm), 0u) << what;
        EXPECT_EQ(current(done[i], Category::kv), 0u) << what;
      }
    }
}

}  // namespace
}  // namespace tspemu::tsp::testing
