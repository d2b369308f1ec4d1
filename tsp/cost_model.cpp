#include "tspemu/tsp/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>

#include "tspemu/tsp/strategy.hpp"

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

// The model's own consistency, then the strategy's divisibility rules (strategy.hpp) without the
// zigzag layout's 2·degree | S, which the byte counts do not need.
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
  m.ffn = 4 * 4096;
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
    return std::string(e.title) + " " + std::to_string(T) + "x" + std::to_string(Sp);
  return std::string(e.title) + " " + e.degree_letter + "=" + std::to_string(ranks());
}

// ---- Traffic ----------------------------------------------------------------------------------

u64 Traffic::total_received() const {
  u64 t = 0;
  for (u64 v : received) t += v;
  return t;
}
u64 Traffic::total_sent() const {
  u64 t = 0;
  for (u64 v : sent) t += v;
  return t;
}
void Traffic::add(CollectiveKind k, u64 n, u64 s, u64 r) {
  const auto i = static_cast<std::size_t>(k);
  calls[i] += n;
  sent[i] += n * s;
  received[i] += n * r;
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
  Traffic& f = t.forward;
  f.add(K::broadcast, Du, 0, 0);
  f.sent[static_cast<std::size_t>(K::broadcast)] = Dm1 * shard_w;
  f.received[static_cast<std::size_t>(K::broadcast)] = Dm1 * shard_w;
  f.add(K::all_gather, Du * static_cast<u64>(nb), Dm1 * kv, Dm1 * kv);
  f.add(K::send, Dm1, ring_w, 0);
  f.add(K::recv, Dm1, 0, ring_w);
  // Backward: MLP ring (D-1 weight hops, D gradient hops when D > 1), norm-gradient all-reduce of
  // each block, attention re-broadcast and re-gather unless kept, dK/dV reduce-scatter, dW reduce.
  Traffic& b = t.backward;
  const u64 grad_hops = D > 1 ? Du : 0;
  b.add(K::send, Dm1, ring_w, 0);
  b.add(K::recv, Dm1, 0, ring_w);
  b.add(K::send, grad_hops, ring_g, 0);
  b.add(K::recv, grad_hops, 0, ring_g);
  const u64 ar = all_reduce_bytes(static_cast<u64>(m.hidden), D, p, es.gradient);
  b.add(K::all_reduce, 2, ar, ar);
  if (!o.keep_attention_shards) {
    b.add(K::broadcast, Du, 0, 0);
    b.sent[static_cast<std::size_t>(K::broadcast)] = Dm1 * shard_w;
    b.received[static_cast<std::size_t>(K::broadcast)] = Dm1 * shard_w;
  }
  if (!o.keep_kv) b.add(K::all_gather, Du * static_cast<u64>(nb), Dm1 * kv, Dm1 * kv);
  b.add(K::reduce_scatter, Du * static_cast<u64>(nb), Dm1 * kv, Dm1 * kv);
  // D reduces: this rank sends its partial to the D-1 other owners, receives D-1 partials once.
  b.add(K::reduce, Du, 0, 0);
  b.sent[static_cast<std::size_t>(K::reduce)] = Dm1 * shard_g;
  b.received[static_cast<std::size_t>(K::reduce)] = Dm1 * shard_g;

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
  for (Traffic* pass : {&t.forward, &t.backward}) {
    Traffic& x = *pass;
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
  } else {
    const double block = 2.0 * static_cast<double>(kv_count) * es.activation;
    t.paper_forward = (n - 1.0) * block;
    t.paper_backward = (2.0 * n - 1.0) * (n > 1 ? block : 0.0) + grads;
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

// ---- TSP layer memory: a replay of the arena ---------------------------------------------------

namespace {

constexpr u64 kAlign = 64;

class ArenaReplay {
 public:
  explicit ArenaReplay(std::vector<Allocation>* log) : log_(log) {}

  // Returns a handle for free().
  std::size_t alloc(const std::string& name, Category c, u64 bytes, const std::string& lifetime) {
    const u64 charged = bytes == 0 ? 0 : (bytes + kAlign - 1) / kAlign * kAlign;
    if (logging_) log_->push_back({name, c, bytes, charged, lifetime});
    live_.push_back({c, charged, true});
    if (charged > 0) {
      const auto ci = static_cast<std::size_t>(c);
      current_ += charged;
      cat_[ci] += charged;
      peak_ = std::max(peak_, current_);
      cat_peak_[ci] = std::max(cat_peak_[ci], cat_[ci]);
      for (const std::string& p : active_) phases_[p] = std::max(phases_[p], current_);
    }
    return live_.size() - 1;
  }
  void free(std::size_t h) {
    Live& l = live_[h];
    if (!l.alive) return;
    l.alive = false;
    current_ -= l.charged;
    cat_[static_cast<std::size_t>(l.c)] -= l.charged;
  }
  void enter(const std::string& phase) {
    phases_[phase] = std::max(phases_[phase], current_);
    active_.push_back(phase);
  }
  void leave() { active_.pop_back(); }
  void stop_logging() { logging_ = false; }
  void reset_peaks() {
    peak_ = current_;
    cat_peak_ = cat_;
    phases_.clear();
  }
  PassMemory pass() const { return {cat_peak_, peak_, phases_, cat_}; }
  const CategoryBytes& current() const { return cat_; }

 private:
  struct Live {
    Category c;
    u64 charged;
    bool alive;
  };
  std::vector<Allocation>* log_;
  bool logging_ = true;
  std::vector<Live> live_;
  CategoryBytes cat_{}, cat_peak_{};
  u64 current_ = 0, peak_ = 0;
  std::map<std::string, u64> phases_;
  std::vector<std::string> active_;
};

}  // namespace

TspLayerMemory tsp_layer_memory(const ModelShape& m, int D, const CostOptions& o,
                                const ElementSizes& es, int steps) {
  validate(m, Strategy::tsp(D), o);
  if (steps < 1) reject("steps=" + std::to_string(steps) + " must be >= 1");
  TspLayerMemory out;
  ArenaReplay a(&out.allocations);
  using C = Category;
  const i64 Tl = m.S / D, M = m.B * Tl, Cd = m.hidden, hs = m.head_size();
  const int nb = o.head_buckets;
  const i64 NHl = m.n_heads / D, NKVl = m.n_kv_heads / D, Fl = m.ffn / D;
  const i64 qc = NHl / nb * hs, kc = NKVl / nb * hs;  // one bucket's Q and K widths
  const i64 full_kv = m.B * m.S * kc;                 // [B, S, kc]
  const i64 As = m.attention_params() / D, Ms = m.mlp_params() / D;
  const i64 MC = M * Cd, MF = M * Fl;
  auto A = [&](i64 n) { return bytes_of(n, es.activation); };
  auto W = [&](i64 n) { return bytes_of(n, es.weight); };
  auto G = [&](i64 n) { return bytes_of(n, es.gradient); };

  // TspLayer constructor: TspAttention then TspMlp.
  a.alloc("attention: positions [Tl]", C::other, bytes_of(Tl, es.index), "layer");
  a.alloc("attention: k_positions [S]", C::other, bytes_of(m.S, es.index), "layer");
  a.alloc("attention: weight shard", C::weights, W(As), "layer");
  a.alloc("attention: norm weight [h]", C::weights, W(Cd), "layer");
  a.alloc("mlp: weight shard", C::weights, W(Ms), "layer");
  a.alloc("mlp: norm weight [h]", C::weights, W(Cd), "layer");
  out.resident = a.current();

  // Buffers that live from one step's forward to the next (members of the blocks), released by
  // reset() where the implementation releases them.
  std::vector<std::size_t> layer_mid, attn_kept, mlp_kept;
  auto release = [&](std::vector<std::size_t>& hs_) {
    for (std::size_t h : hs_) a.free(h);
    hs_.clear();
  };
  for (int step = 0; step < steps; ++step) {
    const bool last = step == steps - 1;
    if (last && step > 0) a.reset_peaks();
    // Log only the first step's allocations (later steps repeat them).
    if (step == 1) a.stop_logging();
    // ---- forward: TspLayer::forward resets mid_ first, then each block resets its own.
    release(layer_mid);
    layer_mid.push_back(a.alloc("layer: mid (MLP input) [M, h]", C::activations, A(MC), "step"));
    {
      a.enter("attention");
      release(attn_kept);
      const std::string p = "attention: ";
      attn_kept.push_back(a.alloc(p + "xn [M, h]", C::activations, A(MC), "step"));
      attn_kept.push_back(a.alloc(p + "rstd [M]", C::activations, A(M), "step"));
      attn_kept.push_back(
          a.alloc(p + "att [D][M, NHl·hs]", C::activations, A(D * nb * M * qc), "step"));
      attn_kept.push_back(a.alloc(p + "lse [D][B, NHl, Tl]", C::activations,
                                  A(D * nb * m.B * (NHl / nb) * Tl), "step"));
      std::vector<std::size_t> tmp;
      tmp.push_back(a.alloc(p + "wbuf (broadcast shard)", C::comm, W(As), "attention"));
      tmp.push_back(a.alloc(p + "q [M, qc]", C::workspace, A(M * qc), "attention"));
      tmp.push_back(a.alloc(p + "kv_local [2, M, kc]", C::workspace, A(2 * M * kc), "attention"));
      tmp.push_back(
          a.alloc(p + "kv_gathered [D, 2, M, kc]", C::kv, A(2 * M * kc * D), "attention"));
      tmp.push_back(a.alloc(p + "k_all [B, S, kc]", C::kv, A(full_kv), "attention"));
      tmp.push_back(a.alloc(p + "v_all [B, S, kc]", C::kv, A(full_kv), "attention"));
      if (o.keep_attention_shards)
        attn_kept.push_back(
            a.alloc(p + "kept shards [D] (keep_attention_shards)", C::comm, W(As * D), "step"));
      if (o.keep_kv)
        attn_kept.push_back(a.alloc(p + "kept K/V [D][nb][2, B, S, kc] (keep_kv)", C::kv,
                                    A(full_kv * 2 * D * nb), "step"));
      release(tmp);
      a.leave();
    }
    {
      a.enter("mlp");
      release(mlp_kept);
      const std::string p = "mlp: ";
      mlp_kept.push_back(a.alloc(p + "xn [M, h]", C::activations, A(MC), "step"));
      mlp_kept.push_back(a.alloc(p + "rstd [M]", C::activations, A(M), "step"));
      mlp_kept.push_back(a.alloc(p + "gate [D][M, Fl]", C::activations, A(MF * D), "step"));
      mlp_kept.push_back(a.alloc(p + "up [D][M, Fl]", C::activations, A(MF * D), "step"));
      std::vector<std::size_t> tmp;
      tmp.push_back(a.alloc(p + "h [M, Fl]", C::workspace, A(MF), "mlp"));
      if (D > 1) tmp.push_back(a.alloc(p + "ring[0]", C::comm, W(Ms), "mlp"));
      if (D > 2) tmp.push_back(a.alloc(p + "ring[1]", C::comm, W(Ms), "mlp"));
      release(tmp);
      a.leave();
    }
    if (last) out.forward = a.pass();

    // ---- backward (peaks restarted, as Arena::reset_peaks)
    if (last) a.reset_peaks();
    std::vector<std::size_t> dmid;
    dmid.push_back(a.alloc("layer: dmid [M, h]", C::workspace, A(MC), "backward"));
    {
      a.enter("mlp.backward");
      const std::string p = "mlp.backward: ";
      if (step == 0) {  // allocated once, kept by the block
        a.alloc(p + "grad shard", C::gradients, G(Ms), "layer");
        a.alloc(p + "grad norm [h]", C::gradients, G(Cd), "layer");
      }
      std::vector<std::size_t> tmp;
      tmp.push_back(a.alloc(p + "dxn [M, h]", C::workspace, A(MC), "mlp.backward"));
      for (const char* n : {"h", "dh", "dg", "du"})
        tmp.push_back(a.alloc(p + n + " [M, Fl]", C::workspace, A(MF), "mlp.backward"));
      if (D > 1) tmp.push_back(a.alloc(p + "wring[0]", C::comm, W(Ms), "mlp.backward"));
      if (D > 2) tmp.push_back(a.alloc(p + "wring[1]", C::comm, W(Ms), "mlp.backward"));
      tmp.push_back(a.alloc(p + "gring[0]", C::comm, G(Ms), "mlp.backward"));
      if (D > 1) tmp.push_back(a.alloc(p + "gring[1]", C::comm, G(Ms), "mlp.backward"));
      release(tmp);
      a.leave();
    }
    {
      a.enter("attention.backward");
      const std::string p = "attention.backward: ";
      if (step == 0) {
        a.alloc(p + "grad shard", C::gradients, G(As), "layer");
        a.alloc(p + "grad norm [h]", C::gradients, G(Cd), "layer");
      }
      const std::string l = "attention.backward";
      std::vector<std::size_t> tmp;
      tmp.push_back(
          a.alloc(p + "wbuf (broadcast shard)", C::comm, o.keep_attention_shards ? 0 : W(As), l));
      tmp.push_back(a.alloc(p + "partial dW of shard r", C::comm, G(As), l));
      tmp.push_back(a.alloc(p + "dxn [M, h]", C::workspace, A(MC), l));
      for (const char* n : {"q", "dq", "da"})
        tmp.push_back(a.alloc(p + n + " [M, qc]", C::workspace, A(M * qc), l));
      tmp.push_back(a.alloc(p + "kv_local [2, M, kc]", C::workspace, A(2 * M * kc), l));
      tmp.push_back(a.alloc(p + "dkv_local [2, M, kc]", C::workspace, A(2 * M * kc), l));
      tmp.push_back(a.alloc(p + "kv_gathered [D, 2, M, kc]", C::kv, A(2 * M * kc * D), l));
      tmp.push_back(a.alloc(p + "k_all [B, S, kc]", C::kv, o.keep_kv ? 0 : A(full_kv), l));
      tmp.push_back(a.alloc(p + "v_all [B, S, kc]", C::kv, o.keep_kv ? 0 : A(full_kv), l));
      tmp.push_back(a.alloc(p + "dk_all [B, S, kc]", C::kv, A(full_kv), l));
      tmp.push_back(a.alloc(p + "dv_all [B, S, kc]", C::kv, A(full_kv), l));
      release(tmp);
      a.leave();
    }
    release(dmid);
    if (last) out.backward = a.pass();
  }
  return out;
}

LayerArenaMemory baseline_layer_memory(const ModelShape& m, const Strategy& st,
                                       const ElementSizes& es, int steps) {
  validate(m, st, {});
  if (st.scheme == Scheme::tsp) reject("baseline_layer_memory: use tsp_layer_memory for TSP");
  if (steps < 1) reject("steps=" + std::to_string(steps) + " must be >= 1");
  LayerArenaMemory out;
  ArenaReplay a(&out.allocations);
  using C = Category;
  const bool msp = st.scheme == Scheme::megatron_sp, core = st.attention_core();
  const bool ulysses = st.scheme == Scheme::ulysses;
  const int T = st.T, Sp = st.Sp;
  const i64 Tl = m.S / Sp, M = m.B * Tl, Cd = m.hidden, hs = m.head_size();
  const i64 rows = msp ? Tl / T : Tl;
  const i64 local = m.B * rows * Cd, full = M * Cd;  // block input of this rank; the row's tokens
  const i64 qc = m.n_heads / T * hs, kc = m.n_kv_heads / T * hs, Fl = m.ffn / T;
  const i64 Mk = M * kc, full_kv = m.B * m.S * kc, MF = M * Fl;
  const i64 As = m.attention_params() / T, Ms = m.mlp_params() / T;
  auto A = [&](i64 n) { return bytes_of(n, es.activation); };
  auto W = [&](i64 n) { return bytes_of(n, es.weight); };
  auto G = [&](i64 n) { return bytes_of(n, es.gradient); };
  using Handles = std::vector<std::size_t>;
  auto release = [&](Handles& h) {
    for (std::size_t x : h) a.free(x);
    h.clear();
  };
  // MeshRegion (baseline_region.hpp).
  auto gather_pieces = [&](const std::string& p) {  // all_gather(tp) into a rank-major buffer
    a.free(a.alloc(p + "gathered pieces [T][local]", C::comm, A(local * T), "gather"));
  };
  auto enter = [&](const std::string& p) {
    if (!msp) return;
    const std::size_t piece = a.alloc(p + "normed piece [local]", C::workspace, A(local), "enter");
    gather_pieces(p);
    a.free(piece);
  };
  auto exit = [&](const std::string& p) {
    if (T == 1) return;
    Handles h;
    h.push_back(a.alloc(p + "partial output [M, h]", C::workspace, A(full), "exit"));
    if (msp) {
      h.push_back(a.alloc(p + "reduced piece [local]", C::comm, A(local), "exit"));
      a.free(a.alloc(p + "reduce_scatter send [T][local]", C::comm, A(local * T), "exit"));
    }
    release(h);
  };
  auto enter_backward = [&](const std::string& p, Handles& storage) {
    if (!msp) return;
    storage.push_back(a.alloc(p + "gathered dY [M, h]", C::workspace, A(full), "backward"));
    gather_pieces(p);
  };
  auto exit_backward = [&](const std::string& p) {
    if (!(T > 1 && msp)) return;
    const std::size_t mine = a.alloc(p + "reduced dN piece [local]", C::comm, A(local), "exit");
    a.free(a.alloc(p + "reduce_scatter send [T][local]", C::comm, A(local * T), "exit"));
    a.free(mine);
  };

  // Ulysses / ring (T = 1): the core first (the caller builds it and hands it to the block).
  const i64 qd = m.q_dim(), kvd = m.kv_dim(), lse_count = m.B * m.n_heads * Tl;
  if (ulysses) {
    a.alloc("ulysses core: gathered positions [S]", C::other, bytes_of(m.S, es.index), "layer");
    a.alloc("ulysses core: 0..S-1 [S]", C::other, bytes_of(m.S, es.index), "layer");
  } else if (core) {
    a.alloc("ring core: positions [n, Tl]", C::other, bytes_of(m.S, es.index), "layer");
  }
  a.alloc("attention: positions [Tl]", C::other, bytes_of(Tl, es.index), "layer");
  if (!core) a.alloc("attention: k_positions [S]", C::other, bytes_of(m.S, es.index), "layer");
  a.alloc("attention: weight shard", C::weights, W(As), "layer");
  a.alloc("attention: norm weight [h]", C::weights, W(Cd), "layer");
  a.alloc("mlp: weight shard", C::weights, W(Ms), "layer");
  a.alloc("mlp: norm weight [h]", C::weights, W(Cd), "layer");
  out.resident = a.current();

  // SequenceShardedAttention::backward with its core (Ulysses / ring; T = 1, no MeshRegion).
  auto replay_core_backward = [&](const std::string& p, const std::string& l) {
    Handles tmp, c;
    const std::size_t da = a.alloc(p + "da [M, qd]", C::workspace, A(M * qd), l);
    const std::size_t q = a.alloc(p + "q [M, qd]", C::workspace, A(M * qd), l);
    const std::size_t kv = a.alloc(p + "kv [2, M, kvd]", C::workspace, A(2 * M * kvd), l);
    tmp.push_back(a.alloc(p + "dq [M, qd]", C::workspace, A(M * qd), l));
    tmp.push_back(a.alloc(p + "dkv [2, M, kvd]", C::workspace, A(2 * M * kvd), l));
    if (ulysses) {
      const std::string u = p + "ulysses core: ";
      c.push_back(a.alloc(u + "Qh [B, S, NH/n, hs]", C::workspace, A(M * qd), "core"));
      c.push_back(a.alloc(u + "exchange [B, S, NKV/n, hs]", C::comm, A(M * kvd), "core"));
      for (const char* n : {"Kh", "Vh"})
        c.push_back(a.alloc(u + n + " [B, S, NKV/n, hs]", C::kv, A(M * kvd), "core"));
      for (const char* n : {"dAh", "dQh"})
        c.push_back(a.alloc(u + n + " [B, S, NH/n, hs]", C::workspace, A(M * qd), "core"));
      for (const char* n : {"dKh", "dVh"})
        c.push_back(a.alloc(u + n + " [B, S, NKV/n, hs]", C::kv, A(M * kvd), "core"));
    } else if (Sp > 1) {
      const std::string r = p + "ring core: ";
      c.push_back(a.alloc(r + "delta [B, NH, Tl]", C::workspace, A(lse_count), "core"));
      for (const char* b : {"K/V block (held)", "K/V block (next)", "dK/dV accumulator (held)",
                            "dK/dV accumulator (next)"})
        c.push_back(a.alloc(r + b + " [2, M, kvd]", C::kv, A(2 * M * kvd), "core"));
    }
    release(c);
    for (std::size_t h : {q, kv, da}) a.free(h);  // released before dN
    tmp.push_back(a.alloc(p + "dxn [M, h]", C::workspace, A(full), l));
    release(tmp);
  };

  Handles attn_kept, mlp_kept;
  for (int step = 0; step < steps; ++step) {
    const bool last = step == steps - 1;
    if (last && step > 0) a.reset_peaks();
    if (step == 1) a.stop_logging();
    {
      a.enter("attention");
      release(attn_kept);
      const std::string p = "attention: ";
      attn_kept.push_back(a.alloc(p + "xn [M, h]", C::activations, A(full), "step"));
      attn_kept.push_back(a.alloc(p + "rstd [B·rows]", C::activations, A(m.B * rows), "step"));
      attn_kept.push_back(a.alloc(p + "att [M, qc]", C::activations, A(M * qc), "step"));
      attn_kept.push_back(
          a.alloc(p + "lse [B, NHl, Tl]", C::activations, A(m.B * (m.n_heads / T) * Tl), "step"));
      enter(p);
      Handles tmp;
      tmp.push_back(a.alloc(p + "q [M, qc]", C::workspace, A(M * qc), "attention"));
      tmp.push_back(a.alloc(p + "kv_local [2, M, kc]", C::workspace, A(2 * Mk), "attention"));
      if (core) {
        Handles c;
        if (ulysses) {
          const std::string u = "attention, ulysses core: ";
          c.push_back(a.alloc(u + "Qh [B, S, NH/n, hs]", C::workspace, A(M * qd), "core"));
          c.push_back(a.alloc(u + "exchange [B, S, NKV/n, hs]", C::comm, A(M * kvd), "core"));
          c.push_back(a.alloc(u + "Kh [B, S, NKV/n, hs]", C::kv, A(M * kvd), "core"));
          c.push_back(a.alloc(u + "Vh [B, S, NKV/n, hs]", C::kv, A(M * kvd), "core"));
          c.push_back(a.alloc(u + "Ah [B, S, NH/n, hs]", C::workspace, A(M * qd), "core"));
        } else if (Sp > 1) {
          const std::string r = "attention, ring core: ";
          for (const char* b : {"K/V block [2, M, kvd] (held)", "K/V block [2, M, kvd] (next)"})
            c.push_back(a.alloc(r + b, C::kv, A(2 * M * kvd), "core"));
          c.push_back(a.alloc(r + "partial A [M, qd]", C::workspace, A(M * qd), "core"));
          c.push_back(a.alloc(r + "partial lse [B, NH, Tl]", C::workspace, A(lse_count), "core"));
        }
        release(c);
      } else if (Sp > 1) {
        tmp.push_back(
            a.alloc(p + "kv_gathered [Sp, 2, M, kc]", C::kv, A(2 * Mk * Sp), "attention"));
        tmp.push_back(a.alloc(p + "k_all [B, S, kc]", C::kv, A(full_kv), "attention"));
        tmp.push_back(a.alloc(p + "v_all [B, S, kc]", C::kv, A(full_kv), "attention"));
      }
      exit(p);
      release(tmp);
      a.leave();
    }
    {
      a.enter("mlp");
      release(mlp_kept);
      const std::string p = "mlp: ";
      mlp_kept.push_back(a.alloc(p + "xn [M, h]", C::activations, A(full), "step"));
      mlp_kept.push_back(a.alloc(p + "rstd [B·rows]", C::activations, A(m.B * rows), "step"));
      mlp_kept.push_back(a.alloc(p + "gate [M, Fl]", C::activations, A(MF), "step"));
      mlp_kept.push_back(a.alloc(p + "up [M, Fl]", C::activations, A(MF), "step"));
      enter(p);
      const std::size_t h = a.alloc(p + "h [M, Fl]", C::workspace, A(MF), "mlp");
      exit(p);
      a.free(h);
      a.leave();
    }
    if (last) out.forward = a.pass();

    if (last) a.reset_peaks();
    {
      a.enter("mlp.backward");
      const std::string p = "mlp.backward: ";
      if (step == 0) {
        a.alloc(p + "grad shard", C::gradients, G(Ms), "layer");
        a.alloc(p + "grad norm [h]", C::gradients, G(Cd), "layer");
      }
      Handles storage, tmp;
      enter_backward(p, storage);
      tmp.push_back(a.alloc(p + "h [M, Fl]", C::workspace, A(MF), "mlp.backward"));
      tmp.push_back(a.alloc(p + "dh [M, Fl]", C::workspace, A(MF), "mlp.backward"));
      release(storage);
      tmp.push_back(a.alloc(p + "dg [M, Fl]", C::workspace, A(MF), "mlp.backward"));
      tmp.push_back(a.alloc(p + "du [M, Fl]", C::workspace, A(MF), "mlp.backward"));
      tmp.push_back(a.alloc(p + "dxn [M, h]", C::workspace, A(full), "mlp.backward"));
      exit_backward(p);
      release(tmp);
      a.leave();
    }
    {
      a.enter("attention.backward");
      const std::string p = "attention.backward: ";
      const std::string l = "attention.backward";
      if (step == 0) {
        a.alloc(p + "grad shard", C::gradients, G(As), "layer");
        a.alloc(p + "grad norm [h]", C::gradients, G(Cd), "layer");
      }
      Handles storage, tmp;
      if (core) {
        replay_core_backward(p, l);
      } else {
        enter_backward(p, storage);
        tmp.push_back(a.alloc(p + "da [M, qc]", C::workspace, A(M * qc), l));
        release(storage);
        tmp.push_back(a.alloc(p + "q [M, qc]", C::workspace, A(M * qc), l));
        tmp.push_back(a.alloc(p + "dq [M, qc]", C::workspace, A(M * qc), l));
        tmp.push_back(a.alloc(p + "kv_local [2, M, kc]", C::workspace, A(2 * Mk), l));
        if (Sp > 1) {
          tmp.push_back(a.alloc(p + "kv_gathered [Sp, 2, M, kc]", C::kv, A(2 * Mk * Sp), l));
          tmp.push_back(a.alloc(p + "k_all [B, S, kc]", C::kv, A(full_kv), l));
          tmp.push_back(a.alloc(p + "v_all [B, S, kc]", C::kv, A(full_kv), l));
        }
        tmp.push_back(a.alloc(p + "dk_all [B, S, kc]", C::kv, A(full_kv), l));
        tmp.push_back(a.alloc(p + "dv_all [B, S, kc]", C::kv, A(full_kv), l));
        if (Sp > 1) tmp.push_back(a.alloc(p + "dkv_local [2, M, kc]", C::workspace, A(2 * Mk), l));
        tmp.push_back(a.alloc(p + "dxn [M, h]", C::workspace, A(full), l));
      }
      exit_backward(p);
      release(tmp);
      a.leave();
    }
    if (last) out.backward = a.pass();
  }
  return out;
}

// ---- Whole-model estimate ---------------------------------------------------------------------

namespace {

LayerMemoryEstimate layer_memory_parts(const ModelShape& m, const Strategy& st,
                                       const ElementSizes& es, const CostOptions& o) {
  validate(m, st, o);
  if (!tsp::strategy_info(st.scheme).device_estimate)
    reject(std::string("the per-device estimate does not model ") + scheme_name(st.scheme) +
           " (its layer is replayed exactly by baseline_layer_memory)");
  LayerMemoryEstimate e;
  const double h = static_cast<double>(m.hidden), F = static_cast<double>(m.ffn),
               nh = static_cast<double>(m.n_heads), kvd = static_cast<double>(m.kv_dim()),
               BS = static_cast<double>(m.B * m.S);
  const double Pa = static_cast<double>(m.attention_params()),
               Pm = static_cast<double>(m.mlp_params());
  const double ea = es.activation, fp32 = 4;
  if (st.scheme == Scheme::tsp) {
    const double D = st.D, tok = BS / D, nb = o.head_buckets;
    e.tokens = tok;
    e.params = (Pa + Pm) / D + 2 * h;
    // Layer input, MLP input, two normed inputs, attention output: h each; gate, up: F each;
    // softmax lse (n_h) and two rstd in fp32.
    e.kept = tok * (5 * h + 2 * F) * ea + tok * (nh + 2) * fp32;
    if (o.keep_attention_shards) e.kept += Pa * es.weight;  // D shards of Pa/D (as allocated)
    if (o.keep_kv) e.kept += 2 * BS * kvd * ea;
    e.checkpoint = tok * h * ea;
    const double As = Pa / D, Ms = Pm / D, qc = h / D / nb, kc = kvd / D / nb;
    const double attn = (o.keep_attention_shards ? 0 : As * es.weight) + As * es.gradient +
                        (2 * tok * h + 3 * tok * qc + 4 * tok * kc + 2 * tok * kc * D) * ea +
                        (o.keep_kv ? 0 : 2 * BS * kc * ea) + 2 * BS * kc * ea;
    const double mlp = ((D > 1 ? Ms : 0) + (D > 2 ? Ms : 0)) * es.weight +
                       (1 + (D > 1 ? 1 : 0)) * Ms * es.gradient +
                       (2 * tok * h + 4 * tok * F / D) * ea;
    e.transient = std::max(attn, mlp);
    return e;
  }
  const double T = st.T, Sp = st.Sp, tok = BS / Sp;
  e.tokens = tok;
  e.params = (Pa + Pm) / T + 2 * h;
  const bool msp = st.scheme == Scheme::megatron_sp;
  // Korthikanti et al.: without sequence parallelism the norm inputs/outputs (and the layer
  // input) are replicated over the TP group; with Megatron-SP everything is divided by T.
  const double replicated = 4 * h, sharded = h + 2 * F;
  e.kept = msp ? tok * (replicated + sharded) / T * ea + tok * (nh / T + 2 / T) * fp32
               : tok * (replicated + sharded / T) * ea + tok * (nh / T + 2) * fp32;
  e.checkpoint = msp ? tok * h / T * ea : tok * h * ea;
  const double kv_l = kvd / T;
  const double attn = (3 * tok * h / T + 4 * tok * kv_l + 2 * tok * h) * ea +
                      (Sp > 1 ? (2 * tok * kv_l * Sp + 2 * BS * kv_l) * ea : 0.0) +
                      2 * BS * kv_l * ea;
  const double mlp = (4 * tok * F / T + 2 * tok * h) * ea;
  e.transient = std::max(attn, mlp);
  return e;
}

}  // namespace

LayerMemoryEstimate layer_memory(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                                 const CostOptions& o) {
  LayerMemoryEstimate e = layer_memory_parts(m, st, es, o);
  e.weights = e.params * es.weight;
  e.gradients = e.params * es.gradient;
  e.optimizer = e.params * es.optimizer_per_param;
  return e;
}

DeviceMemory device_memory(const ModelShape& m, const Strategy& st, const ElementSizes& es,
                           Recompute rc, const CostOptions& o) {
  const LayerMemoryEstimate e = layer_memory(m, st, es, o);
  const double L = static_cast<double>(m.layers), h = static_cast<double>(m.hidden);
  const double vocab_rows =
      static_cast<double>((m.tie_embeddings ? 1 : 2) * m.vocab) * h;  // embedding (+ head)
  const double shard = st.scheme == Scheme::tsp ? st.D : st.scheme == Scheme::sp ? 1 : st.T;
  DeviceMemory d;
  d.params = L * e.params + vocab_rows / shard + h;
  d.weights = d.params * es.weight;
  d.gradients = d.params * es.gradient;
  d.optimizer = d.params * es.optimizer_per_param;
  d.activations = rc == Recompute::none ? L * e.kept : L * e.checkpoint + e.kept;
  d.transient = e.transient;
  return d;
}

}  // namespace tspemu::tsp::cost
