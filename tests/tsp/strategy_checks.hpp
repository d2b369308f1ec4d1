// The built-in blocks (TSP attention/MLP, and the TP / Megatron-SP / SP / TP+SP baselines on a
// T × Sp mesh) run through the public check kit (check/block_check.hpp), so the strategies' tests
// share the one harness a user's schedule gets.
//
// What: a Case (TSP: D, layout, head buckets, keep options) or a BaselineCase (T, Sp,
// sequence_parallel) becomes a check::BlockCheck and a per-rank schedule that builds the block,
// runs forward then backward on the rank's tokens and declares every gradient shard:
//   tokens   TSP: sequence_sharded(layout). Baselines: BaselineShape::positions(p) — the ranks of
//            a TP row hold the same tokens, which the kit checks as bitwise-equal replicas (under
//            Megatron-SP each rank holds its own contiguous piece of the row's tokens).
//   weights  both pack a TSP shard (packed_shards.hpp): TSP rank p holds head_sharded(p, D) of
//            wq/wk/wv/wo (GQA: whole KV heads) and column_parallel / row_parallel(p, D) of
//            gate, up / down; a baseline rank holds the same cut of degree T at its column index,
//            which is column_parallel(col, T) for wq/wk/wv/gate/up and row_parallel(col, T) for
//            wo/down. The ranks of a column (the SP axis) are replicas of that shard; the norm
//            weight's gradient is replicated on every rank. The kit checks all replicas bitwise.
// Guarantees: the report judges y, dx and every weight gradient by the oracle rule with
// k = kOracleFactor. `after` (optional) runs on every rank after backward with the block still
// alive, for what the verdict does not cover (arena stats, traffic counters, bitwise results).
// Cost: one check_block: the schedule on a fresh World, the reference in float and double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "oracle_factor.hpp"
#include "tspemu/check/block_check.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/tsp/baseline_attention.hpp"
#include "tspemu/tsp/baseline_mlp.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/tsp_attention.hpp"
#include "tspemu/tsp/tsp_mlp.hpp"

namespace tspemu::tsp::testing {

using check::Block;

// The model of every case: C = NH·hs, F = 3·C (divisible by D whenever D | NH), one layer.
inline ref::ModelConfig case_model(int NH, int NKV, int hs) {
  ref::ModelConfig m;
  m.vocab = 16;
  m.hidden = NH * hs;
  m.n_layers = 1;
  m.n_heads = NH;
  m.n_kv_heads = NKV;
  m.ffn = 3 * NH * hs;
  return m;
}

struct Case {
  Block block = Block::attention;
  int D = 1, NH = 4, NKV = 4, hs = 8, B = 1, S = 16;
  LayoutKind layout = LayoutKind::zigzag;
  int head_buckets = 1;
  bool keep_attention_shards = false;
  bool keep_kv = false;
  bool overlap = true;  // TspOptions::overlap
  std::uint64_t seed = 7;

  TspShape shape() const {
    TspShape s;
    s.model = case_model(NH, NKV, hs);
    s.D = D;
    s.B = B;
    s.S = S;
    s.options.layout = layout;
    s.options.head_buckets = head_buckets;
    s.options.keep_attention_shards = keep_attention_shards;
    s.options.keep_kv = keep_kv;
    s.options.overlap = overlap;
    return s;
  }
  std::string name() const {
    return std::string(check::block_name(block)) + " D=" + std::to_string(D) +
           " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) + " B=" + std::to_string(B) +
           " S=" + std::to_string(S) + " " + layout_name(layout) +
           " buckets=" + std::to_string(head_buckets);
  }
};

struct BaselineCase {
  Block block = Block::attention;
  int T = 1, Sp = 1;
  bool sequence_parallel = false;
  int NH = 4, NKV = 4, hs = 8, B = 1, S = 16;
  std::uint64_t seed = 7;

  BaselineShape shape() const {
    BaselineShape s;
    s.model = case_model(NH, NKV, hs);
    s.T = T;
    s.Sp = Sp;
    s.B = B;
    s.S = S;
    s.sequence_parallel = sequence_parallel;
    return s;
  }
  std::string name() const {
    return shape().strategy() + " " + check::block_name(block) + " T=" + std::to_string(T) +
           " Sp=" + std::to_string(Sp) + " NH=" + std::to_string(NH) +
           " NKV=" + std::to_string(NKV) + " B=" + std::to_string(B) + " S=" + std::to_string(S);
  }
};

// What a rank's block holds after backward, for `after`.
struct RankBlockResult {
  check::RankBlock& rb;
  const Buffer<float>& grad_shard;  // packed (packed_shards.hpp)
  const Buffer<float>& grad_norm;   // [C]
};
using AfterBlock = std::function<void(const RankBlockResult&)>;

namespace detail {

inline void require_attention_or_mlp(Block b, const std::string& name) {
  if (b == Block::layer)
    throw std::invalid_argument("strategy check " + name +
                                ": only the attention and MLP blocks are built in");
}

inline void declare(check::RankBlock& rb, const char* name, const float* data,
                    const check::ShardMap& map) {
  const auto n = check::element_count(map.resolve(rb.shape(name)));
  rb.gradient(name, std::span<const float>(data, static_cast<std::size_t>(n)), map);
}

// Runs the block and declares its packed gradient shard: `in_rows` cuts the output rows of
// wq/wk/wv (gate/up), `in_cols` the input columns of wo (down). The norm weight's gradient is
// replicated.
template <class BlockT>
void run_and_declare(check::RankBlock& rb, BlockT& block, Block kind, const TspShape& packing,
                     const check::ShardMap& in_rows, const check::ShardMap& in_cols,
                     const AfterBlock& after) {
  block.forward(rb.x().data(), rb.y().data());
  block.backward(rb.x().data(), rb.dy().data(), rb.dx().data());
  const float* g = block.grad_shard().data();
  if (kind == Block::attention) {
    const auto v = attention_view(g, packing);
    declare(rb, "wq", v.wq, in_rows);
    declare(rb, "wk", v.wk, in_rows);
    declare(rb, "wv", v.wv, in_rows);
    declare(rb, "wo", v.wo, in_cols);
    rb.gradient("input_norm", block.grad_norm().span(), check::replicated());
  } else {
    const auto v = mlp_view(g, packing);
    declare(rb, "w_gate", v.gate, in_rows);
    declare(rb, "w_up", v.up, in_rows);
    declare(rb, "w_down", v.down, in_cols);
    rb.gradient("post_norm", block.grad_norm().span(), check::replicated());
  }
  if (after) after({rb, block.grad_shard(), block.grad_norm()});
}

inline check::BlockCheck block_check(const std::string& name, Block b, const ref::ModelConfig& m,
                                     int ranks, int B, int S, std::uint64_t seed) {
  require_attention_or_mlp(b, name);
  check::BlockCheck c;
  c.name = name;
  c.model = m;
  c.block = b;
  c.ranks = ranks;
  c.B = B;
  c.S = S;
  c.seed = seed;
  c.k = kOracleFactor;
  return c;
}

}  // namespace detail

inline check::Report check_tsp(const Case& c, const AfterBlock& after = {}, int inject_seeds = 0) {
  const TspShape s = c.shape();
  s.validate();
  check::BlockCheck bc = detail::block_check(c.name(), c.block, s.model, c.D, c.B, c.S, c.seed);
  bc.tokens = check::sequence_sharded(s.layout(), c.B);
  bc.inject_seeds = inject_seeds;
  return check::check_block(bc, [&](check::RankBlock& rb) {
    const int p = rb.rank().id();
    // head_sharded and column_parallel agree on wq/wk/wv (whole heads per rank), as do
    // head_sharded and row_parallel on wo; the head cut states what TSP shards.
    if (c.block == Block::attention) {
      TspAttention att(rb.rank(), s, rb.master());
      detail::run_and_declare(rb, att, c.block, s, check::head_sharded(p, c.D),
                              check::head_sharded(p, c.D), after);
    } else {
      TspMlp mlp(rb.rank(), s, rb.master());
      detail::run_and_declare(rb, mlp, c.block, s, check::column_parallel(p, c.D),
                              check::row_parallel(p, c.D), after);
    }
  });
}

inline check::Report check_baseline(const BaselineCase& c, const AfterBlock& after = {},
                                    int inject_seeds = 0) {
  const BaselineShape s = c.shape();
  s.validate();
  check::BlockCheck bc =
      detail::block_check(c.name(), c.block, s.model, s.ranks(), c.B, c.S, c.seed);
  bc.tokens = [s](int rank) { return check::TokenShard{0, s.B, s.positions(rank)}; };
  bc.inject_seeds = inject_seeds;
  const TspShape packing = s.shard_shape();
  return check::check_block(bc, [&](check::RankBlock& rb) {
    const int col = s.col(rb.rank().id());
    const check::ShardMap in_rows = check::column_parallel(col, s.T),
                          in_cols = check::row_parallel(col, s.T);
    if (c.block == Block::attention) {
      BaselineAttention att(rb.rank(), s, rb.master());
      detail::run_and_declare(rb, att, c.block, packing, in_rows, in_cols, after);
    } else {
      BaselineMlp mlp(rb.rank(), s, rb.master());
      detail::run_and_declare(rb, mlp, c.block, packing, in_rows, in_cols, after);
    }
  });
}

// At one rank the blocks make the reference's kernel calls in the reference's order, so they are
// bitwise equal to it: the reference block on the rank's inputs (the whole sequence, in order)
// against the block's y, dx and unpacked gradients. Returns what differs.
inline std::vector<std::string> bitwise_differences_from_reference(const RankBlockResult& r,
                                                                   Block b,
                                                                   const TspShape& packing) {
  check::RankBlock& rb = r.rb;
  const ref::ModelConfig& m = rb.config();
  const int B = rb.batches(), T = rb.tokens();
  std::vector<float> y(rb.y().size()), dx(rb.dx().size());
  auto grads = ref::LayerWeights<float>::zeros(m), got = ref::LayerWeights<float>::zeros(m);
  if (b == Block::attention) {
    ref::AttentionCache<float> cache;
    ref::attention_block_forward(m, rb.master(), rb.x().data(), y.data(), rb.positions().data(), B,
                                 T, cache);
    ref::attention_block_backward(m, rb.master(), rb.x().data(), rb.dy().data(), dx.data(),
                                  rb.positions().data(), B, T, cache, grads);
    unpack_attention_shard(r.grad_shard.data(), packing, 0, got);
    std::copy(r.grad_norm.begin(), r.grad_norm.end(), got.input_norm.begin());
  } else {
    ref::MlpCache<float> cache;
    ref::mlp_block_forward(m, rb.master(), rb.x().data(), y.data(), B, T, cache);
    ref::mlp_block_backward(m, rb.master(), rb.x().data(), rb.dy().data(), dx.data(), B, T, cache,
                            grads);
    unpack_mlp_shard(r.grad_shard.data(), packing, 0, got);
    std::copy(r.grad_norm.begin(), r.grad_norm.end(), got.post_norm.begin());
  }
  std::vector<std::string> differ;
  auto same = [&](const char* name, std::span<const float> a, std::span<const float> e) {
    if (a.size() != e.size() || std::memcmp(a.data(), e.data(), a.size() * sizeof(float)) != 0)
      differ.push_back(name);
  };
  same("y", rb.y(), y);
  same("dx", rb.dx(), dx);
  // LayerWeights::named() lists the attention block's five tensors, then the MLP block's four.
  const auto got_named = got.named(), want_named = grads.named();
  const std::size_t first = b == Block::attention ? 0 : 5, last = b == Block::attention ? 5 : 9;
  for (std::size_t i = first; i < last; ++i)
    same(got_named[i].first, *got_named[i].second, *want_named[i].second);
  return differ;
}

// The printed report, as a failure message.
inline std::string printed(const check::Report& r) {
  std::ostringstream out;
  r.print(out);
  return out.str();
}

}  // namespace tspemu::tsp::testing
