// Runs one TSP block (attention or MLP) on D ranks and the dense reference in float and double
// on the same master weights and inputs, and gathers every output and gradient back to full
// tensors so they can be judged against the fp64 oracle.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/runtime/injection.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/tsp_attention.hpp"
#include "tspemu/tsp/tsp_mlp.hpp"

namespace tspemu::tsp::testing {

enum class Block { attention, mlp };

struct Case {
  Block block = Block::attention;
  int D = 1, NH = 4, NKV = 4, hs = 8, B = 1, S = 16;
  LayoutKind layout = LayoutKind::zigzag;
  int head_buckets = 1;
  bool keep_attention_shards = false;
  bool keep_kv = false;
  std::uint64_t seed = 7;

  TspShape shape() const {
    TspShape s;
    s.model.vocab = 16;
    s.model.hidden = NH * hs;
    s.model.n_layers = 1;
    s.model.n_heads = NH;
    s.model.n_kv_heads = NKV;
    s.model.ffn = 3 * NH * hs;  // divisible by D whenever D | NH
    s.D = D;
    s.B = B;
    s.S = S;
    s.options.layout = layout;
    s.options.head_buckets = head_buckets;
    s.options.keep_attention_shards = keep_attention_shards;
    s.options.keep_kv = keep_kv;
    return s;
  }
  std::string name() const {
    return std::string(block == Block::attention ? "attention" : "mlp") +
           " D=" + std::to_string(D) + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV) +
           " B=" + std::to_string(B) + " S=" + std::to_string(S) + " " + layout_name(layout) +
           " buckets=" + std::to_string(head_buckets);
  }
};

// Full-size results of one implementation in one precision.
template <class T>
struct Results {
  std::vector<T> y, dx;
  ref::LayerWeights<T> grads;  // only the tensors of the block are filled
};

struct Outcome {
  Results<double> oracle;
  Results<float> reference;
  Results<float> tsp;
  std::vector<ArenaStats> arena;  // per rank, after forward + backward
};

template <class T>
std::vector<T> random_tensor(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <class T>
Results<T> run_reference(const Case& c, const ref::LayerWeights<T>& w, const std::vector<T>& x,
                         const std::vector<T>& dy) {
  const TspShape s = c.shape();
  std::vector<std::int64_t> pos(static_cast<std::size_t>(c.S));
  for (int i = 0; i < c.S; ++i) pos[static_cast<std::size_t>(i)] = i;
  Results<T> r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.grads = ref::LayerWeights<T>::zeros(s.model);
  if (c.block == Block::attention) {
    ref::AttentionCache<T> cache;
    ref::attention_block_forward(s.model, w, x.data(), r.y.data(), pos.data(), c.B, c.S, cache);
    ref::attention_block_backward(s.model, w, x.data(), dy.data(), r.dx.data(), pos.data(), c.B,
                                  c.S, cache, r.grads);
  } else {
    ref::MlpCache<T> cache;
    ref::mlp_block_forward(s.model, w, x.data(), r.y.data(), c.B, c.S, cache);
    ref::mlp_block_backward(s.model, w, x.data(), dy.data(), r.dx.data(), c.B, c.S, cache, r.grads);
  }
  return r;
}

// `per_rank` runs inside each rank before the block (e.g. a random delay).
inline Results<float> run_tsp(const Case& c, World& world, const ref::LayerWeights<float>& w,
                              const std::vector<float>& x, const std::vector<float>& dy,
                              Outcome* memory = nullptr,
                              const std::function<void(Rank&)>& per_rank = {}) {
  const TspShape s = c.shape();
  const SequenceLayout layout = s.layout();
  const std::size_t local = static_cast<std::size_t>(c.B) * s.Tl() * s.model.hidden;
  Results<float> r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.grads = ref::LayerWeights<float>::zeros(s.model);
  if (memory) memory->arena.assign(static_cast<std::size_t>(c.D), ArenaStats{});
  world.run([&](Rank& rank) {
    if (per_rank) per_rank(rank);
    const int p = rank.id();
    Arena& a = rank.arena();
    auto xl = a.allocate<float>(local, Category::activations);
    auto yl = a.allocate<float>(local, Category::activations);
    auto dyl = a.allocate<float>(local, Category::workspace);
    auto dxl = a.allocate<float>(local, Category::workspace);
    layout.scatter(x.data(), xl.data(), p, c.B, s.model.hidden);
    layout.scatter(dy.data(), dyl.data(), p, c.B, s.model.hidden);
    auto finish = [&](const auto& block, const float* norm_grad, std::vector<float>& norm_full,
                      auto unpack) {
      // Disjoint rows/blocks per rank: no two ranks write the same element.
      layout.gather(yl.data(), r.y.data(), p, c.B, s.model.hidden);
      layout.gather(dxl.data(), r.dx.data(), p, c.B, s.model.hidden);
      unpack(block.grad_shard().data(), s, p, r.grads);
      if (p == 0) std::copy(norm_grad, norm_grad + s.model.hidden, norm_full.begin());
    };
    if (c.block == Block::attention) {
      TspAttention att(rank, s, w);
      att.forward(xl.data(), yl.data());
      att.backward(xl.data(), dyl.data(), dxl.data());
      finish(att, att.grad_norm().data(), r.grads.input_norm, unpack_attention_shard);
    } else {
      TspMlp mlp(rank, s, w);
      mlp.forward(xl.data(), yl.data());
      mlp.backward(xl.data(), dyl.data(), dxl.data());
      finish(mlp, mlp.grad_norm().data(), r.grads.post_norm, unpack_mlp_shard);
    }
    if (memory) memory->arena[static_cast<std::size_t>(p)] = a.stats();
  });
  return r;
}

inline Outcome run_case(const Case& c) {
  const TspShape s = c.shape();
  s.validate();
  auto w64 = ref::init_weights<double>(s.model, c.seed);
  auto w32 = ref::convert_weights<float>(w64);
  const std::size_t n = static_cast<std::size_t>(c.B) * c.S * s.model.hidden;
  auto x64 = random_tensor<double>(n, c.seed + 1);
  auto dy64 = random_tensor<double>(n, c.seed + 2);
  std::vector<float> x32(x64.begin(), x64.end()), dy32(dy64.begin(), dy64.end());
  // The oracle sees exactly the float inputs, so only the arithmetic differs.
  std::vector<double> x(x32.begin(), x32.end()), dy(dy32.begin(), dy32.end());
  auto w_oracle = ref::convert_weights<double>(w32);
  Outcome o;
  o.oracle = run_reference<double>(c, w_oracle.layers[0], x, dy);
  o.reference = run_reference<float>(c, w32.layers[0], x32, dy32);
  World world({.ranks = c.D});
  o.tsp = run_tsp(c, world, w32.layers[0], x32, dy32, &o);
  return o;
}

// The tensors a block produces, by name, for judging.
template <class T>
std::vector<std::pair<std::string, const std::vector<T>*>> tensors(const Results<T>& r, Block b) {
  std::vector<std::pair<std::string, const std::vector<T>*>> t = {{"y", &r.y}, {"dx", &r.dx}};
  if (b == Block::attention) {
    t.insert(t.end(), {{"d input_norm", &r.grads.input_norm},
                       {"d wq", &r.grads.wq},
                       {"d wk", &r.grads.wk},
                       {"d wv", &r.grads.wv},
                       {"d wo", &r.grads.wo}});
  } else {
    t.insert(t.end(), {{"d post_norm", &r.grads.post_norm},
                       {"d w_gate", &r.grads.w_gate},
                       {"d w_up", &r.grads.w_up},
                       {"d w_down", &r.grads.w_down}});
  }
  return t;
}

// Every tensor of a block's results, concatenated, for check_deterministic (injection.hpp).
inline std::vector<std::byte> result_bytes(const Results<float>& r, Block b) {
  std::vector<std::byte> bytes;
  for (const auto& [name, t] : tensors(r, b)) append_bytes<float>(bytes, *t);
  return bytes;
}

}  // namespace tspemu::tsp::testing
