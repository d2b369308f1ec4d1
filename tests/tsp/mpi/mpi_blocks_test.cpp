// Every strategy's layer (attention block then MLP block, forward and backward, from the strategy
// table's block factory) in a World spanning MPI processes (WorldOptions::mpi), run under
// `mpirun -np P`: each process compares its own ranks' outputs, input gradients and weight
// gradients bit for bit with a threads-only world of the same N run in this process (the blocks
// only move data and sum in rank order, so spanning processes must change no bit).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/strategy.hpp"

namespace tspemu::tsp {
namespace {

// Divisible by every degree up to 8 (heads, KV heads for Ulysses, FFN, 2·D | S for zigzag).
LayerProblem problem() {
  LayerProblem p;
  p.model.vocab = 16;
  p.model.hidden = 32;
  p.model.n_layers = 1;
  p.model.n_heads = 8;
  p.model.n_kv_heads = 8;
  p.model.ffn = 96;
  p.B = 1;
  p.S = 32;
  return p;
}

float input(std::size_t i, int salt) {
  return static_cast<float>((static_cast<int>((i * 37 + static_cast<std::size_t>(salt)) % 101)) -
                            50) /
         64.0f;
}

// Per rank: y, dx and every gradient the layer reports, concatenated.
std::vector<std::vector<float>> run_layer(World& w, const cost::Strategy& st,
                                          const ref::LayerWeights<float>& master) {
  const LayerProblem p = problem();
  const StrategyBlocks& info = strategy_blocks(st.scheme);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(w.size()));
  w.run([&](Rank& r) {
    const RankPlacement place = info.place(p, st, r.id());
    const std::size_t C = static_cast<std::size_t>(p.model.hidden);
    const std::size_t local = place.positions.size() * static_cast<std::size_t>(p.B) * C;
    std::vector<float> x(local), dy(local), y(local), dx(local);
    for (std::size_t row = 0; row < place.positions.size(); ++row)
      for (std::size_t c = 0; c < C; ++c) {
        const std::size_t global = static_cast<std::size_t>(place.positions[row]) * C + c;
        x[row * C + c] = input(global, 1);
        dy[row * C + c] = input(global, 2);
      }
    const auto layer = info.make_layer(r, p, st, master);
    layer->forward(x.data(), y.data());
    layer->backward(x.data(), dy.data(), dx.data());
    auto& o = out[static_cast<std::size_t>(r.id())];
    for (std::span<const float> s :
         {std::span<const float>(y), std::span<const float>(dx), layer->attention_grad_shard(),
          layer->mlp_grad_shard(), layer->attention_grad_norm(), layer->mlp_grad_norm()})
      o.insert(o.end(), s.begin(), s.end());
  });
  return out;
}

TEST(MpiBlocks, EveryStrategysLayerIsBitwiseTheOneProcessResult) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const LayerProblem p = problem();
  const auto master = ref::convert_weights<float>(ref::init_weights<double>(p.model, 11)).layers[0];
  int compared = 0;
  for (int n : {4, 8}) {
    if (n % P != 0) continue;
    WorldOptions across;  // assigned, not designated: WorldOptions grows fields
    across.ranks = n;
    across.mpi = true;
    World spanning(across);
    World local(WorldOptions{.ranks = n});
    for (const cost::Strategy& st : strategies_at(n)) {
      if (violation(cost::ModelShape::from(p.model, p.B, p.S), st)) continue;
      const auto got = run_layer(spanning, st, master);
      const auto want = run_layer(local, st, master);
      for (int r = 0; r < n; ++r) {
        if (!spanning.hosts(r)) continue;
        const auto& g = got[static_cast<std::size_t>(r)];
        const auto& e = want[static_cast<std::size_t>(r)];
        ASSERT_EQ(g.size(), e.size()) << st.name() << " rank " << r;
        EXPECT_EQ(std::memcmp(g.data(), e.data(), g.size() * sizeof(float)), 0)
            << st.name() << " at " << n << " ranks: rank " << r
            << " differs from the one-process run";
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 8) << "strategies compared";
}

}  // namespace
}  // namespace tspemu::tsp

// MPI is initialized here; the worlds use it and finalize nothing.
int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  MPI_Finalize();
  return failed;
}
