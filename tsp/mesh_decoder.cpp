#include "tspemu/tsp/mesh_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "decode_parts.hpp"
#include "decoder_base_impl.hpp"
#include "sequence_prefill.hpp"

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/kv_ownership.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
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
  if (prefill == SpPrefill::pass_q) return;
  const std::string variant = cost::sp_prefill_name(prefill);
  if (T != 1)
    reject(variant + " prefill runs on SP only (T = 1), got T=" + str(T) +
           " (a TP+SP mesh prefills pass-Q)");
  if (prefill == SpPrefill::ulysses && (model.n_heads % Sp != 0 || model.n_kv_heads % Sp != 0))
    reject(
        "Ulysses prefill needs Σ to divide the query and the KV heads (its all-to-all gives "
        "each rank NH/Σ query heads and their NKV/Σ KV heads): Σ=" +
        str(Sp) + ", NH=" + str(model.n_heads) + ", NKV=" + str(model.n_kv_heads));
}

template <class T>
struct BasicMeshDecoder<T>::Weights {
  TspShape packing;  // degree T: packed_shards.hpp cuts head shard col by it
  std::vector<Buffer<T>> attention, input_norm;  // [L] each: W_Q/K/V/O of head shard col
  std::vector<detail::MlpShard<T>> mlp;          // [L]: MLP shard col
  detail::VocabShard<T> vocab;                   // rows col·V/T.. of the embedding and LM head
  Weights(Arena& a, const ref::ModelWeights<T>& master, int tp, int col)
      : vocab(a, master, tp, col) {}
};

// The new tokens of one step (decode_parts.hpp). own: a ring or Ulysses prefill's step, the rows
// this rank's own prompt tokens.
template <class T>
struct BasicMeshDecoder<T>::Step : detail::DecodeStep {
  explicit Step(detail::DecodeStep s, bool own_tokens = false)
      : detail::DecodeStep(std::move(s)), own(own_tokens) {}
  bool own = false;
};

template <class T>
void BasicMeshDecoder<T>::reject(const std::string& why) const {
  throw std::invalid_argument(std::string(s_.label()) + " decode: " + why);
}

template <class T>
BasicMeshDecoder<T>::BasicMeshDecoder(Rank& rank, const MeshDecodeShape& shape,
                                      const ref::ModelWeights<T>& master)
    : Base(rank, shape, std::string(shape.label()) + " decode", shape.T == 1 ? "sp" : "tp_sp") {
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
  Arena& a = rank.arena();
  w_ = std::make_unique<Weights>(a, master, s_.T, col_);
  Weights& w = *w_;
  w.packing.model = m;
  w.packing.D = s_.T;
  w.packing.S = 2 * s_.T;
  for (const auto& layer : master.layers) {
    w.attention.push_back(a.allocate<T>(attention_shard_size(w.packing), Category::weights));
    pack_attention_shard(layer, w.packing, col_, w.attention.back().data());
    w.input_norm.push_back(detail::rows_of(a, layer.input_norm, C, 0, 1));
    w.mlp.emplace_back(a, layer, m, s_.T, col_);
  }
}

template <class T>
BasicMeshDecoder<T>::~BasicMeshDecoder() = default;

// Token shard row of Σ; the cache holds this rank's NKV/T KV heads.
template <class T>
CacheLayout BasicMeshDecoder<T>::cache_layout() const {
  return {row_, s_.Sp, s_.interleave, s_.model.n_kv_heads / s_.T};
}

// The step's dimensions and buffers (arena: workspace, and comm for what collectives move).
template <class T>
struct BasicMeshDecoder<T>::Scratch {
  int B, N, C, NH, hs, NHl, NKVl;
  std::size_t rows, Cz, qdl, kvl, nlse;  // nlse: LSE entries of the step, NHl·N
  Buffer<T> x, mid, xn, rstd, q, k, v, out, lse, lse_all, scale, partial;

  Scratch(Arena& a, const MeshDecodeShape& s, const Step& st) {
    const ref::ModelConfig& m = s.model;
    B = s.batch, N = st.rows(), C = m.hidden, NH = m.n_heads, hs = m.head_size();
    NHl = NH / s.T, NKVl = m.n_kv_heads / s.T;
    rows = static_cast<std::size_t>(N), Cz = static_cast<std::size_t>(C);
    qdl = static_cast<std::size_t>(NHl) * hs;   // q (and attention output) columns of the shard
    kvl = static_cast<std::size_t>(NKVl) * hs;  // k (or v) columns of the shard
    nlse = static_cast<std::size_t>(NHl) * rows;
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
  }
};

template <class T>
std::vector<T> BasicMeshDecoder<T>::forward(detail::DecodeStep&& step) {
  // A ring or Ulysses prefill: this rank's own prompt tokens only (Σ = 1: every token is).
  const bool own = step.prefill && s_.prefill != SpPrefill::pass_q && s_.Sp > 1;
  const Step st = own ? Step(detail::own_prefill_step(step, cache_->ownership(), row_), true)
                      : Step(std::move(step));
  Scratch sc(rank_.arena(), s_, st);
  // x = embed_tokens(tokens), vocabulary-parallel over the row (a row of one rank: no call)
  detail::embed(rank_, tp_, w_->vocab, st, sc.C, sc.x, traffic_.embedding);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, st, sc);
    // x = mid + mlp(mid): column gate/up, row down, all-reduce over the row
    detail::mlp_block(rank_, tp_, w_->mlp[static_cast<std::size_t>(l)], st, s_.model, sc.mid, sc.x,
                      traffic_.mlp);
  }
  if (st.own) return last_rows_logits(st, sc);
  // logits of each sequence's last row, this rank's V/T ids all-gathered over the row: [B, V]
  return detail::lm_head(rank_, tp_, w_->vocab, st, s_.model, sc.x, traffic_.lm_head);
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
  if (st.own) {  // ring or Ulysses prefill: attention over every rank's keys, merged here
    const detail::PrefillHeads heads{sc.NHl, sc.NKVl, sc.hs};
    if (s_.prefill == SpPrefill::ring)
      detail::ring_prefill_attention(rank_, sp_, own, st, sc.q.data(), sc.k.data(), sc.v.data(),
                                     sc.out.data(), sc.lse.data(), heads, traffic_.kv_ring);
    else
      detail::ulysses_prefill_attention(rank_, sp_, own, st, sc.q.data(), sc.k.data(), sc.v.data(),
                                        sc.out.data(), heads, traffic_.heads_exchange);
  } else {
    attend_local(l, st, sc);
  }
  // o_proj, row-parallel: mid = x + Σ_t att^(t) · W_O^(t)ᵀ
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.offset[static_cast<std::size_t>(b)];
    ref::matmul_nt(sc.partial.data() + o * Cz, sc.out.data() + o * qdl, aw.wo,
                   st.count[static_cast<std::size_t>(b)], sc.C, static_cast<int>(qdl));
  }
  if (s_.T > 1)
    detail::measured(rank_, traffic_.o_proj, [&] { all_reduce<T>(tp_, sc.partial.span()); });
  for (std::size_t i = 0; i < sc.rows * Cz; ++i) sc.mid[i] = sc.x[i] + sc.partial[i];
}

// Pass-Q attention: each sequence's queries over this rank's keys of it, masked by global
// position, merged over the column (Σ > 1).
template <class T>
void BasicMeshDecoder<T>::attend_local(int l, const Step& st, Scratch& sc) {
  const std::size_t qdl = sc.qdl;
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
}

// Ring or Ulysses prefill: each sequence's last row [C] is on one rank of the column (its owner
// computed it); an all-reduce of [B, C] (the holder's row, zeros elsewhere: exact) gives every
// rank the B rows, then the LM head as a decode step's.
template <class T>
std::vector<T> BasicMeshDecoder<T>::last_rows_logits(const Step& st, const Scratch& sc) {
  const std::size_t B = st.count.size(), C = sc.Cz;
  Arena& arena = rank_.arena();
  auto last = arena.allocate<T>(B * C, Category::comm, /*zero=*/true);
  detail::DecodeStep rows;  // row b = sequence b's last position
  for (std::size_t b = 0; b < B; ++b) {
    const std::int64_t pos = lengths_[b] - 1;
    rows.tokens.push_back(0);
    rows.count.push_back(1);
    rows.offset.push_back(b);
    rows.positions.push_back(pos);
    const auto n = static_cast<std::size_t>(st.count[b]);
    if (n > 0 && st.positions[st.offset[b] + n - 1] == pos)
      std::copy_n(sc.x.data() + (st.offset[b] + n - 1) * C, C, last.data() + b * C);
  }
  detail::measured(rank_, traffic_.last_rows, [&] { all_reduce<T>(sp_, last.span()); });
  return detail::lm_head(rank_, tp_, w_->vocab, rows, s_.model, last, traffic_.lm_head);
}

// Pass-Q merge over the column: all_gather of every rank's lse, the global LSE per (query,
// head) folded in column order, each rank's out scaled by exp(lse - LSE), all_reduce of out.
template <class T>
void BasicMeshDecoder<T>::merge_partials(const Step& st, Scratch& sc) {
  detail::measured(rank_, traffic_.lse_gather, [&] {
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
  detail::measured(rank_, traffic_.output_reduce, [&] { all_reduce<T>(sp_, sc.out.span()); });
}

template class DecoderBase<float, MeshDecodeShape, MeshTraffic>;
template class DecoderBase<double, MeshDecodeShape, MeshTraffic>;
template class BasicMeshDecoder<float>;
template class BasicMeshDecoder<double>;

}  // namespace tspemu::tsp
