#include "tspemu/plan/decode_cost.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace tspemu::tsp::cost {

namespace {

using u64 = std::uint64_t;
using i64 = std::int64_t;
using Group = DecodeCollective::Group;
using K = CollectiveKind;

constexpr u64 kLseBytes = 4;  // the log-sum-exp is kept in fp32 whatever β

u64 U(i64 v) {
  return static_cast<u64>(v);
}

[[noreturn]] void refuse(const DecodeStrategy& st, const std::string& why) {
  throw std::invalid_argument("decode cost, " + st.name() + ": " + why);
}

// KV heads one rank of a head-sharding degree n holds: n_kv / n, or 1 (duplicated) past n = n_kv.
i64 kv_heads_at(const ModelShape& m, int n) {
  return n <= m.n_kv_heads ? m.n_kv_heads / n : 1;
}

void check_head_degree(const ModelShape& m, const DecodeStrategy& st, int n, const char* name) {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) refuse(st, std::string(name) + "=" + std::to_string(n) + " " + what);
  };
  need(m.n_heads % n == 0, "must divide n_heads=" + std::to_string(m.n_heads));
  need(m.ffn % n == 0, "must divide ffn=" + std::to_string(m.ffn));
  if (n <= m.n_kv_heads)
    need(m.n_kv_heads % n == 0,
         "<= n_kv_heads=" + std::to_string(m.n_kv_heads) + " must divide it");
  else
    need(n % m.n_kv_heads == 0,
         "> n_kv_heads=" + std::to_string(m.n_kv_heads) + " must be a multiple of it");
}

i64 ceil_div(i64 a, i64 b) {
  return (a + b - 1) / b;
}

// The vocabulary's rows per rank (padded to a multiple of the shards).
i64 vocab_rows(const ModelShape& m, const DecodeStrategy& st) {
  switch (st.scheme) {
    case DecodeScheme::tp:
    case DecodeScheme::megatron_sp:
    case DecodeScheme::tp_sp:
      return ceil_div(m.vocab, st.T);
    case DecodeScheme::sp:
      return m.vocab;
    case DecodeScheme::helix:
      return ceil_div(m.vocab, st.ranks());
    case DecodeScheme::tsp_m:
    case DecodeScheme::tsp_w:
      return ceil_div(m.vocab, st.D);
  }
  return m.vocab;
}

i64 layer_params_per_rank(const ModelShape& m, const DecodeStrategy& st) {
  const i64 h = m.hidden, d = m.head_size(), norms = 2 * h;
  const i64 wq = h * m.q_dim(), wo = m.q_dim() * h;
  switch (st.scheme) {
    case DecodeScheme::tp:
    case DecodeScheme::megatron_sp:
    case DecodeScheme::tp_sp:
      return (wq + wo) / st.T + 2 * h * d * kv_heads_at(m, st.T) + m.mlp_params() / st.T + norms;
    case DecodeScheme::sp:
      return m.attention_params() + m.mlp_params() + norms;
    case DecodeScheme::helix:
      return wq / st.T + 2 * h * d * kv_heads_at(m, st.T) + wo / st.ranks() +
             m.mlp_params() / st.ranks() + norms;
    case DecodeScheme::tsp_m:
    case DecodeScheme::tsp_w:
      return (m.attention_params() + m.mlp_params()) / st.D + norms;
  }
  return 0;
}

double share(K kind, int n) {
  if (n <= 1) return 0;
  const double f = (n - 1.0) / n;
  return kind == K::all_reduce ? 2 * f : f;
}

struct Builder {
  std::vector<DecodeCollective>& out;
  // payload in elements of `eb` bytes; the ring share of an all_reduce, an all_gather (payload =
  // its output), an all_to_all (payload = one rank's input), a broadcast or the route.
  DecodeCollective& add(std::string what, K kind, int n, Group axis, u64 calls, u64 elements,
                        u64 eb, bool per_layer = true) {
    DecodeCollective c;
    c.what = std::move(what);
    c.kind = kind;
    c.group = n;
    c.axis = axis;
    c.calls = calls;
    c.payload = elements * eb;
    c.element_bytes = eb;
    c.per_device = share(kind, n) * static_cast<double>(c.payload);
    c.per_layer = per_layer;
    out.push_back(c);
    return out.back();
  }
  void lse(std::string what, K kind, int n, Group axis, u64 calls, u64 elements, bool packed) {
    DecodeCollective& c = add(std::move(what), kind, n, axis, calls, elements, kLseBytes);
    c.lse = true;
    c.packed = packed;
  }
};

// The vocabulary-parallel embedding (all-reduce of [B, h]) and LM head (all-gather of the
// [B, rows] logit blocks) over n ranks.
void vocab_parallel(Builder& b, int n, Group axis, u64 B, const ModelShape& m, i64 rows, u64 beta) {
  if (n <= 1) return;
  b.add("embedding all-reduce", K::all_reduce, n, axis, 1, B * U(m.hidden), beta, false);
  b.add("LM head logits all-gather", K::all_gather, n, axis, 1, U(n) * B * U(rows), beta, false);
}

// Megatron-SP over T ranks for a step of `tokens` new token rows of B sequences: the rows padded
// to Np = ceil(tokens / T)·T; embedding reduce-scatter, per layer an all-gather before each of
// the two column-parallel blocks and a reduce-scatter after each row-parallel one, and before the
// LM head an all-gather of the rows then TP's logits all-gather of [B, V/T].
void megatron_sp_collectives(Builder& b, int T, u64 tokens, u64 B, const ModelShape& m, i64 rows,
                             u64 beta) {
  if (T <= 1) return;
  const u64 h = U(m.hidden), Np = U(ceil_div(static_cast<i64>(tokens), T)) * U(T);
  b.add("QKV input all-gather", K::all_gather, T, Group::tp, 1, Np * h, beta);
  b.add("W_O reduce-scatter", K::reduce_scatter, T, Group::tp, 1, Np * h, beta);
  b.add("MLP input all-gather", K::all_gather, T, Group::tp, 1, Np * h, beta);
  b.add("MLP down reduce-scatter", K::reduce_scatter, T, Group::tp, 1, Np * h, beta);
  b.add("embedding reduce-scatter", K::reduce_scatter, T, Group::tp, 1, Np * h, beta, false);
  b.add("LM head input all-gather", K::all_gather, T, Group::tp, 1, Np * h, beta, false);
  b.add("LM head logits all-gather", K::all_gather, T, Group::tp, 1, U(T) * B * U(rows), beta,
        false);
}

std::vector<DecodeCollective> decode_collectives(const ModelShape& m, const DecodeStrategy& st,
                                                 u64 B, u64 beta) {
  std::vector<DecodeCollective> v;
  Builder b{v};
  const u64 h = U(m.hidden), nh = U(m.n_heads);
  const i64 rows = vocab_rows(m, st);
  switch (st.scheme) {
    case DecodeScheme::tp:
      if (st.T > 1) {
        b.add("W_O all-reduce", K::all_reduce, st.T, Group::tp, 1, B * h, beta);
        b.add("MLP down all-reduce", K::all_reduce, st.T, Group::tp, 1, B * h, beta);
      }
      vocab_parallel(b, st.T, Group::tp, B, m, rows, beta);
      break;
    case DecodeScheme::megatron_sp:
      megatron_sp_collectives(b, st.T, B, B, m, rows, beta);
      break;
    case DecodeScheme::sp:
    case DecodeScheme::tp_sp: {
      const int T = st.T, S = st.Sp;
      if (T > 1) {
        b.add("W_O all-reduce", K::all_reduce, T, Group::tp, 1, B * h, beta);
        b.add("MLP down all-reduce", K::all_reduce, T, Group::tp, 1, B * h, beta);
      }
      if (S > 1) {
        b.lse("LSE all-gather", K::all_gather, S, Group::sp, 1, U(S) * B * nh / U(T), false);
        b.add("attention output all-reduce", K::all_reduce, S, Group::sp, 1, B * h / U(T), beta);
      }
      vocab_parallel(b, T, Group::tp, B, m, rows, beta);
      break;
    }
    case DecodeScheme::helix: {
      const int kvp = st.Sp, tpa = st.T, N = st.ranks();
      if (kvp > 1) {
        b.add("partials all-to-all", K::all_to_all, kvp, Group::sp, 1, B * h / U(tpa), beta);
        b.lse("LSE (with the partials)", K::all_to_all, kvp, Group::sp, 1, B * nh / U(tpa), true);
      }
      if (N > 1) {
        b.add("W_O all-reduce", K::all_reduce, N, Group::all, 1, B * h, beta);
        b.add("MLP down all-reduce", K::all_reduce, N, Group::all, 1, B * h, beta);
      }
      vocab_parallel(b, N, Group::all, B, m, rows, beta);
      break;
    }
    case DecodeScheme::tsp_m: {
      const int D = st.D;
      if (D <= 1) break;
      const u64 Du = U(D);
      b.add("attention shard broadcast", K::broadcast, D, Group::all, Du,
            U(m.attention_params()) / Du, beta);
      DecodeCollective& hop =
          b.add("MLP shard ring hop", K::send, D, Group::all, Du - 1, U(m.mlp_params()) / Du, beta);
      hop.per_device = static_cast<double>(hop.payload);  // every rank sends one shard per hop
      b.add("Q all-gather (per head shard)", K::all_gather, D, Group::all, Du, B * h / Du, beta);
      b.add("partials all-to-all (per head shard)", K::all_to_all, D, Group::all, Du, B * h / Du,
            beta);
      b.lse("LSE (with the partials)", K::all_to_all, D, Group::all, Du, B * nh / Du, true);
      const u64 shard = U(rows) * h;
      b.add("embedding shard broadcast", K::broadcast, D, Group::all, Du, shard, beta, false);
      // Tied: the embedding's shards again (the training forward broadcasts them twice).
      b.add("LM head shard broadcast", K::broadcast, D, Group::all, Du, shard, beta, false);
      // The owners' logits to every rank (each samples): the one step beyond training's forward.
      b.add("logits all-gather", K::all_gather, D, Group::all, 1, B * U(m.vocab), beta, false);
      break;
    }
    case DecodeScheme::tsp_w: {
      const int D = st.D;
      if (D <= 1) break;
      b.add("Q all-gather", K::all_gather, D, Group::all, 1, B * h, beta);
      b.add("K/V route to owners", K::send, D, Group::all, 1, 2 * B * U(m.kv_dim()) / U(D), beta);
      b.add("partials all-to-all", K::all_to_all, D, Group::all, 1, B * h, beta);
      b.lse("LSE (with the partials)", K::all_to_all, D, Group::all, 1, B * nh, true);
      b.add("W_O all-reduce", K::all_reduce, D, Group::all, 1, B * h, beta);
      b.add("MLP down all-reduce", K::all_reduce, D, Group::all, 1, B * h, beta);
      vocab_parallel(b, D, Group::all, B, m, rows, beta);
      break;
    }
  }
  return v;
}

}  // namespace

const char* decode_scheme_name(DecodeScheme s) {
  switch (s) {
    case DecodeScheme::tp:
      return "TP";
    case DecodeScheme::megatron_sp:
      return "Megatron-SP";
    case DecodeScheme::sp:
      return "SP";
    case DecodeScheme::tp_sp:
      return "TP+SP";
    case DecodeScheme::helix:
      return "Helix";
    case DecodeScheme::tsp_m:
      return "TSP-M";
    case DecodeScheme::tsp_w:
      return "TSP-W";
  }
  return "?";
}

int DecodeStrategy::token_shards() const {
  switch (scheme) {
    case DecodeScheme::tp:
    case DecodeScheme::megatron_sp:
      return 1;
    case DecodeScheme::sp:
    case DecodeScheme::tp_sp:
    case DecodeScheme::helix:
      return Sp;
    case DecodeScheme::tsp_m:
    case DecodeScheme::tsp_w:
      return D;
  }
  return 1;
}

int DecodeStrategy::head_shards() const {
  return scheme == DecodeScheme::tp || scheme == DecodeScheme::megatron_sp ||
                 scheme == DecodeScheme::tp_sp || scheme == DecodeScheme::helix
             ? T
             : 1;
}

std::string DecodeStrategy::name() const {
  std::string s = decode_scheme_name(scheme);
  switch (scheme) {
    case DecodeScheme::tp:
    case DecodeScheme::megatron_sp:
      return s + " T=" + std::to_string(T);
    case DecodeScheme::sp:
      return s + " Σ=" + std::to_string(Sp);
    case DecodeScheme::tp_sp:
      return s + " T=" + std::to_string(T) + "×Σ=" + std::to_string(Sp);
    case DecodeScheme::helix:
      return s + " KVP=" + std::to_string(Sp) + "×TP_A=" + std::to_string(T);
    case DecodeScheme::tsp_m:
    case DecodeScheme::tsp_w:
      return s + " D=" + std::to_string(D);
  }
  return s;
}

std::vector<DecodeStrategy> decode_strategies_at(int n) {
  std::vector<DecodeStrategy> v{DecodeStrategy::tp(n), DecodeStrategy::sp(n)};
  for (int t = 2; t < n; ++t)
    if (n % t == 0) v.push_back(DecodeStrategy::tp_sp(t, n / t));
  for (int kvp = n; kvp >= 2; --kvp)
    if (n % kvp == 0) v.push_back(DecodeStrategy::helix(kvp, n / kvp));
  v.push_back(DecodeStrategy::tsp_m(n));
  v.push_back(DecodeStrategy::tsp_w(n));
  return v;
}

void check_decode_shape(const ModelShape& m, const DecodeStrategy& st) {
  if (st.T < 1 || st.Sp < 1 || st.D < 1) refuse(st, "degrees must be >= 1");
  if (m.hidden < 1 || m.n_heads < 1 || m.n_kv_heads < 1 || m.layers < 1 || m.ffn < 1 ||
      m.vocab < 0 || m.hidden % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0)
    refuse(st, "the model's shape is invalid (hidden, heads, kv heads, ffn, layers)");
  switch (st.scheme) {
    case DecodeScheme::tp:
    case DecodeScheme::megatron_sp:
    case DecodeScheme::tp_sp:
      check_head_degree(m, st, st.T, "T");
      break;
    case DecodeScheme::sp:
      break;
    case DecodeScheme::helix:
      check_head_degree(m, st, st.T, "TP_A");
      if (m.n_heads % st.ranks() != 0 || m.ffn % st.ranks() != 0)
        refuse(st, "N=" + std::to_string(st.ranks()) + " must divide n_heads=" +
                       std::to_string(m.n_heads) + " and ffn=" + std::to_string(m.ffn));
      break;
    case DecodeScheme::tsp_m:
    case DecodeScheme::tsp_w:
      if (m.n_heads % st.D != 0 || m.kv_dim() % st.D != 0 || m.ffn % st.D != 0)
        refuse(st, "D=" + std::to_string(st.D) +
                       " must divide n_heads=" + std::to_string(m.n_heads) + ", the K/V width " +
                       std::to_string(m.kv_dim()) + " and ffn=" + std::to_string(m.ffn));
      break;
  }
}

double DecodeCost::comm_per_layer(bool with_lse) const {
  double s = 0;
  for (const DecodeCollective& c : comm)
    if (c.per_layer && (with_lse || !c.lse)) s += static_cast<double>(c.calls) * c.per_device;
  return s;
}

double DecodeCost::comm_per_step() const {
  return static_cast<double>(layers) * comm_per_layer(false);
}

double DecodeCost::lse_per_step() const {
  return static_cast<double>(layers) * (comm_per_layer(true) - comm_per_layer(false));
}

double DecodeCost::vocab_per_step() const {
  double s = 0;
  for (const DecodeCollective& c : comm)
    if (!c.per_layer) s += static_cast<double>(c.calls) * c.per_device;
  return s;
}

std::uint64_t DecodeCost::layer_collectives() const {
  u64 n = 0;
  for (const DecodeCollective& c : comm)
    if (c.per_layer && !c.packed) n += c.calls;
  return n;
}

std::uint64_t kv_bytes_per_token_layer(const ModelShape& m, const DecodeStrategy& st,
                                       std::uint64_t beta) {
  const i64 held = st.head_shards() > 1 ? kv_heads_at(m, st.head_shards()) : m.n_kv_heads;
  return 2 * U(m.head_size()) * U(held) * beta;
}

DecodeCost decode_cost(const ModelShape& m, const DecodeStrategy& st,
                       const std::vector<std::int64_t>& lengths, std::uint64_t beta) {
  check_decode_shape(m, st);
  if (lengths.empty()) refuse(st, "a batch of at least one sequence is needed");
  for (i64 s : lengths)
    if (s < 1) refuse(st, "a cached length S_b=" + std::to_string(s) + " must be >= 1");
  DecodeCost c;
  c.st = st;
  c.layers = U(m.layers);
  c.layer_params = U(layer_params_per_rank(m, st));
  const u64 rows = U(vocab_rows(m, st)), h = U(m.hidden);
  c.vocab_params = m.vocab == 0 ? 0 : (m.tie_embeddings ? 1 : 2) * rows * h + h;
  c.weight_bytes = (c.layers * c.layer_params + c.vocab_params) * beta;
  const u64 shards_params = U(m.attention_params() + m.mlp_params()) / U(std::max(st.D, 1));
  if (st.scheme == DecodeScheme::tsp_m && st.D > 1) c.buffer_bytes = shards_params * beta;
  const int hs = st.head_shards();
  c.kv_heads_held = hs > 1 ? kv_heads_at(m, hs) : m.n_kv_heads;
  c.kv_duplication = static_cast<double>(c.kv_heads_held * hs) / static_cast<double>(m.n_kv_heads);
  for (i64 s : lengths) c.kv_tokens += U(ceil_div(s, st.token_shards()));
  c.kv_bytes_per_layer = kv_bytes_per_token_layer(m, st, beta) * c.kv_tokens;
  c.kv_bytes = c.layers * c.kv_bytes_per_layer;
  // TSP-M: every shard passes through every rank's GEMMs, the whole model is read each step.
  const u64 all_vocab = m.vocab == 0 ? 0 : U(m.vocab_params());
  const u64 read_weights = st.scheme == DecodeScheme::tsp_m
                               ? (c.layers * U(m.layer_params()) + all_vocab) * beta
                               : c.weight_bytes;
  c.hbm_read_bytes = read_weights + c.kv_bytes;
  c.comm = decode_collectives(m, st, U(static_cast<i64>(lengths.size())), beta);
  return c;
}

std::int64_t decode_max_context(const ModelShape& m, const DecodeStrategy& st, std::uint64_t budget,
                                std::uint64_t beta) {
  const DecodeCost c = decode_cost(m, st, {1}, beta);
  const u64 fixed = c.weight_bytes + c.buffer_bytes;
  if (fixed >= budget) return 0;
  const u64 per_token = U(m.layers) * kv_bytes_per_token_layer(m, st, beta);
  return static_cast<i64>((budget - fixed) / per_token) * st.token_shards();
}

double prefill_elements(const ModelShape& m, const DecodeStrategy& st) {
  switch (st.scheme) {
    case DecodeScheme::tp:
      return paper_forward_elements(m, Strategy::tp(st.T));
    case DecodeScheme::megatron_sp:
      return paper_forward_elements(m, Strategy::megatron_sp(st.T));
    case DecodeScheme::sp:
      return paper_forward_elements(m, Strategy::sp(st.Sp));
    case DecodeScheme::tp_sp:
    case DecodeScheme::helix:
      return paper_forward_elements(m, Strategy::tp_sp(st.T, st.Sp));
    case DecodeScheme::tsp_m:
    case DecodeScheme::tsp_w:
      return paper_forward_elements(m, Strategy::tsp(st.D));
  }
  return 0;
}

// ---- Runtime counting -------------------------------------------------------------------------

TspwStageTraffic tspw_decode_stage_traffic(const ModelShape& m, int D,
                                           const std::vector<int>& owners, std::uint64_t beta,
                                           int rank, const TspwDecodeOptions& opt) {
  const DecodeStrategy st = DecodeStrategy::tsp_w(D);
  check_decode_shape(m, st);
  if (rank < 0 || rank >= D) refuse(st, "rank " + std::to_string(rank) + " is not in [0, D)");
  if (owners.empty()) refuse(st, "a batch of at least one new token is needed");
  std::vector<u64> owned(static_cast<std::size_t>(D), 0);
  for (int o : owners) {
    if (o < 0 || o >= D) refuse(st, "owner rank " + std::to_string(o) + " is not in [0, D)");
    ++owned[static_cast<std::size_t>(o)];
  }
  TspwStageTraffic t;
  if (D == 1) return t;
  if (opt.vocab && m.vocab % D != 0)
    refuse(st, "D must divide the vocabulary " + std::to_string(m.vocab) +
                   " for the LM head's all-gather");
  const u64 L = U(m.layers), B = U(static_cast<i64>(owners.size())), Du = U(D), Dm1 = Du - 1;
  const u64 h = U(m.hidden), nh = U(m.n_heads);
  const u64 q_block = B * (h / Du) * beta;
  t.q_gather.add(K::all_gather, L, Dm1 * q_block, Dm1 * q_block);
  const u64 slice = 2 * (U(m.kv_dim()) / Du) * beta;  // one token's K and V head slice
  if (opt.route == KvRoute::all_gather) {
    t.kv_route.add(K::all_gather, L, Dm1 * B * slice, Dm1 * B * slice);
  } else {
    for (int o = 0; o < D; ++o)
      if (o != rank && owned[static_cast<std::size_t>(o)] > 0)
        t.kv_route.add(K::send, L, owned[static_cast<std::size_t>(o)] * slice, 0);
    if (const u64 mine = owned[static_cast<std::size_t>(rank)]; mine > 0)
      t.kv_route.add(K::recv, L * Dm1, 0, mine * slice);
  }
  const u64 out_block = B * (h / Du) * beta, lse_block = B * (nh / Du) * kLseBytes;
  if (opt.lse_packed) {
    t.partials.add(K::all_to_all, L, Dm1 * (out_block + lse_block), Dm1 * (out_block + lse_block));
  } else {
    t.partials.add(K::all_to_all, L, Dm1 * out_block, Dm1 * out_block);
    t.partials.add(K::all_to_all, L, Dm1 * lse_block, Dm1 * lse_block);
  }
  const u64 ar = all_reduce_bytes(B * h, D, rank, static_cast<double>(beta));
  t.o_proj.add(K::all_reduce, L, ar, ar);
  t.mlp.add(K::all_reduce, L, ar, ar);
  if (!opt.vocab) return t;
  t.embedding.add(K::all_reduce, 1, ar, ar);
  const u64 logits = B * U(m.vocab / D) * beta;
  t.lm_head.add(K::all_gather, 1, Dm1 * logits, Dm1 * logits);
  return t;
}

TrafficCounters tspw_decode_layer_traffic(const ModelShape& m, int D,
                                          const std::vector<int>& owners, std::uint64_t beta,
                                          int rank, const TspwDecodeOptions& opt) {
  ModelShape one = m;
  one.layers = 1;
  TspwDecodeOptions layer = opt;
  layer.vocab = false;
  return tspw_decode_stage_traffic(one, D, owners, beta, rank, layer).total();
}

TrafficCounters tspw_decode_step_traffic(const ModelShape& m, int D, const std::vector<int>& owners,
                                         std::uint64_t beta, int rank,
                                         const TspwDecodeOptions& opt) {
  return tspw_decode_stage_traffic(m, D, owners, beta, rank, opt).total();
}

TrafficCounters decode_step_traffic(const ModelShape& m, const DecodeStrategy& st, std::int64_t B,
                                    std::uint64_t beta, int rank) {
  TrafficCounters t;
  for (const DecodeStageTraffic& s : decode_stage_traffic(m, st, B, beta, rank)) t += s.traffic;
  return t;
}

// ---- Per-stage counts of the mesh schedules
// -------------------------------------------------------

namespace {

// The runtime's counts of `comm` (decode_cost's collectives) on `rank`, one stage per entry that
// makes calls of its own (a packed entry adds its bytes to the stage before it).
std::vector<DecodeStageTraffic> stages_of(const std::vector<DecodeCollective>& comm, u64 layers,
                                          const DecodeStrategy& st, int rank) {
  const int col = rank % st.T, row = rank / st.T;
  std::vector<DecodeStageTraffic> stages;
  for (const DecodeCollective& e : comm) {
    const int idx = e.axis == Group::tp ? col : e.axis == Group::sp ? row : rank;
    const u64 n = U(e.group), times = e.per_layer ? layers : 1;
    u64 sent = 0, received = 0;
    if (e.kind == K::all_reduce) {
      sent = received = all_reduce_bytes(e.payload / e.element_bytes, e.group, idx,
                                         static_cast<double>(e.element_bytes));
    } else {  // all_gather (payload: the output), all_to_all (payload: one rank's input),
              // reduce_scatter (payload: one rank's input)
      sent = received = (n - 1) * (e.payload / n);
    }
    if (e.packed && !stages.empty()) {  // rides in the previous call: its bytes, no call
      TrafficCounters::Entry& p = stages.back().traffic[stages.back().kind];
      p.bytes_sent += times * e.calls * sent;
      p.bytes_received += times * e.calls * received;
      continue;
    }
    DecodeStageTraffic s{e.what, e.kind, {}};
    s.traffic.add(e.kind, times * e.calls, sent, received);
    stages.push_back(std::move(s));
  }
  return stages;
}

void check_rank(const DecodeStrategy& st, int rank) {
  if (rank < 0 || rank >= st.ranks())
    refuse(st,
           "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(st.ranks()) + ")");
}

// `calls` calls of kind k moving `sent` and `received` bytes in all (calls of unequal sizes).
void add_total(TrafficCounters& t, K k, u64 calls, u64 sent, u64 received) {
  TrafficCounters::Entry& e = t[k];
  e.calls += calls;
  e.bytes_sent += sent;
  e.bytes_received += received;
}

u64 prompt_tokens(const DecodeStrategy& st, const std::vector<i64>& lengths) {
  if (lengths.empty()) refuse(st, "a batch of at least one prompt is needed");
  u64 n = 0;
  for (i64 p : lengths) {
    if (p < 1) refuse(st, "a prompt length P_b=" + std::to_string(p) + " must be >= 1");
    n += U(p);
  }
  return n;
}

}  // namespace

std::vector<DecodeStageTraffic> decode_stage_traffic(const ModelShape& m, const DecodeStrategy& st,
                                                     std::int64_t B, std::uint64_t beta, int rank) {
  if (st.tsp())
    refuse(st,
           "use tspw_decode_step_traffic or tspm_decode_stage_traffic (TSP: the token owners "
           "decide the counts)");
  if (B < 1) refuse(st, "B=" + std::to_string(B) + " must be >= 1");
  check_rank(st, rank);
  const DecodeCost c = decode_cost(m, st, std::vector<i64>(static_cast<std::size_t>(B), 1), beta);
  return stages_of(c.comm, c.layers, st, rank);
}

// ---- Prefill runtime counting ------------------------------------------------------------------

std::vector<DecodeStageTraffic> megatron_sp_prefill_stage_traffic(
    const ModelShape& m, int T, const std::vector<std::int64_t>& lengths, std::uint64_t beta,
    int rank) {
  const DecodeStrategy st = DecodeStrategy::megatron_sp(T);
  check_decode_shape(m, st);
  check_rank(st, rank);
  const u64 tokens = prompt_tokens(st, lengths);
  std::vector<DecodeCollective> comm;
  Builder b{comm};
  megatron_sp_collectives(b, T, tokens, U(static_cast<i64>(lengths.size())), m, vocab_rows(m, st),
                          beta);
  return stages_of(comm, U(m.layers), st, rank);
}

const char* sp_prefill_name(SpPrefill p) {
  switch (p) {
    case SpPrefill::pass_q:
      return "pass-Q";
    case SpPrefill::ring:
      return "ring pass-KV";
    case SpPrefill::ulysses:
      return "Ulysses";
  }
  return "?";
}

std::vector<DecodeStageTraffic> sp_prefill_stage_traffic(
    const ModelShape& m, int Sp, SpPrefill kind, const std::vector<std::int64_t>& lengths,
    const std::vector<std::int64_t>& tokens_per_rank, std::uint64_t beta, int rank) {
  const DecodeStrategy st = DecodeStrategy::sp(Sp);
  check_decode_shape(m, st);
  check_rank(st, rank);
  const u64 N = prompt_tokens(st, lengths), B = U(static_cast<i64>(lengths.size()));
  const u64 L = U(m.layers), h = U(m.hidden), hs = U(m.head_size()), n = U(Sp);
  if (kind == SpPrefill::ulysses && (m.n_heads % Sp != 0 || m.n_kv_heads % Sp != 0))
    refuse(st, "Ulysses prefill: Σ=" + std::to_string(Sp) + " must divide n_heads=" +
                   std::to_string(m.n_heads) + " and n_kv_heads=" + std::to_string(m.n_kv_heads));
  if (kind == SpPrefill::ring) {
    if (tokens_per_rank.size() != n)
      refuse(st, "ring prefill: " + std::to_string(tokens_per_rank.size()) +
                     " token counts for Σ=" + std::to_string(Sp) + " ranks");
    u64 sum = 0;
    for (i64 t : tokens_per_rank) sum += t < 0 ? N + 1 : U(t);
    if (sum != N) refuse(st, "ring prefill: the ranks' token counts do not sum to the prompts'");
  }
  std::vector<DecodeStageTraffic> stages;
  if (Sp == 1) return stages;
  auto stage = [&stages](const char* what, K kind_) -> TrafficCounters& {
    stages.push_back({what, kind_, {}});
    return stages.back().traffic;
  };
  switch (kind) {
    case SpPrefill::pass_q: {
      const u64 lse = (n - 1) * N * U(m.n_heads) * kLseBytes;
      stage("LSE all-gather", K::all_gather).add(K::all_gather, L, lse, lse);
      const u64 ar = all_reduce_bytes(N * h, Sp, rank, static_cast<double>(beta));
      stage("attention output all-reduce", K::all_reduce).add(K::all_reduce, L, ar, ar);
      return stages;
    }
    case SpPrefill::ring: {
      const u64 block = 2 * U(m.kv_dim()) * beta;  // one token's K and V, all KV heads
      const auto at = [&](int p) { return U(tokens_per_rank[static_cast<std::size_t>(p)]); };
      // Step j forwards the block of rank − j (every block but rank+1's, which arrives last) and
      // receives that of rank − 1 − j (every block but its own); blocks differ in size.
      TrafficCounters& t = stage("K/V ring", K::send);
      add_total(t, K::send, L * (n - 1), L * block * (N - at((rank + 1) % Sp)), 0);
      add_total(t, K::recv, L * (n - 1), 0, L * block * (N - at(rank)));
      break;
    }
    case SpPrefill::ulysses: {
      u64 M = 0;  // slots per rank: Σ_b ceil(P_b / Σ)
      for (i64 p : lengths) M += U(ceil_div(p, Sp));
      const u64 q = (n - 1) * M * (U(m.n_heads) / n) * hs * beta;
      const u64 kv = (n - 1) * M * (U(m.n_kv_heads) / n) * hs * beta;
      TrafficCounters& t = stage("sequence-heads all-to-all", K::all_to_all);
      add_total(t, K::all_to_all, 4 * L, L * (2 * q + 2 * kv), L * (2 * q + 2 * kv));
      break;
    }
  }
  const u64 ar = all_reduce_bytes(B * h, Sp, rank, static_cast<double>(beta));
  stage("last rows all-reduce", K::all_reduce).add(K::all_reduce, 1, ar, ar);
  return stages;
}

// ---- TSP-M runtime counting -------------------------------------------------------------------

TspmStageTraffic tspm_step_stage_traffic(const ModelShape& m, int D,
                                         const std::vector<int>& token_owners,
                                         const std::vector<int>& last_owners, std::uint64_t beta,
                                         int rank) {
  const DecodeStrategy st = DecodeStrategy::tsp_m(D);
  check_decode_shape(m, st);
  if (rank < 0 || rank >= D) refuse(st, "rank " + std::to_string(rank) + " is not in [0, D)");
  if (token_owners.empty() || last_owners.empty())
    refuse(st, "a step of at least one new token per sequence is needed");
  if (m.vocab % D != 0)
    refuse(st, "D must divide the vocabulary " + std::to_string(m.vocab) + " (its shards)");
  const auto tally = [&](const std::vector<int>& owners) {
    std::vector<u64> n(static_cast<std::size_t>(D), 0);
    for (int o : owners) {
      if (o < 0 || o >= D) refuse(st, "owner rank " + std::to_string(o) + " is not in [0, D)");
      ++n[static_cast<std::size_t>(o)];
    }
    return n;
  };
  const std::vector<u64> n = tally(token_owners), last = tally(last_owners);
  TspmStageTraffic t;
  if (D == 1) return t;
  const u64 L = U(m.layers), Du = U(D), Dm1 = Du - 1, h = U(m.hidden), V = U(m.vocab);
  const u64 N = U(static_cast<i64>(token_owners.size())), mine = n[static_cast<std::size_t>(rank)];
  // A broadcast of `bytes` from each rank in turn: this rank is the root once.
  const auto broadcasts = [&](TrafficCounters& into, u64 times, u64 bytes) {
    into.add(K::broadcast, times, 0, bytes);
    TrafficCounters::Entry& e = into[K::broadcast];
    e.bytes_received -= (times / Du) * bytes;
    e.bytes_sent += (times / Du) * Dm1 * bytes;
  };
  const u64 vocab_shard = V / Du * h * beta;
  broadcasts(t.embedding, Du, vocab_shard);
  broadcasts(t.lm_head, Du, vocab_shard);
  broadcasts(t.attention_shards, L * Du, U(m.attention_params()) / Du * beta);
  const u64 mlp_shard = U(m.mlp_params()) / Du * beta;
  t.mlp_shards.add(K::send, L * Dm1, mlp_shard, 0);
  t.mlp_shards.add(K::recv, L * Dm1, 0, mlp_shard);
  const u64 q_row = h / Du * beta;
  t.q_gather.add(K::all_gatherv, L * Du, Dm1 * mine * q_row, (N - mine) * q_row);
  const u64 part_row = q_row + U(m.n_heads) / Du * kLseBytes;
  for (int p = 0; p < D; ++p)
    if (p != rank && n[static_cast<std::size_t>(p)] > 0)
      t.partials.add(K::send, L * Du, n[static_cast<std::size_t>(p)] * part_row, 0);
  if (mine > 0) t.partials.add(K::recv, L * Du * Dm1, 0, mine * part_row);
  const u64 k = last[static_cast<std::size_t>(rank)], B = U(static_cast<i64>(last_owners.size()));
  t.logits.add(K::all_gatherv, 1, Dm1 * k * V * beta, (B - k) * V * beta);
  return t;
}

TspmStageTraffic tspm_decode_stage_traffic(const ModelShape& m, int D,
                                           const std::vector<int>& owners, std::uint64_t beta,
                                           int rank) {
  return tspm_step_stage_traffic(m, D, owners, owners, beta, rank);
}

}  // namespace tspemu::tsp::cost
