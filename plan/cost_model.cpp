#include "tspemu/plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>

#include "tspemu/plan/strategy_table.hpp"

namespace tspemu::tsp::cost {

namespace {

using u64 = std::uint64_t;
using i64 = std::int64_t;

// Bytes of `count` elements of `size` bytes (sizes are whole numbers of bytes in practice).
u64 bytes_of(i64 count, double size) {
  return static_cast<u64>(std::llround(static_cast<double>(count) * size));
}

[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument("cost model: " + why);
}

void check_divides(i64 d, i64 n, const char* what_d, const char* what_n) {
  if (d < 1 || n % d != 0)
    reject(std::string(what_d) + "=" + std::to_string(d) + " does not divide " + what_n + "=" +
           std::to_string(n));
}

// The model's own consistency, then the strategy's divisibility rules (strategy_table.hpp) without
// the zigzag layout's 2·degree | S, which the byte counts do not need.
void validate(const ModelShape& m, const Strategy& st, const CostOptions& opt) {
  if (m.B < 1 || m.S < 1 || m.hidden < 1 || m.n_heads < 1 || m.n_kv_heads < 1 || m.ffn < 1)
    reject("B, S, hidden, n_heads, n_kv_heads, ffn must be >= 1");
  check_divides(m.n_heads, m.hidden, "n_heads", "hidden");
  check_divides(m.n_kv_heads, m.n_heads, "n_kv_heads", "n_heads");
  const tsp::RuleOptions rules{.layout_rules = false, .head_buckets = opt.head_buckets};
  if (const auto v = tsp::violation(m, st, rules)) reject(v->message);
}

double ring(double N, int n) {
  return ring_volume(N, n);
}

// A closed form of one family of blocks, called for a strategy of another family: a table entry
// pointing at the wrong function.
void expect_family(const Strategy& st, std::initializer_list<Scheme> family, const char* fn) {
  for (Scheme s : family)
    if (st.scheme == s) return;
  reject(std::string(fn) + " does not describe " + st.name());
}

}  // namespace

// ---- ModelShape, Strategy ---------------------------------------------------------------------

ModelShape ModelShape::from(const ref::ModelConfig& c, i64 B, i64 S) {
  ModelShape m;
  m.B = B;
  m.S = S;
  m.hidden = c.hidden;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  m.ffn = c.ffn;
  m.layers = c.n_layers;
  m.vocab = c.vocab;
  m.tie_embeddings = c.tie_embeddings;
  return m;
}

ModelShape paper_7b(i64 B, i64 S) {
  ModelShape m;
  m.B = B;
  m.S = S;
  m.hidden = 4096;
  m.n_heads = 32;
  m.n_kv_heads = 32;
  m.ffn = 4 * m.hidden;
  m.layers = 32;
  m.vocab = 32000;
  return m;
}

const char* scheme_name(Scheme s) {
  return tsp::strategy_info(s).title;
}

std::string Strategy::name() const {
  const tsp::StrategyInfo& e = tsp::strategy_info(scheme);
  if (e.mesh == tsp::MeshKind::grid)
    return std::string(e.title) + " T=" + std::to_string(T) + "×Σ=" + std::to_string(Sp);
  return std::string(e.title) + " " + e.degree_letter + "=" + std::to_string(ranks());
}

// ---- Traffic ----------------------------------------------------------------------------------

double LayerTraffic::paper_backward_under(Recompute rc) const {
  return paper_backward + (rc == Recompute::full        ? paper_recompute
                           : rc == Recompute::selective ? paper_recompute_core
                                                        : 0.0);
}

u64 all_reduce_bytes(u64 count, int n, int r, double element_bytes) {
  if (n <= 1) return 0;
  const u64 nn = static_cast<u64>(n), rr = static_cast<u64>(r);
  // Balanced chunk of rank r: the first count % n chunks have one more element (all_reduce.cpp).
  const u64 mine = count / nn + (rr < count % nn ? 1 : 0);
  const u64 elements = (count - mine) + (nn - 1) * mine;
  return bytes_of(static_cast<i64>(elements), element_bytes);
}

double paper_forward_elements(const ModelShape& m, const Strategy& st) {
  return tsp::strategy_info(st.scheme).paper_forward_elements(m, st);
}

double ring_volume(double N, int n) {
  return n <= 1 ? 0.0 : (n - 1.0) / n * N;
}

LayerTraffic tsp_layer_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                               const CostOptions& o, int p) {
  expect_family(st, {Scheme::tsp}, "tsp_layer_traffic");
  using K = CollectiveKind;
  const int D = st.D;
  const i64 As = m.attention_params() / D, Ms = m.mlp_params() / D;
  const int nb = o.head_buckets;
  const i64 M = m.B * m.S / D;                           // local token rows
  const i64 kc = m.n_kv_heads / D / nb * m.head_size();  // one bucket's K width
  const i64 kv_count = 2 * M * kc;                       // K and V of one bucket, local
  const u64 Dm1 = static_cast<u64>(D - 1), Du = static_cast<u64>(D);
  const u64 shard_w = bytes_of(As, es.weight), shard_g = bytes_of(As, es.gradient);
  const u64 ring_w = bytes_of(Ms, es.weight), ring_g = bytes_of(Ms, es.gradient);
  const u64 kv = bytes_of(kv_count, es.activation);
  LayerTraffic t;
  // Forward: D broadcasts (this rank is root once: sends (D-1)·shard; receives the D-1 others),
  // D·nb K/V all-gathers, D-1 MLP ring hops.
  TrafficCounters& f = t.forward;
  f.add(K::broadcast, Du, 0, 0);
  f[K::broadcast].bytes_sent = Dm1 * shard_w;
  f[K::broadcast].bytes_received = Dm1 * shard_w;
  f.add(K::all_gather, Du * static_cast<u64>(nb), Dm1 * kv, Dm1 * kv);
  f.add(K::send, Dm1, ring_w, 0);
  f.add(K::recv, Dm1, 0, ring_w);
  // Backward: MLP ring (D-1 weight hops, D gradient hops when D > 1), norm-gradient all-reduce of
  // each block, attention re-broadcast and re-gather unless kept, dK/dV reduce-scatter, dW reduce.
  TrafficCounters& b = t.backward;
  const u64 grad_hops = D > 1 ? Du : 0;
  b.add(K::send, Dm1, ring_w, 0);
  b.add(K::recv, Dm1, 0, ring_w);
  b.add(K::send, grad_hops, ring_g, 0);
  b.add(K::recv, grad_hops, 0, ring_g);
  const u64 ar = all_reduce_bytes(static_cast<u64>(m.hidden), D, p, es.gradient);
  b.add(K::all_reduce, 2, ar, ar);
  if (!o.keep_attention_shards) {
    b.add(K::broadcast, Du, 0, 0);
    b[K::broadcast].bytes_sent = Dm1 * shard_w;
    b[K::broadcast].bytes_received = Dm1 * shard_w;
  }
  if (!o.keep_kv) b.add(K::all_gather, Du * static_cast<u64>(nb), Dm1 * kv, Dm1 * kv);
  b.add(K::reduce_scatter, Du * static_cast<u64>(nb), Dm1 * kv, Dm1 * kv);
  // D reduces: this rank sends its partial to the D-1 other owners, receives D-1 partials once.
  b.add(K::reduce, Du, 0, 0);
  b[K::reduce].bytes_sent = Dm1 * shard_g;
  b[K::reduce].bytes_received = Dm1 * shard_g;

  // Paper convention (ring model), bytes.
  const double Pa = static_cast<double>(m.attention_params()),
               Pm = static_cast<double>(m.mlp_params());
  const double kv_vol = 2 * ring(static_cast<double>(m.B * m.S * m.kv_dim()), D) * es.activation;
  t.paper_forward = ring(Pa + Pm, D) * es.weight + kv_vol;
  t.paper_backward = (o.keep_attention_shards ? 0 : ring(Pa, D) * es.weight) +
                     (o.keep_kv ? 0 : kv_vol) + kv_vol + ring(Pa, D) * es.gradient +
                     (D - 1.0) * static_cast<double>(Ms) * es.weight +
                     (D > 1 ? D * static_cast<double>(Ms) * es.gradient : 0.0) +
                     2 * 2 * ring(static_cast<double>(m.hidden), D) * es.gradient;
  // Recomputing the layer's forward needs no collective of its own: backward re-broadcasts the
  // attention shards and re-gathers K/V anyway (above), and the MLP ring brings each weight shard.
  t.paper_recompute = 0;
  return t;
}

// The baselines (baseline_attention.hpp, baseline_mlp.hpp, baseline_region.hpp): rank =
// row·T + col; tp group = the row (rank col), sp group = the column (rank row).
LayerTraffic mesh_layer_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                                const CostOptions&, int rank) {
  expect_family(st, {Scheme::tp, Scheme::megatron_sp, Scheme::sp, Scheme::tp_sp},
                "mesh_layer_traffic");
  using K = CollectiveKind;
  const bool msp = st.scheme == Scheme::megatron_sp;
  const int T = st.T, Sp = st.Sp, col = rank % T, row = rank / T;
  const i64 rows = m.B * m.S / Sp;                 // token rows of a TP row
  const i64 act = rows * m.hidden;                 // one [B, S/Sp, h] activation
  const i64 kv_count = 2 * rows * m.kv_dim() / T;  // local K and V, local heads
  const u64 Tm1 = static_cast<u64>(T - 1), Spm1 = static_cast<u64>(Sp - 1);
  LayerTraffic t;
  for (TrafficCounters* pass : {&t.forward, &t.backward}) {
    TrafficCounters& x = *pass;
    const bool bwd = pass == &t.backward;
    if (msp) {
      // Per block: all_gather(tp) of the normed pieces (backward: of dY; called even when T = 1)
      // and, when T > 1, reduce_scatter(tp) of the partial output (backward: of dN).
      const u64 piece = bytes_of(act / T, es.activation);
      x.add(K::all_gather, 2, Tm1 * piece, Tm1 * piece);
      if (T > 1) x.add(K::reduce_scatter, 2, Tm1 * piece, Tm1 * piece);
    } else if (T > 1) {
      const u64 ar = all_reduce_bytes(static_cast<u64>(act), T, col, es.activation);
      x.add(K::all_reduce, 2, ar, ar);
    }
    if (Sp > 1) {
      const u64 kv = bytes_of(kv_count, es.activation);
      x.add(K::all_gather, 1, Spm1 * kv, Spm1 * kv);               // K/V (re-gathered in backward)
      if (bwd) x.add(K::reduce_scatter, 1, Spm1 * kv, Spm1 * kv);  // dK, dV
    }
    if (bwd) {
      // Weight gradients: partial per row → all_reduce(sp).
      if (Sp > 1) {
        for (i64 p : {m.attention_params() / T, m.mlp_params() / T}) {
          const u64 ar = all_reduce_bytes(static_cast<u64>(p), Sp, row, es.gradient);
          x.add(K::all_reduce, 1, ar, ar);
        }
      }
      // Norm weights: Megatron-SP over every rank; otherwise over sp.
      const int n = msp ? T * Sp : Sp, r = msp ? rank : row;
      if (n > 1) {
        const u64 ar = all_reduce_bytes(static_cast<u64>(m.hidden), n, r, es.gradient);
        x.add(K::all_reduce, 2, ar, ar);
      }
    }
  }
  // Paper convention.
  const double BSr = static_cast<double>(rows), h = static_cast<double>(m.hidden);
  const double tp_part = 4 * ring(BSr * h, T) * es.activation;
  const double kv_vol = ring(static_cast<double>(kv_count) * Sp, Sp) * es.activation;
  t.paper_forward = tp_part + kv_vol;
  const double grads =
      2 * ring(static_cast<double>(m.attention_params() + m.mlp_params()) / T, Sp) * es.gradient;
  const double norms = 2 * 2 * ring(h, msp ? T * Sp : Sp) * es.gradient;
  t.paper_backward = tp_part + 2 * kv_vol + grads + norms;
  // Recomputing the forward re-runs its TP collectives (the all-reduces, or Megatron-SP's
  // all-gather + reduce-scatter); its K/V all-gather is the backward's re-gather, already counted.
  t.paper_recompute = tp_part;
  return t;
}

// Ulysses and ring attention (sequence_sharded_attention.hpp, ulysses_attention.hpp,
// ring_attention.hpp) then the SP BaselineMlp: n = Sp ranks, M = B·S/n local token rows.
LayerTraffic sequence_sharded_layer_traffic(const ModelShape& m, const Strategy& st,
                                            const ElementSizes& es, const CostOptions&, int rank) {
  expect_family(st, {Scheme::ulysses, Scheme::ring}, "sequence_sharded_layer_traffic");
  using K = CollectiveKind;
  const int n = st.Sp;
  const u64 nm1 = static_cast<u64>(n - 1);
  const i64 M = m.B * m.S / n;
  const i64 q_count = M * m.q_dim(), kv_count = M * m.kv_dim();  // Q (or A) and K (or V), local
  LayerTraffic t;
  if (st.scheme == Scheme::ulysses) {
    // An all_to_all of N elements sends and receives the n-1 blocks of N/n bound elsewhere.
    const u64 q = nm1 * bytes_of(q_count / n, es.activation);
    const u64 kv = nm1 * bytes_of(kv_count / n, es.activation);
    t.forward.add(K::all_to_all, 2, q, q);     // Q to heads, A to sequence
    t.forward.add(K::all_to_all, 2, kv, kv);   // K, V to heads
    t.backward.add(K::all_to_all, 3, q, q);    // Q, dA to heads, dQ to sequence
    t.backward.add(K::all_to_all, 4, kv, kv);  // K, V to heads, dK, dV to sequence
  } else if (n > 1) {
    const u64 block = bytes_of(2 * kv_count, es.activation);  // [K, V] or [dK, dV]
    t.forward.add(K::send, nm1, block, 0);
    t.forward.add(K::recv, nm1, 0, block);
    t.backward.add(K::send, 2 * nm1 + 1, block, 0);  // n-1 K/V hops, n dK/dV hops
    t.backward.add(K::recv, 2 * nm1 + 1, 0, block);
  }
  const i64 Pa = m.attention_params(), Pm = m.mlp_params();
  if (n > 1) {
    // Attention: one all_reduce_buffers of {weights, norm}; MLP (MeshRegion): norm, then weights.
    for (i64 count : {Pa + m.hidden, m.hidden, Pm}) {
      const u64 ar = all_reduce_bytes(static_cast<u64>(count), n, rank, es.gradient);
      t.backward.add(K::all_reduce, 1, ar, ar);
    }
  }
  // Paper convention.
  const double grads = 2 * ring(static_cast<double>(Pa + Pm + 2 * m.hidden), n) * es.gradient;
  if (st.scheme == Scheme::ulysses) {
    const double q = ring(static_cast<double>(q_count), n) * es.activation;
    const double kv = ring(static_cast<double>(kv_count), n) * es.activation;
    t.paper_forward = 2 * q + 2 * kv;
    t.paper_backward = 3 * q + 4 * kv + grads;
    // Q, K, V go to heads again in backward; the recomputed output's return to the sequence
    // layout (input of W_O) is the one forward exchange backward does not repeat.
    t.paper_recompute = q;
  } else {
    const double block = 2.0 * static_cast<double>(kv_count) * es.activation;
    t.paper_forward = (n - 1.0) * block;
    t.paper_backward = (2.0 * n - 1.0) * (n > 1 ? block : 0.0) + grads;
    // The recomputed output and log-sum-exp need the K/V blocks round the ring once more.
    t.paper_recompute = (n - 1.0) * block;
    t.paper_recompute_core = t.paper_recompute;
  }
  return t;
}

LayerTraffic layer_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                           const CostOptions& opt, int rank) {
  validate(m, st, opt);
  if (rank < 0 || rank >= st.ranks())
    reject("rank=" + std::to_string(rank) + " outside 0.." + std::to_string(st.ranks() - 1));
  return tsp::strategy_info(st.scheme).layer_traffic(m, st, es, opt, rank);
}

// ---- The whole model's embedding, LM head and loss -------------------------------------------

int vocab_shards(const Strategy& st) {
  switch (st.scheme) {
    case Scheme::tsp:
      return st.D;
    case Scheme::tp:
    case Scheme::megatron_sp:
    case Scheme::tp_sp:
      return st.T;
    case Scheme::sp:
    case Scheme::ulysses:
    case Scheme::ring:
      return 1;
  }
  return 1;
}

VocabTraffic tsp_vocab_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                               int rank) {
  expect_family(st, {Scheme::tsp}, "tsp_vocab_traffic");
  using K = CollectiveKind;
  const int D = st.D;
  const i64 shard = m.vocab / D * m.hidden;
  const u64 others = static_cast<u64>(D - 1);
  // D calls rooted at each rank in turn: this rank is the root of one of them.
  auto broadcasts = [&](TrafficCounters& t) {
    const u64 b = bytes_of(shard, es.weight);
    t.add(K::broadcast, 1, others * b, 0);
    t.add(K::broadcast, others, 0, b);
  };
  auto reduces = [&](TrafficCounters& t) {
    const u64 b = bytes_of(shard, es.gradient);
    t.add(K::reduce, 1, 0, others * b);
    t.add(K::reduce, others, b, 0);
  };
  VocabTraffic v;
  broadcasts(v.forward);  // embedding
  broadcasts(v.forward);  // LM head
  const u64 loss = all_reduce_bytes(1, D, rank, 8);
  v.forward.add(K::all_reduce, 1, loss, loss);
  broadcasts(v.backward);  // LM head again
  reduces(v.backward);     // its gradient
  const u64 norm = all_reduce_bytes(static_cast<u64>(m.hidden), D, rank, es.gradient);
  v.backward.add(K::all_reduce, 1, norm, norm);
  reduces(v.backward);  // embedding gradient
  return v;
}

VocabTraffic mesh_vocab_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                                int rank) {
  expect_family(
      st,
      {Scheme::tp, Scheme::megatron_sp, Scheme::sp, Scheme::tp_sp, Scheme::ulysses, Scheme::ring},
      "mesh_vocab_traffic");
  using K = CollectiveKind;
  const bool msp = st.scheme == Scheme::megatron_sp;
  const int T = st.T, Sp = st.Sp, col = rank % T, row = rank / T;
  const i64 R = m.B * m.S / Sp;  // the row's tokens
  const u64 act = static_cast<u64>(R * m.hidden), Tm1 = static_cast<u64>(T - 1);
  const u64 piece = bytes_of(R * m.hidden / T, es.activation);
  VocabTraffic v;
  TrafficCounters& f = v.forward;
  TrafficCounters& b = v.backward;
  if (T > 1) {
    if (msp) {
      f.add(K::reduce_scatter, 1, Tm1 * piece, Tm1 * piece);  // embedding → pieces
      f.add(K::all_gather, 1, Tm1 * piece, Tm1 * piece);      // LM head input
      b.add(K::all_gather, 2, Tm1 * piece, Tm1 * piece);      // LM head input again; dx
      b.add(K::reduce_scatter, 1, Tm1 * piece, Tm1 * piece);  // LM head input gradient
    } else {
      const u64 ar = all_reduce_bytes(act, T, col, es.activation);
      f.add(K::all_reduce, 1, ar, ar);  // embedding
      b.add(K::all_reduce, 1, ar, ar);  // LM head input gradient
    }
    const u64 stat = bytes_of(R, es.activation);
    f.add(K::all_gather, 1, Tm1 * stat, Tm1 * stat);  // per-token maxima
    const u64 ar = all_reduce_bytes(static_cast<u64>(R), T, col, es.activation);
    f.add(K::all_reduce, 2, ar, ar);  // sum-exp, target logit
  }
  if (Sp > 1) {
    const u64 loss = all_reduce_bytes(1, Sp, row, 8);
    f.add(K::all_reduce, 1, loss, loss);
    const u64 shard =
        all_reduce_bytes(static_cast<u64>(m.vocab / T * m.hidden), Sp, row, es.gradient);
    b.add(K::all_reduce, m.tie_embeddings ? 1 : 2, shard, shard);
  }
  const int n = msp ? T * Sp : Sp, r = msp ? rank : row;
  const u64 norm = all_reduce_bytes(static_cast<u64>(m.hidden), n, r, es.gradient);
  if (n > 1) b.add(K::all_reduce, 1, norm, norm);
  return v;
}

VocabTraffic vocab_traffic(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                           int rank) {
  validate(m, st, {});
  if (rank < 0 || rank >= st.ranks())
    reject("rank=" + std::to_string(rank) + " outside 0.." + std::to_string(st.ranks() - 1));
  check_divides(vocab_shards(st), m.vocab, "the vocabulary shards", "vocab");
  return tsp::strategy_info(st.scheme).vocab_traffic(m, st, es, rank);
}

// ---- Whole-model estimate ---------------------------------------------------------------------

namespace {

// How many ways a strategy splits one layer's attention and MLP weights: as its whole model
// splits the vocabulary rows (vocab_shards).
i64 layer_split(const Strategy& st) {
  return vocab_shards(st);
}

// How many ways a strategy splits the embedding and LM head rows (see cost_model.hpp): as its
// layers, except a TSP whose vocabulary is replicated.
double vocab_split(const Strategy& st, bool tsp_shards_vocab) {
  if (st.scheme == Scheme::tsp && !tsp_shards_vocab) return 1;
  return static_cast<double>(vocab_shards(st));
}

i64 params_per_rank(const Strategy& st, const ModelShape& m, bool tsp_shards_vocab) {
  const i64 split = layer_split(st);
  const i64 layer = (m.attention_params() + m.mlp_params()) / split + 2 * m.hidden;
  i64 vocab = 0;
  if (m.vocab > 0) {
    const i64 vs = static_cast<i64>(vocab_split(st, tsp_shards_vocab));
    if (m.vocab % vs != 0)
      reject("vocab=" + std::to_string(m.vocab) + " is not divisible by the " + std::to_string(vs) +
             " vocabulary shards of " + st.name());
    vocab = (m.tie_embeddings ? 1 : 2) * (m.vocab / vs) * m.hidden + m.hidden;
  }
  return m.layers * layer + vocab;
}

}  // namespace

ParameterState parameter_state_bytes_per_rank(const Strategy& st, const ModelShape& m,
                                              const PrecisionModel& p, bool tsp_shards_vocab) {
  validate(m, st, {});
  ParameterState s;
  s.params = static_cast<double>(params_per_rank(st, m, tsp_shards_vocab));
  s.weights = s.params * p.weight;
  s.gradients = s.params * p.gradient;
  s.master = s.params * p.master;
  s.moments = s.params * p.moments;
  return s;
}

LayerMemoryEstimate layer_memory(const ModelShape& m, const Strategy& st,
                                 const MemoryAssumptions& as) {
  const CostOptions& o = as.tsp;
  validate(m, st, o);
  if (!tsp::strategy_info(st.scheme).device_estimate)
    reject(std::string("the per-device estimate does not model ") + scheme_name(st.scheme) +
           " (its per-rank memory comes from a dry run of its blocks: tsp/layer_measure.hpp)");
  LayerMemoryEstimate e;
  const double h = static_cast<double>(m.hidden), F = static_cast<double>(m.ffn),
               nh = static_cast<double>(m.n_heads), kvd = static_cast<double>(m.kv_dim()),
               BS = static_cast<double>(m.B * m.S), S = static_cast<double>(m.S);
  const double Pa = static_cast<double>(m.attention_params()),
               Pm = static_cast<double>(m.mlp_params());
  const double ea = as.precision.activation, ew = as.precision.weight, eg = as.precision.gradient,
               fp32 = 4;
  // The kept set per token (cost_model.hpp): the norm region (layer input, two norm outputs, MLP
  // input: 4h, and two fp32 rstd), the split region (Q, K, V, attention output, gate, up,
  // silu(gate)·up, fp32 lse) and, with materialized attention, the softmax (n_h·S).
  const double norm_region = 4 * h * ea + 2 * fp32;
  const double split_region = (2 * h + 2 * kvd + 3 * F) * ea + nh * fp32;
  const double scores = as.materialized_attention ? nh * S * ea : 0.0;
  if (st.scheme == Scheme::tsp) {
    const double D = st.D, tok = BS / D, nb = o.head_buckets;
    e.tokens = tok;
    e.params = (Pa + Pm) / D + 2 * h;
    const double extra = (o.keep_attention_shards ? Pa * ew : 0.0) +  // D shards of Pa/D
                         (o.keep_kv ? 2 * BS * kvd * ea : 0.0);
    e.kept = tok * (norm_region + split_region + scores) + extra;
    e.selective = tok * (norm_region + split_region) + extra;
    e.checkpoint = tok * h * ea;
    const double As = Pa / D, Ms = Pm / D, qc = h / D / nb, kc = kvd / D / nb;
    // Attention at its peak (backward): the broadcast shard (unless kept) and this rank's share
    // of its gradient — two of each when overlapping (the next shard arrives, the previous
    // gradient is reduced, while the current ones are used) — the bucket's full-sequence K/V
    // (unless kept) and their gradient; projections and local outputs.
    // Overlapping with head buckets adds the send buffer of the dK/dV reduce-scatter (the
    // next bucket's K/V all-gather lands in the gathered buffer meanwhile).
    const double halves = o.overlap ? 2 : 1;
    const double dkv_apart = o.overlap && !o.keep_kv && o.head_buckets > 1 ? 2 * BS * kc * ea : 0;
    const double attn_comm = (o.keep_attention_shards ? 0 : halves * As * ew) + halves * As * eg +
                             (o.keep_kv ? 0 : 2 * BS * kc * ea) + 2 * BS * kc * ea + dkv_apart;
    const double attn_work = (2 * tok * h + 3 * tok * qc + 4 * tok * kc + 2 * tok * kc * D) * ea;
    // MLP ring: the shard in flight and the next (D > 2), the travelling gradient shards.
    const double mlp_comm =
        ((D > 1 ? Ms : 0) + (D > 2 ? Ms : 0)) * ew + (1 + (D > 1 ? 1 : 0)) * Ms * eg;
    const double mlp_work = (2 * tok * h + 4 * tok * F / D) * ea;
    const bool attn_peak = attn_comm + attn_work >= mlp_comm + mlp_work;
    e.comm = attn_peak ? attn_comm : mlp_comm;
    e.workspace = attn_peak ? attn_work : mlp_work;
    return e;
  }
  const double T = st.T, Sp = st.Sp, tok = BS / Sp;
  e.tokens = tok;
  e.params = (Pa + Pm) / T + 2 * h;
  const bool msp = st.scheme == Scheme::megatron_sp;
  // Korthikanti et al.: without sequence parallelism the norm region is replicated over the TP
  // group; with Megatron-SP everything is divided by T.
  const double norm_share = msp ? T : 1.0;
  e.kept = tok * (norm_region / norm_share + (split_region + scores) / T);
  e.selective = tok * (norm_region / norm_share + split_region / T);
  e.checkpoint = tok * h * ea / norm_share;
  const double kv_l = kvd / T;
  // Attention: SP's gathered K/V and their gradients, and TP's collective buffer of one
  // [tokens, h] activation, are communication; projections and outputs workspace.
  const double tp_buffer = T > 1 ? tok * h * ea : 0.0;
  const double attn_comm = (Sp > 1 ? (2 * tok * kv_l * Sp + 2 * BS * kv_l) * ea : 0.0) + tp_buffer;
  const double attn_work =
      (3 * tok * h / T + 4 * tok * kv_l + 2 * tok * h) * ea + 2 * BS * kv_l * ea - tp_buffer;
  const double mlp_comm = tp_buffer;
  const double mlp_work = (4 * tok * F / T + 2 * tok * h) * ea - tp_buffer;
  const bool attn_peak = attn_comm + attn_work >= mlp_comm + mlp_work;
  e.comm = attn_peak ? attn_comm : mlp_comm;
  e.workspace = attn_peak ? attn_work : mlp_work;
  return e;
}

DeviceMemory device_memory(const ModelShape& m, const Strategy& st, const MemoryAssumptions& as) {
  const LayerMemoryEstimate e = layer_memory(m, st, as);
  if (!(as.logit_bytes >= 0) || as.logit_chunk_tokens < 0 || !(as.framework_overhead >= 0))
    reject("logit_bytes, logit_chunk_tokens and framework_overhead must be >= 0");
  const ParameterState ps =
      parameter_state_bytes_per_rank(st, m, as.precision, as.tsp_shards_vocab);
  const double L = static_cast<double>(m.layers);
  DeviceMemory d;
  d.params = ps.params;
  d.weights = ps.weights;
  d.gradients = ps.gradients;
  d.master = ps.master;
  d.moments = ps.moments;
  switch (as.recompute) {
    case Recompute::none:
      d.activations = L * e.kept;
      break;
    case Recompute::selective:
      d.activations = L * e.selective;
      break;
    case Recompute::full:
      d.activations = L * e.checkpoint + e.kept;
      break;
  }
  // Logits: B·S·V/N per device (tokens or vocabulary split N ways), or a chunk of tokens.
  const double N = st.ranks(), V = static_cast<double>(m.vocab);
  double tokens = static_cast<double>(m.B * m.S) / N, width = V;
  if (st.scheme == Scheme::tsp) {
    if (as.tsp_shards_vocab) width = V / st.D;  // one broadcast head shard at a time
  } else if (st.scheme == Scheme::tp || st.scheme == Scheme::megatron_sp) {
    tokens = static_cast<double>(m.B * m.S);  // every token, vocabulary split over T
    width = V / st.T;
  } else {
    tokens = static_cast<double>(m.B * m.S) / st.Sp;
    width = V / (st.scheme == Scheme::tp_sp ? st.T : 1);
  }
  if (as.logit_chunk_tokens > 0)
    tokens = std::min(tokens, static_cast<double>(as.logit_chunk_tokens));
  d.logits = tokens * width * as.logit_bytes * (as.logit_gradient_in_place ? 1 : 2);
  d.comm = e.comm;
  d.workspace = e.workspace;
  d.overhead = as.framework_overhead;
  return d;
}

// ---- Time per step ---------------------------------------------------------------------------

DeviceModel DeviceModel::from_clock(const std::string& name, const SimClockModel& c) {
  DeviceModel d;
  d.name = name;
  d.peak_flops = c.peak_flops;
  d.mfu = c.mfu;
  d.devices_per_node = c.gpus_per_node;
  d.node = c;
  d.network = c;
  d.network.alpha_s = c.inter_alpha_s;
  d.network.beta_bytes_s = c.inter_beta_bytes_s;
  return d;
}

DeviceModel DeviceModel::mi300x() {
  return from_clock("mi300x", SimClockModel::mi300x_if());
}

DeviceModel DeviceModel::h100() {
  return from_clock("h100", SimClockModel::h100_nvlink());
}

StepTime step_time(const ModelShape& m, const Strategy& st, const DeviceModel& dev,
                   const MemoryAssumptions& a, int total_devices) {
  const int N = st.ranks();
  if (total_devices < 1 || total_devices % N != 0)
    reject("total_devices=" + std::to_string(total_devices) + " is not a positive multiple of " +
           st.name() + "'s " + std::to_string(N) + " ranks");
  if (!(dev.peak_flops > 0) || !(dev.mfu > 0 && dev.mfu <= 1) || !(dev.node.beta_bytes_s > 0) ||
      !(dev.network.beta_bytes_s > 0) || dev.devices_per_node < 1)
    reject("device model " + dev.name + ": peak, β > 0, MFU in (0, 1], devices per node >= 1");
  ElementSizes es;
  es.activation = a.precision.activation;
  es.weight = a.precision.weight;
  es.gradient = a.precision.gradient;
  const LayerTraffic t = layer_traffic(m, st, es);
  const double BS = static_cast<double>(m.B * m.S), h = static_cast<double>(m.hidden),
               L = static_cast<double>(m.layers);
  const double gemm = m.weight_gemm_flops() / N;
  const double core = m.attention_core_flops() / N;
  const double extra = a.recompute == Recompute::full        ? gemm + core
                       : a.recompute == Recompute::selective ? core
                                                             : 0.0;
  const double rate = dev.peak_flops * dev.mfu;
  const double layer_compute = (3 * (gemm + core) + extra) / rate;
  const double head = 3 * 2 * BS * static_cast<double>(m.vocab) * h / N / rate;
  // Which link each axis uses: an axis of the mesh that does not fit in a node crosses nodes.
  const bool mesh = st.scheme == Scheme::tp || st.scheme == Scheme::megatron_sp ||
                    st.scheme == Scheme::tp_sp || st.scheme == Scheme::sp;
  const int first = mesh ? st.T : N;
  const SimClockModel& first_link = first <= dev.devices_per_node ? dev.node : dev.network;
  const SimClockModel& sp_link = N <= dev.devices_per_node ? dev.node : dev.network;
  // Latency: each call's steps by the simulated clock's convention (SimClockModel::latency_steps)
  // on the strategy's widest axis.
  const int axis = std::max(first, mesh ? st.Sp : 1);
  auto steps = [axis](const TrafficCounters& x) {
    double c = 0;
    for (std::size_t k = 0; k < x.by_kind.size(); ++k)
      c += static_cast<double>(x.by_kind[k].calls) *
           SimClockModel::latency_steps(static_cast<CollectiveKind>(k), axis);
    return c;
  };
  const double bwd = t.paper_backward_under(a.recompute);
  // The TP part (exposed) of a mesh strategy is paper_recompute per pass (cost_model.cpp).
  const double tp_bytes = mesh && st.T > 1 ? t.paper_recompute : 0.0;
  const double tp_passes = a.recompute == Recompute::full ? 3.0 : 2.0;
  const double exposed_bytes = tp_bytes * tp_passes;
  const double other_bytes = t.paper_forward + bwd - exposed_bytes;
  const double latency = (steps(t.forward) + steps(t.backward)) * first_link.alpha_s;
  const double exposed = exposed_bytes / first_link.beta_bytes_s;
  const double overlapped = other_bytes / (mesh ? sp_link : first_link).beta_bytes_s + latency;
  StepTime r;
  r.compute = L * layer_compute + head;
  r.comm = L * (exposed + overlapped);
  r.exposed_comm = L * (exposed + std::max(0.0, overlapped - layer_compute));
  r.replicas = total_devices / N;
  if (r.replicas > 1) {
    const double grads =
        parameter_state_bytes_per_rank(st, m, a.precision, a.tsp_shards_vocab).gradients;
    const double ar = 2.0 * (r.replicas - 1) / r.replicas * grads / dev.network.beta_bytes_s;
    const double backward = r.compute * 2.0 / 3.0;
    r.data_parallel = std::max(0.0, ar - backward);
  }
  r.step = r.compute + r.exposed_comm + r.data_parallel;
  r.tokens_per_s = r.replicas * BS / r.step;
  return r;
}

}  // namespace tspemu::tsp::cost
