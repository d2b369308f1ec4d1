#include "tspemu/tsp/mesh_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
}

// after - before, kind by kind (the counters only grow within a run).
TrafficCounters difference(const TrafficCounters& after, const TrafficCounters& before) {
  TrafficCounters d;
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    d.by_kind[k] = {after.by_kind[k].calls - before.by_kind[k].calls,
                    after.by_kind[k].bytes_sent - before.by_kind[k].bytes_sent,
                    after.by_kind[k].bytes_received - before.by_kind[k].bytes_received};
  }
  return d;
}

}  // namespace

void MeshDecodeShape::validate() const {
  const std::string who = std::string(label()) + " decode: ";
  auto reject = [&](const std::string& why) { throw std::invalid_argument(who + why); };
  model.validate();
  if (T < 1) reject("T=" + str(T) + " must be >= 1");
  if (Sp < 1) reject("Σ=" + str(Sp) + " must be >= 1");
  if (batch < 1) reject("batch B=" + str(batch) + " must be >= 1");
  if (max_context < 1) reject("max_context=" + str(max_context) + " must be > 0");
  if (interleave < 1) reject("interleave I=" + str(interleave) + " must be >= 1");
  auto require_divides = [&](int n, const char* name, const char* why) {
    if (n % T != 0)
      reject("T=" + str(T) + " does not divide " + name + "=" + str(n) + " (" + why + ")");
  };
  require_divides(model.n_heads, "NH", "each rank of a row owns NH/T query heads");
  require_divides(model.n_kv_heads, "NKV",
                  "each rank of a row owns whole KV heads; duplicating KV heads past T = NKV is "
                  "not implemented");
  require_divides(model.ffn, "F", "each rank of a row owns F/T MLP columns");
  require_divides(model.vocab, "V", "each rank of a row owns V/T vocabulary rows");
}

template <class T>
struct BasicMeshDecoder<T>::Weights {
  TspShape packing;  // degree T: packed_shards.hpp cuts head / MLP shard col by it
  std::vector<Buffer<T>> attention, mlp, input_norm, post_norm;  // [L] each
  Buffer<T> embed;                                               // [V/T, C] rows col·V/T..
  Buffer<T> head;        // [V/T, C]; empty when tied (the embedding's rows serve)
  Buffer<T> final_norm;  // [C]
  const T* head_rows() const { return head.empty() ? embed.data() : head.data(); }
};

// The new tokens of one step, sequence-major: sequence b's count[b] tokens at global positions
// positions[offset[b]].. are rows offset[b].. of the step's N rows.
template <class T>
struct BasicMeshDecoder<T>::Step {
  std::vector<std::int32_t> tokens;     // [N]
  std::vector<int> count;               // [B]
  std::vector<std::size_t> offset;      // [B]
  std::vector<std::int64_t> positions;  // [N] global
  int rows() const { return static_cast<int>(tokens.size()); }
};

template <class T>
void BasicMeshDecoder<T>::reject(const std::string& why) const {
  throw std::invalid_argument(std::string(s_.label()) + " decode: " + why);
}

template <class T>
BasicMeshDecoder<T>::BasicMeshDecoder(Rank& rank, const MeshDecodeShape& shape,
                                      const ref::ModelWeights<T>& master)
    : rank_(rank), s_(shape), w_(std::make_unique<Weights>()) {
  s_.validate();
  if (rank.size() != s_.ranks())
    reject("world has " + str(rank.size()) + " ranks but T·Σ=" + str(s_.T) + "·" + str(s_.Sp) +
           "=" + str(s_.ranks()));
  if (dry_run()) reject("a dry run is not supported");
  const ref::ModelConfig& m = s_.model;
  const std::size_t C = static_cast<std::size_t>(m.hidden);
  const std::size_t VC = static_cast<std::size_t>(m.vocab) * C;
  if (master.embed.size() != VC || master.head().size() != VC || master.final_norm.size() != C ||
      master.layers.size() != static_cast<std::size_t>(m.n_layers))
    reject("master weights do not match the model " + m.to_string());
  row_ = rank.id() / s_.T;
  col_ = rank.id() % s_.T;
  tp_ = rank.comm().split(row_, col_, "tp_row" + str(row_));
  sp_ = rank.comm().split(col_, row_, "sp_col" + str(col_));
  Weights& w = *w_;
  w.packing.model = m;
  w.packing.D = s_.T;
  w.packing.S = 2 * s_.T;
  Arena& a = rank.arena();
  for (const auto& layer : master.layers) {
    w.attention.push_back(a.allocate<T>(attention_shard_size(w.packing), Category::weights));
    pack_attention_shard(layer, w.packing, col_, w.attention.back().data());
    w.mlp.push_back(a.allocate<T>(mlp_shard_size(w.packing), Category::weights));
    pack_mlp_shard(layer, w.packing, col_, w.mlp.back().data());
    w.input_norm.push_back(a.allocate<T>(C, Category::weights));
    std::copy(layer.input_norm.begin(), layer.input_norm.end(), w.input_norm.back().data());
    w.post_norm.push_back(a.allocate<T>(C, Category::weights));
    std::copy(layer.post_norm.begin(), layer.post_norm.end(), w.post_norm.back().data());
  }
  const std::size_t shard = VC / static_cast<std::size_t>(s_.T);
  const auto first = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(col_) * shard);
  w.embed = a.allocate<T>(shard, Category::weights);
  std::copy_n(master.embed.begin() + first, shard, w.embed.data());
  if (!m.tie_embeddings) {
    w.head = a.allocate<T>(shard, Category::weights);
    std::copy_n(master.lm_head.begin() + first, shard, w.head.data());
  }
  w.final_norm = a.allocate<T>(C, Category::weights);
  std::copy(master.final_norm.begin(), master.final_norm.end(), w.final_norm.data());
}

template <class T>
BasicMeshDecoder<T>::~BasicMeshDecoder() = default;

template <class T>
const RankKvCache<T>& BasicMeshDecoder<T>::cache() const {
  if (!cache_) throw std::logic_error(std::string(s_.label()) + " decode: no cache before prefill");
  return *cache_;
}

template <class T>
std::size_t BasicMeshDecoder<T>::kv_cache_bytes() const {
  return cache_ ? cache_->bytes() : 0;
}

template <class T>
std::int64_t BasicMeshDecoder<T>::length(int seq) const {
  if (seq < 0 || seq >= static_cast<int>(lengths_.size()))
    throw std::out_of_range(std::string(s_.label()) + " decode: sequence " + str(seq) +
                            " outside [0, " + str(static_cast<std::int64_t>(lengths_.size())) +
                            ")");
  return lengths_[static_cast<std::size_t>(seq)];
}

template <class T>
std::vector<T> BasicMeshDecoder<T>::prefill(const std::vector<std::vector<std::int32_t>>& prompts) {
  const int B = s_.batch, V = s_.model.vocab;
  if (prompts.size() != static_cast<std::size_t>(B))
    reject("prefill: " + str(static_cast<std::int64_t>(prompts.size())) +
           " prompts for batch B=" + str(B));
  Step step;
  std::vector<std::int64_t> lengths;
  for (int b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<std::size_t>(b)];
    if (p.empty()) reject("prefill: prompt of sequence " + str(b) + " is empty");
    if (static_cast<std::int64_t>(p.size()) > s_.max_context)
      throw std::length_error(std::string(s_.label()) + " decode: prefill: sequence " + str(b) +
                              "'s prompt of " + str(static_cast<std::int64_t>(p.size())) +
                              " positions exceeds max_context=" + str(s_.max_context));
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p[i] < 0 || p[i] >= V)
        reject("prefill: sequence " + str(b) + " position " + str(static_cast<std::int64_t>(i)) +
               " has token " + str(p[i]) + " outside [0, " + str(V) + ")");
    step.offset.push_back(step.tokens.size());
    step.count.push_back(static_cast<int>(p.size()));
    step.tokens.insert(step.tokens.end(), p.begin(), p.end());
    for (std::size_t i = 0; i < p.size(); ++i)
      step.positions.push_back(static_cast<std::int64_t>(i));
    lengths.push_back(static_cast<std::int64_t>(p.size()));
  }
  // The cache holds this rank's NKV/T KV heads: a config with NKV/T KV heads sizes its rows
  // (head size and layers unchanged).
  ref::ModelConfig held = s_.model;
  held.n_kv_heads = s_.model.n_kv_heads / s_.T;
  cache_.reset();  // a new batch: the old reservation goes back to the arena first
  cache_ = std::make_unique<RankKvCache<T>>(
      rank_.arena(), row_, held, KvOwnership(s_.Sp, s_.interleave, lengths), s_.max_context);
  lengths_ = lengths;
  auto phase = rank_.arena().phase(s_.T == 1 ? "sp.prefill" : "tp_sp.prefill");
  return run(step);
}

template <class T>
std::vector<T> BasicMeshDecoder<T>::decode_step(std::span<const std::int32_t> tokens) {
  const int B = s_.batch, V = s_.model.vocab;
  if (!cache_) reject("decode_step before prefill");
  if (tokens.size() != static_cast<std::size_t>(B))
    reject("decode_step: " + str(static_cast<std::int64_t>(tokens.size())) +
           " tokens for batch B=" + str(B) + " (one per sequence)");
  Step step;
  for (int b = 0; b < B; ++b) {
    const std::int64_t pos = lengths_[static_cast<std::size_t>(b)];
    const std::int32_t t = tokens[static_cast<std::size_t>(b)];
    if (t < 0 || t >= V)
      reject("decode_step: sequence " + str(b) + " position " + str(pos) + " has token " + str(t) +
             " outside [0, " + str(V) + ")");
    if (pos >= s_.max_context)
      throw std::length_error(std::string(s_.label()) + " decode: decode_step: sequence " + str(b) +
                              " would hold position " + str(pos) +
                              ", beyond max_context=" + str(s_.max_context));
    step.offset.push_back(static_cast<std::size_t>(b));
    step.count.push_back(1);
    step.tokens.push_back(t);
    step.positions.push_back(pos);
  }
  auto phase = rank_.arena().phase(s_.T == 1 ? "sp.decode" : "tp_sp.decode");
  std::vector<T> logits = run(step);
  for (std::int64_t& n : lengths_) ++n;
  return logits;
}

// The step's dimensions and buffers (arena: workspace, and comm for what collectives move).
template <class T>
struct BasicMeshDecoder<T>::Scratch {
  int B, N, C, NH, hs, NHl, NKVl, Fl, Vl;
  std::size_t rows, Cz, qdl, kvl, nlse;  // nlse: LSE entries of the step, NHl·N
  Buffer<T> x, mid, xn, rstd, q, k, v, out, lse, lse_all, scale, partial, gate, up, h;

  Scratch(Arena& a, const MeshDecodeShape& s, const Step& st) {
    const ref::ModelConfig& m = s.model;
    B = s.batch, N = st.rows(), C = m.hidden, NH = m.n_heads, hs = m.head_size();
    NHl = NH / s.T, NKVl = m.n_kv_heads / s.T, Fl = m.ffn / s.T, Vl = m.vocab / s.T;
    rows = static_cast<std::size_t>(N), Cz = static_cast<std::size_t>(C);
    qdl = static_cast<std::size_t>(NHl) * hs;   // q (and attention output) columns of the shard
    kvl = static_cast<std::size_t>(NKVl) * hs;  // k (or v) columns of the shard
    nlse = static_cast<std::size_t>(NHl) * rows;
    const std::size_t NF = rows * static_cast<std::size_t>(Fl);
    x = a.allocate<T>(rows * Cz, Category::workspace, /*zero=*/true);
    mid = a.allocate<T>(rows * Cz, Category::workspace);
    xn = a.allocate<T>(rows * Cz, Category::workspace);
    rstd = a.allocate<T>(rows, Category::workspace);
    q = a.allocate<T>(rows * qdl, Category::workspace);
    k = a.allocate<T>(rows * kvl, Category::workspace);
    v = a.allocate<T>(rows * kvl, Category::workspace);
    out = a.allocate<T>(rows * qdl, Category::comm);  // all-reduced over the column
    lse = a.allocate<T>(nlse, Category::comm);
    lse_all = a.allocate<T>(static_cast<std::size_t>(s.Sp) * nlse, Category::comm);
    scale = a.allocate<T>(nlse, Category::workspace);
    partial = a.allocate<T>(rows * Cz, Category::comm);  // all-reduced over the row
    gate = a.allocate<T>(NF, Category::workspace);
    up = a.allocate<T>(NF, Category::workspace);
    h = a.allocate<T>(NF, Category::workspace);
  }
};

template <class T>
void BasicMeshDecoder<T>::measured(TrafficCounters& into, const std::function<void()>& collective) {
  const TrafficCounters before = rank_.counters();
  collective();
  into += difference(rank_.counters(), before);
}

template <class T>
std::vector<T> BasicMeshDecoder<T>::run(const Step& st) {
  Scratch sc(rank_.arena(), s_, st);
  traffic_ = {};
  embed(st, sc);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, st, sc);
    mlp(l, st, sc);
  }
  return lm_head(st, sc);
}

// x = embed_tokens(tokens). T > 1: the owner of each id's row writes it, the others zeros; the
// row's all-reduce adds exact zeros, so x is the embedding row bit for bit.          [N, C]
template <class T>
void BasicMeshDecoder<T>::embed(const Step& st, Scratch& sc) {
  for (std::size_t n = 0; n < sc.rows; ++n) {
    const int t = st.tokens[n];
    if (t / sc.Vl == col_)
      std::copy_n(w_->embed.data() + static_cast<std::size_t>(t - col_ * sc.Vl) * sc.Cz, sc.Cz,
                  sc.x.data() + n * sc.Cz);
  }
  if (s_.T > 1) measured(traffic_.embedding, [&] { all_reduce<T>(tp_, sc.x.span()); });
}

// The attention block of layer l: mid = x + o_proj(attention), every stage of the header.
template <class T>
void BasicMeshDecoder<T>::attention(int l, const Step& st, Scratch& sc) {
  const ref::ModelConfig& m = s_.model;
  const Weights& w = *w_;
  const auto lz = static_cast<std::size_t>(l);
  const std::size_t qdl = sc.qdl, kvl = sc.kvl, Cz = sc.Cz;
  const auto aw = attention_view(static_cast<const T*>(w.attention[lz].data()), w.packing);
  const KvOwnership& own = cache_->ownership();
  // n = input_layernorm(x); q, k, v of head shard col; rope at the global positions
  ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.x.data(), w.input_norm[lz].data(), sc.N,
                       sc.C, m.norm_eps);
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.offset[static_cast<std::size_t>(b)];
    const int n = st.count[static_cast<std::size_t>(b)];
    const T* xn = sc.xn.data() + o * Cz;
    ref::matmul_nt(sc.q.data() + o * qdl, xn, aw.wq, n, static_cast<int>(qdl), sc.C);
    ref::matmul_nt(sc.k.data() + o * kvl, xn, aw.wk, n, static_cast<int>(kvl), sc.C);
    ref::matmul_nt(sc.v.data() + o * kvl, xn, aw.wv, n, static_cast<int>(kvl), sc.C);
    const std::int64_t* pos = st.positions.data() + o;
    ref::rope_forward(sc.q.data() + o * qdl, pos, 1, n, sc.NHl, sc.hs, m.rope_base);
    ref::rope_forward(sc.k.data() + o * kvl, pos, 1, n, sc.NKVl, sc.hs, m.rope_base);
    // append: the owner row keeps each new token's K/V (every row computed it: no traffic)
    for (int i = 0; i < n; ++i) {
      const std::size_t r = o + static_cast<std::size_t>(i);
      if (own.owner(b, st.positions[r]) == row_)
        cache_->append(l, b, st.positions[r], sc.k.data() + r * kvl, sc.v.data() + r * kvl);
    }
  }
  // attend: each sequence's queries over this rank's keys of it, masked by global position
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.offset[static_cast<std::size_t>(b)];
    const auto keys = cache_->positions(l, b);
    ref::causal_attention_forward(
        sc.out.data() + o * qdl, sc.lse.data() + static_cast<std::size_t>(sc.NHl) * o,
        sc.q.data() + o * qdl, cache_->keys(l, b), cache_->values(l, b), st.positions.data() + o,
        keys.data(),
        ref::AttentionDims{1, st.count[static_cast<std::size_t>(b)], static_cast<int>(keys.size()),
                           sc.NHl, sc.NKVl, sc.hs});
  }
  if (s_.Sp > 1) merge_partials(st, sc);
  // o_proj, row-parallel: mid = x + Σ_t att^(t) · W_O^(t)ᵀ
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.offset[static_cast<std::size_t>(b)];
    ref::matmul_nt(sc.partial.data() + o * Cz, sc.out.data() + o * qdl, aw.wo,
                   st.count[static_cast<std::size_t>(b)], sc.C, static_cast<int>(qdl));
  }
  if (s_.T > 1) measured(traffic_.o_proj, [&] { all_reduce<T>(tp_, sc.partial.span()); });
  for (std::size_t i = 0; i < sc.rows * Cz; ++i) sc.mid[i] = sc.x[i] + sc.partial[i];
}

// Pass-Q merge over the column: all_gather of every rank's lse, the global LSE per (query,
// head) folded in column order, each rank's out scaled by exp(lse - LSE), all_reduce of out.
template <class T>
void BasicMeshDecoder<T>::merge_partials(const Step& st, Scratch& sc) {
  measured(traffic_.lse_gather, [&] {
    all_gather<T>(sp_, std::span<const T>(sc.lse.data(), sc.lse.size()), sc.lse_all.span());
  });
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const auto S = static_cast<std::size_t>(s_.Sp);
  for (std::size_t e = 0; e < sc.nlse; ++e) {
    T mx = kNegInf;
    for (std::size_t p = 0; p < S; ++p) mx = std::max(mx, sc.lse_all[p * sc.nlse + e]);
    if (mx == kNegInf) {  // no rank sees a key: cannot happen (a query sees itself), kept NaN-free
      sc.scale[e] = T(0);
      continue;
    }
    T sum = 0;
    for (std::size_t p = 0; p < S; ++p) sum += std::exp(sc.lse_all[p * sc.nlse + e] - mx);
    sc.scale[e] = std::exp(sc.lse[e] - (mx + std::log(sum)));  // exp(-inf) = 0: empty partial
  }
  const std::size_t hs = static_cast<std::size_t>(sc.hs), NHl = static_cast<std::size_t>(sc.NHl);
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.offset[static_cast<std::size_t>(b)];
    const auto nb = static_cast<std::size_t>(st.count[static_cast<std::size_t>(b)]);
    for (std::size_t i = 0; i < nb; ++i)
      for (std::size_t hd = 0; hd < NHl; ++hd) {
        const T f = sc.scale[NHl * o + hd * nb + i];  // lse layout [NHl, n_b] per sequence
        T* row = sc.out.data() + (o + i) * sc.qdl + hd * hs;
        for (std::size_t c = 0; c < hs; ++c) row[c] *= f;
      }
  }
  measured(traffic_.output_reduce, [&] { all_reduce<T>(sp_, sc.out.span()); });
}

// The MLP block of layer l, column gate/up and row down over the row: x = mid + Σ_t
// down^(t)(silu(gate^(t)) ⊙ up^(t)).
template <class T>
void BasicMeshDecoder<T>::mlp(int l, const Step& st, Scratch& sc) {
  const auto lz = static_cast<std::size_t>(l);
  const auto mw = mlp_view(static_cast<const T*>(w_->mlp[lz].data()), w_->packing);
  ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.mid.data(), w_->post_norm[lz].data(), sc.N,
                       sc.C, s_.model.norm_eps);
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.offset[static_cast<std::size_t>(b)];
    const int n = st.count[static_cast<std::size_t>(b)];
    const std::size_t f = o * static_cast<std::size_t>(sc.Fl);
    ref::matmul_nt(sc.gate.data() + f, sc.xn.data() + o * sc.Cz, mw.gate, n, sc.Fl, sc.C);
    ref::matmul_nt(sc.up.data() + f, sc.xn.data() + o * sc.Cz, mw.up, n, sc.Fl, sc.C);
    ref::silu_mul_forward(sc.h.data() + f, sc.gate.data() + f, sc.up.data() + f,
                          static_cast<std::size_t>(n) * sc.Fl);
    ref::matmul_nt(sc.partial.data() + o * sc.Cz, sc.h.data() + f, mw.down, n, sc.C, sc.Fl);
  }
  if (s_.T > 1) measured(traffic_.mlp, [&] { all_reduce<T>(tp_, sc.partial.span()); });
  for (std::size_t i = 0; i < sc.rows * sc.Cz; ++i) sc.x[i] = sc.mid[i] + sc.partial[i];
}

// LM head: final norm of each sequence's last row, this rank's V/T logits, all-gathered over the
// row when T > 1: [B, V].
template <class T>
std::vector<T> BasicMeshDecoder<T>::lm_head(const Step& st, Scratch& sc) {
  Arena& a = rank_.arena();
  const std::size_t Vz = static_cast<std::size_t>(sc.Vl), Bz = static_cast<std::size_t>(sc.B);
  const auto V = static_cast<std::size_t>(s_.model.vocab), Tz = static_cast<std::size_t>(s_.T);
  auto mine = a.allocate<T>(Bz * Vz, Category::comm);
  for (std::size_t b = 0; b < Bz; ++b) {
    const std::size_t last = st.offset[b] + static_cast<std::size_t>(st.count[b]) - 1;
    ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.x.data() + last * sc.Cz,
                         w_->final_norm.data(), 1, sc.C, s_.model.norm_eps);
    ref::matmul_nt(mine.data() + b * Vz, sc.xn.data(), w_->head_rows(), 1, sc.Vl, sc.C);
  }
  if (s_.T == 1) return {mine.begin(), mine.end()};
  auto all = a.allocate<T>(Tz * Bz * Vz, Category::comm);
  measured(traffic_.lm_head,
           [&] { all_gather<T>(tp_, std::span<const T>(mine.data(), mine.size()), all.span()); });
  std::vector<T> logits(Bz * V);
  for (std::size_t p = 0; p < Tz; ++p)
    for (std::size_t b = 0; b < Bz; ++b)
      std::copy_n(all.data() + (p * Bz + b) * Vz, Vz, logits.data() + b * V + p * Vz);
  return logits;
}

template class BasicMeshDecoder<float>;
template class BasicMeshDecoder<double>;

}  // namespace tspemu::tsp
