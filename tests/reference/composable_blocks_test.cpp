// Blocks with a replaceable core: the reference cores supplied explicitly are bit for bit the
// entry points without a core; an attention core that attends key blocks and merges them by
// their statistics (ring attention on one rank) and an MLP core made of F-shards (a weight ring
// on one rank) pass the fp64-oracle rule for the output, dx and every weight gradient.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blockwise_attention.hpp"
#include "test_util.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"

namespace tspemu::ref {
namespace {

using testing::random_vector;

using testing::kOracleFactor;

// B = 2, T = 144 (crosses the attention kernels' 128-query block) at zigzag positions (D = 2).
struct BlockProblem {
  ModelConfig cfg = testing::tiny_gqa_config();
  int B = 2, T = 144;
  std::vector<std::int64_t> positions = testing::zigzag_positions(144, 2);
  LayerWeights<double> w = init_weights<double>(cfg, 31).layers[0];
  std::vector<double> x = random_vector(std::size_t(2) * 144 * cfg.hidden, 32);
  std::vector<double> dy = random_vector(x.size(), 33);
};

template <class T>
struct BlockRun {
  std::vector<T> y, dx;
  LayerWeights<T> grads;
};

using testing::as;

template <class T>
LayerWeights<T> weights_as(const LayerWeights<double>& w) {
  LayerWeights<T> out;
  for (auto [o, i] :
       {std::pair{&out.input_norm, &w.input_norm}, std::pair{&out.wq, &w.wq},
        std::pair{&out.wk, &w.wk}, std::pair{&out.wv, &w.wv}, std::pair{&out.wo, &w.wo},
        std::pair{&out.post_norm, &w.post_norm}, std::pair{&out.w_gate, &w.w_gate},
        std::pair{&out.w_up, &w.w_up}, std::pair{&out.w_down, &w.w_down}}) {
    *o = as<T>(*i);
  }
  return out;
}

// The attention block on s, with `core` (nullptr: the entry point without a core).
template <class T>
BlockRun<T> run_attention(const BlockProblem& s, const AttentionCore<T>* core) {
  const LayerWeights<T> w = weights_as<T>(s.w);
  const auto x = as<T>(s.x), dy = as<T>(s.dy);
  BlockRun<T> r{std::vector<T>(x.size()), std::vector<T>(x.size()), LayerWeights<T>::zeros(s.cfg)};
  AttentionCache<T> cache;
  const std::int64_t* pos = s.positions.data();
  if (core) {
    attention_block_forward(s.cfg, w, x.data(), r.y.data(), pos, s.B, s.T, cache, *core);
    attention_block_backward(s.cfg, w, x.data(), dy.data(), r.dx.data(), pos, s.B, s.T, cache,
                             r.grads, *core);
  } else {
    attention_block_forward(s.cfg, w, x.data(), r.y.data(), pos, s.B, s.T, cache);
    attention_block_backward(s.cfg, w, x.data(), dy.data(), r.dx.data(), pos, s.B, s.T, cache,
                             r.grads);
  }
  return r;
}

// The MLP block on s, with the core make_core builds over the block's weights and the grads it
// accumulates into (an empty function: the entry point without a core).
template <class T>
using MakeMlpCore = std::function<MlpCore<T>(const LayerWeights<T>& w, LayerWeights<T>& grads)>;

template <class T>
BlockRun<T> run_mlp(const BlockProblem& s, const MakeMlpCore<T>& make_core) {
  const LayerWeights<T> w = weights_as<T>(s.w);
  const auto x = as<T>(s.x), dy = as<T>(s.dy);
  BlockRun<T> r{std::vector<T>(x.size()), std::vector<T>(x.size()), LayerWeights<T>::zeros(s.cfg)};
  MlpCache<T> cache;
  if (make_core) {
    const MlpCore<T> core = make_core(w, r.grads);
    mlp_block_forward(s.cfg, w, x.data(), r.y.data(), s.B, s.T, cache, core);
    mlp_block_backward(s.cfg, w, x.data(), dy.data(), r.dx.data(), s.B, s.T, cache, r.grads, core);
  } else {
    mlp_block_forward(s.cfg, w, x.data(), r.y.data(), s.B, s.T, cache);
    mlp_block_backward(s.cfg, w, x.data(), dy.data(), r.dx.data(), s.B, s.T, cache, r.grads);
  }
  return r;
}

template <class T>
void expect_bitwise_equal(BlockRun<T> a, BlockRun<T> b) {
  EXPECT_EQ(a.y, b.y) << "y";
  EXPECT_EQ(a.dx, b.dx) << "dx";
  const auto ga = a.grads.named(), gb = b.grads.named();
  for (std::size_t i = 0; i < ga.size(); ++i)
    EXPECT_EQ(*ga[i].second, *gb[i].second) << ga[i].first;
}

template <class T>
void reference_cores_are_the_entry_points() {
  const BlockProblem s;
  const AttentionCore<T> attention = AttentionCore<T>::local_causal();
  expect_bitwise_equal(run_attention<T>(s, &attention), run_attention<T>(s, nullptr));
  const MakeMlpCore<T> gated = [&](const LayerWeights<T>& w, LayerWeights<T>& g) {
    return MlpCore<T>::gated(s.cfg, w, g);
  };
  expect_bitwise_equal(run_mlp<T>(s, gated), run_mlp<T>(s, {}));
}

TEST(ComposableBlocks, ReferenceCoresGivenExplicitlyAreBitwiseTheEntryPointsFp32) {
  reference_cores_are_the_entry_points<float>();
}

TEST(ComposableBlocks, ReferenceCoresGivenExplicitlyAreBitwiseTheEntryPointsFp64) {
  reference_cores_are_the_entry_points<double>();
}

// Ring attention on one rank: the block's keys in n blocks (storage order, so with zigzag
// positions each block mixes early and late tokens), attended one block at a time and merged by
// lse; backward block by block on the merged lse and row delta.
template <class T>
AttentionCore<T> key_block_core(int n_blocks) {
  AttentionCore<T> core;
  core.forward = [n_blocks](T* att, T* lse, const T* q, const T* k, const T* v,
                            const std::int64_t* positions, const AttentionDims& d) {
    testing::blockwise_attention_forward(att, lse, q, k, v, positions, positions, d,
                                         testing::contiguous_blocks(d.Tk, n_blocks));
  };
  core.backward = [n_blocks](T* dq, T* dk, T* dv, const T* datt, const T* q, const T* k, const T* v,
                             const T* att, const T* lse, const std::int64_t* positions,
                             const AttentionDims& d) {
    testing::blockwise_attention_backward(dq, dk, dv, datt, q, k, v, att, lse, positions, positions,
                                          d, testing::contiguous_blocks(d.Tk, n_blocks));
  };
  return core;
}

void expect_oracle_rule(BlockRun<float> cand, BlockRun<float> ref32, BlockRun<double> oracle,
                        const std::vector<std::string>& grads) {
  for (auto [name, c, r, o] : {std::tuple{"y", &cand.y, &ref32.y, &oracle.y},
                               std::tuple{"dx", &cand.dx, &ref32.dx, &oracle.dx}}) {
    const Verdict v = check_close(name, *c, *r, *o, kOracleFactor);
    EXPECT_TRUE(v) << v.report;
  }
  const auto gc = cand.grads.named(), gr = ref32.grads.named();
  const auto go = oracle.grads.named();
  for (std::size_t i = 0; i < gc.size(); ++i) {
    const bool checked = std::find(grads.begin(), grads.end(), gc[i].first) != grads.end();
    if (!checked) {  // a tensor the block does not touch stays zero
      EXPECT_EQ(*gc[i].second, std::vector<float>(gc[i].second->size(), 0.0f)) << gc[i].first;
      continue;
    }
    const Verdict v = check_close(std::string(gc[i].first) + ".grad", *gc[i].second, *gr[i].second,
                                  *go[i].second, kOracleFactor);
    EXPECT_TRUE(v) << v.report;
  }
}

TEST(ComposableBlocks, AttentionWithKeyBlocksMergedByStatisticsPassesTheOracleRule) {
  const BlockProblem s;
  for (int n_blocks : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n_blocks) + " key blocks");
    const AttentionCore<float> core = key_block_core<float>(n_blocks);
    expect_oracle_rule(run_attention<float>(s, &core), run_attention<float>(s, nullptr),
                       run_attention<double>(s, nullptr), {"input_norm", "wq", "wk", "wv", "wo"});
  }
}

// A weight ring on one rank: shard r of W_gate, W_up (rows of F) and W_down (columns), one
// reference core per shard, each adding its partial output into y; backward sums the shards'
// dxn, and each shard's weight gradients land in its rows/columns of the block's grads.
template <class T>
MlpCore<T> f_shard_core(const ModelConfig& cfg, const LayerWeights<T>& w, LayerWeights<T>& grads,
                        int shards) {
  struct State {
    ModelConfig shard_cfg;
    std::vector<LayerWeights<T>> w, g;  // per shard; only the MLP tensors are filled
    std::vector<MlpCore<T>> cores;
  };
  auto st = std::make_shared<State>();
  const int C = cfg.hidden, Fs = cfg.ffn / shards;
  st->shard_cfg = cfg;
  st->shard_cfg.ffn = Fs;
  st->w.resize(shards);
  st->g.resize(shards);
  for (int r = 0; r < shards; ++r) {
    auto rows = [&](const std::vector<T>& m) {  // rows [r*Fs, (r+1)*Fs) of [F, C]
      return std::vector<T>(m.begin() + std::size_t(r) * Fs * C,
                            m.begin() + std::size_t(r + 1) * Fs * C);
    };
    st->w[r].w_gate = rows(w.w_gate);
    st->w[r].w_up = rows(w.w_up);
    for (int c = 0; c < C; ++c) {  // columns [r*Fs, (r+1)*Fs) of [C, F]
      const auto row = w.w_down.begin() + std::size_t(c) * cfg.ffn + std::size_t(r) * Fs;
      st->w[r].w_down.insert(st->w[r].w_down.end(), row, row + Fs);
    }
    st->g[r].w_gate.assign(std::size_t(Fs) * C, T(0));
    st->g[r].w_up.assign(std::size_t(Fs) * C, T(0));
    st->g[r].w_down.assign(std::size_t(C) * Fs, T(0));
  }
  for (int r = 0; r < shards; ++r) {
    st->cores.push_back(MlpCore<T>::gated(st->shard_cfg, st->w[r], st->g[r]));
  }
  MlpCore<T> core;
  core.forward = [st](T* y, const T* xn, int N) {
    for (const auto& c : st->cores) c.forward(y, xn, N);
  };
  core.backward = [st, &grads, C, Fs, F = cfg.ffn](T* dxn, const T* dout, const T* xn, int N) {
    std::vector<T> part(std::size_t(N) * C);
    std::fill_n(dxn, part.size(), T(0));
    for (std::size_t r = 0; r < st->cores.size(); ++r) {
      for (auto* t : {&st->g[r].w_gate, &st->g[r].w_up, &st->g[r].w_down}) {
        std::fill(t->begin(), t->end(), T(0));  // the shard core accumulates: this call's only
      }
      st->cores[r].backward(part.data(), dout, xn, N);
      for (std::size_t i = 0; i < part.size(); ++i) dxn[i] += part[i];
      const std::size_t off = r * Fs * C;
      for (std::size_t i = 0; i < st->g[r].w_gate.size(); ++i) {
        grads.w_gate[off + i] += st->g[r].w_gate[i];
        grads.w_up[off + i] += st->g[r].w_up[i];
      }
      for (int c = 0; c < C; ++c) {
        for (int j = 0; j < Fs; ++j) {
          grads.w_down[std::size_t(c) * F + r * Fs + j] += st->g[r].w_down[std::size_t(c) * Fs + j];
        }
      }
    }
  };
  return core;
}

TEST(ComposableBlocks, MlpWithFShardsAccumulatingIntoTheResidualPassesTheOracleRule) {
  const BlockProblem s;
  const MakeMlpCore<float> sharded = [&](const LayerWeights<float>& w, LayerWeights<float>& g) {
    return f_shard_core(s.cfg, w, g, 3);
  };
  expect_oracle_rule(run_mlp<float>(s, sharded), run_mlp<float>(s, {}), run_mlp<double>(s, {}),
                     {"post_norm", "w_gate", "w_up", "w_down"});
}

TEST(ComposableBlocks, MissingCoreFunctionsAndBackwardBeforeForwardThrowNamingTheOperation) {
  const BlockProblem s;
  const LayerWeights<double>& w = s.w;
  LayerWeights<double> g = LayerWeights<double>::zeros(s.cfg);
  std::vector<double> y(s.x.size());
  AttentionCache<double> ac;
  try {
    attention_block_forward(s.cfg, w, s.x.data(), y.data(), s.positions.data(), s.B, s.T, ac,
                            AttentionCore<double>{});
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("attention_block_forward: core.forward"));
  }
  MlpCache<double> mc;
  MlpCore<double> forward_only = MlpCore<double>::gated(s.cfg, w, g);
  forward_only.backward = nullptr;
  mlp_block_forward(s.cfg, w, s.x.data(), y.data(), s.B, s.T, mc, forward_only);
  try {
    mlp_block_backward(s.cfg, w, s.x.data(), s.dy.data(), y.data(), s.B, s.T, mc, g, forward_only);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("mlp_block_backward: core.backward"));
  }
  const MlpCore<double> fresh = MlpCore<double>::gated(s.cfg, w, g);
  try {
    mlp_block_backward(s.cfg, w, s.x.data(), s.dy.data(), y.data(), s.B, s.T, mc, g, fresh);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("gated MLP backward: N=288"));
  }
}

}  // namespace
}  // namespace tspemu::ref
