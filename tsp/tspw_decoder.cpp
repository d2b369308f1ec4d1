#include "tspemu/tsp/tspw_decoder.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_parts.hpp"
#include "decoder_base_impl.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

namespace {

constexpr const char* kWho = "TSP-W decode";

[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument(std::string(kWho) + ": " + why);
}

std::string str(std::int64_t v) {
  return std::to_string(v);
}

void require_divides(int D, int n, const char* name, const char* why) {
  if (n % D != 0) {
    reject("D=" + str(D) + " does not divide " + name + "=" + str(n) + " (" + why + ")");
  }
}

// The fault o_proj_shard_swap: rank r (0 or 1) takes rank 1 - r's W_O shard into its packed
// attention shard, where the group mapping should have handed it its own.
template <class T>
void take_partner_wo(const ref::LayerWeights<T>& layer, const TspShape& s, int r, T* packed) {
  std::vector<T> partner(attention_shard_size(s));
  pack_attention_shard(layer, s, 1 - r, partner.data());
  const std::size_t wo_at = static_cast<std::size_t>(attention_view(packed, s).wo - packed);
  std::copy(partner.begin() + static_cast<std::ptrdiff_t>(wo_at), partner.end(), packed + wo_at);
}

}  // namespace

void DecodeShape::validate() const {
  model.validate();
  if (D < 1) reject("D=" + str(D) + " must be >= 1");
  if (batch < 1) reject("batch B=" + str(batch) + " must be >= 1");
  if (max_context < 1) reject("max_context=" + str(max_context) + " must be > 0");
  if (interleave < 1) reject("interleave I=" + str(interleave) + " must be >= 1");
  require_divides(D, model.n_heads, "NH", "each rank owns NH/D query heads");
  require_divides(D, model.n_kv_heads, "NKV",
                  "each rank owns whole KV heads; D > NKV would need duplicated KV heads");
  require_divides(D, model.ffn, "F", "each rank owns F/D MLP columns");
  require_divides(D, model.vocab, "V", "each rank owns V/D vocabulary rows");
}

template <class T>
struct BasicTspwDecoder<T>::Weights : detail::TspShards<T> {};

// The new tokens of one step (decode_parts.hpp).
template <class T>
struct BasicTspwDecoder<T>::Step : detail::DecodeStep {
  explicit Step(detail::DecodeStep s) : detail::DecodeStep(std::move(s)) {}
};

template <class T>
BasicTspwDecoder<T>::BasicTspwDecoder(Rank& rank, const DecodeShape& shape,
                                      const ref::ModelWeights<T>& master, TspwFault fault)
    : Base(rank, shape, kWho, "tspw"), fault_(fault), w_(std::make_unique<Weights>()) {
  s_.validate();
  if (rank.size() != s_.D) reject("world has " + str(rank.size()) + " ranks but D=" + str(s_.D));
  *w_ = {detail::load_tsp_shards(kWho, rank.arena(), s_.model, s_.D, rank.id(), master)};
  if (fault_ == TspwFault::o_proj_shard_swap && s_.D >= 2 && rank.id() < 2) {
    for (std::size_t l = 0; l < master.layers.size(); ++l)
      take_partner_wo(master.layers[l], w_->packing, rank.id(), w_->attention[l].data());
  }
}

template <class T>
BasicTspwDecoder<T>::~BasicTspwDecoder() = default;

// Token shard r of D, every KV head of its positions.
template <class T>
CacheLayout BasicTspwDecoder<T>::cache_layout() const {
  return {rank_.id(), s_.D, s_.interleave, s_.model.n_kv_heads};
}

// The step's dimensions and buffers (arena: workspace, and comm for what collectives move).
template <class T>
struct BasicTspwDecoder<T>::Scratch {
  int D, r, B, N, C, NH, NKV, hs, NHl, NKVl, Fl, Vl;
  std::size_t rows, qdl, kvl, qd, kvd, Cz, ud;
  std::vector<std::int64_t> rotation;  // [N] RoPE's positions
  Buffer<T> x, mid, xn, rstd, qloc, kloc, vloc, kvsend, kvall, qall, q, out, lse, att, partial,
      gate, up, h, krow, vrow;

  Scratch(Arena& a, const DecodeShape& s, int rank, const Step& st) {
    const ref::ModelConfig& m = s.model;
    D = s.D, r = rank, B = s.batch, N = st.rows(), C = m.hidden, NH = m.n_heads;
    NKV = m.n_kv_heads, hs = m.head_size(), NHl = NH / D, NKVl = NKV / D, Fl = m.ffn / D;
    Vl = m.vocab / D;
    rows = static_cast<std::size_t>(N), Cz = static_cast<std::size_t>(C);
    ud = static_cast<std::size_t>(D);
    qdl = static_cast<std::size_t>(NHl) * hs;   // q columns of a head shard
    kvl = static_cast<std::size_t>(NKVl) * hs;  // k (or v) columns of a head shard
    qd = static_cast<std::size_t>(NH) * hs, kvd = static_cast<std::size_t>(NKV) * hs;
    const std::size_t NF = rows * static_cast<std::size_t>(Fl);
    x = a.allocate<T>(rows * Cz, Category::workspace, /*zero=*/true);
    mid = a.allocate<T>(rows * Cz, Category::workspace);
    xn = a.allocate<T>(rows * Cz, Category::workspace);
    rstd = a.allocate<T>(rows, Category::workspace);
    qloc = a.allocate<T>(rows * qdl, Category::workspace);
    kloc = a.allocate<T>(rows * kvl, Category::workspace);
    vloc = a.allocate<T>(rows * kvl, Category::workspace);
    kvsend = a.allocate<T>(rows * 2 * kvl, Category::comm);
    kvall = a.allocate<T>(ud * rows * 2 * kvl, Category::comm);
    qall = a.allocate<T>(ud * rows * qdl, Category::comm);
    q = a.allocate<T>(rows * qd, Category::workspace);
    out = a.allocate<T>(rows * qd, Category::workspace);
    lse = a.allocate<T>(static_cast<std::size_t>(NH) * rows, Category::workspace);
    att = a.allocate<T>(rows * qdl, Category::workspace);
    partial = a.allocate<T>(rows * Cz, Category::workspace);
    gate = a.allocate<T>(NF, Category::workspace);
    up = a.allocate<T>(NF, Category::workspace);
    h = a.allocate<T>(NF, Category::workspace);
    krow = a.allocate<T>(kvd, Category::workspace);
    vrow = a.allocate<T>(kvd, Category::workspace);
  }
};

template <class T>
std::vector<T> BasicTspwDecoder<T>::forward(detail::DecodeStep&& step) {
  const Step st(std::move(step));
  Scratch sc(rank_.arena(), s_, rank_.id(), st);
  // RoPE's positions: the global ones; the fault uses a token's index among its owner's keys.
  sc.rotation = st.positions;
  if (fault_ == TspwFault::rope_local_positions) {
    const KvOwnership& own = cache_->ownership();
    for (int b = 0; b < sc.B; ++b)
      for (int i = 0; i < st.count[static_cast<std::size_t>(b)]; ++i) {
        const std::size_t n = st.offset[static_cast<std::size_t>(b)] + static_cast<std::size_t>(i);
        sc.rotation[n] = own.count(own.owner(b, st.positions[n]), b, st.positions[n]);
      }
  }
  embed(st, sc);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, st, sc);
    mlp(l, st, sc);
  }
  return lm_head(st, sc);
}

// x = embed_tokens(tokens): the owner of each id's row writes it, the others zeros; the
// all-reduce adds exact zeros, so x is the embedding row bit for bit.          [N, C]
template <class T>
void BasicTspwDecoder<T>::embed(const Step& st, Scratch& sc) {
  for (std::size_t n = 0; n < sc.rows; ++n) {
    const int t = st.tokens[n];
    if (t / sc.Vl == sc.r)
      std::copy_n(w_->embed.data() + static_cast<std::size_t>(t - sc.r * sc.Vl) * sc.Cz, sc.Cz,
                  sc.x.data() + n * sc.Cz);
  }
  detail::measured(rank_, traffic_.embedding, [&] { all_reduce<T>(rank_.comm(), sc.x.span()); });
}

// The attention block of layer l: mid = x + o_proj(attention), every stage of the header.
template <class T>
void BasicTspwDecoder<T>::attention(int l, const Step& st, Scratch& sc) {
  const ref::ModelConfig& m = s_.model;
  const Weights& w = *w_;
  Comm& comm = rank_.comm();
  const auto lz = static_cast<std::size_t>(l);
  const std::size_t qdl = sc.qdl, kvl = sc.kvl, qd = sc.qd, Cz = sc.Cz, rows = sc.rows;
  auto rows_of = [&st](int b) { return st.count[static_cast<std::size_t>(b)]; };
  auto first_of = [&st](int b) { return st.offset[static_cast<std::size_t>(b)]; };
  const auto aw = attention_view(static_cast<const T*>(w.attention[lz].data()), w.packing);
  // n = input_layernorm(x); q, k, v of head shard r; rope at the global positions
  ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.x.data(), w.input_norm[lz].data(), sc.N,
                       sc.C, m.norm_eps);
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = first_of(b);
    const int n = rows_of(b);
    const T* xn = sc.xn.data() + o * Cz;
    ref::matmul_nt(sc.qloc.data() + o * qdl, xn, aw.wq, n, static_cast<int>(qdl), sc.C);
    ref::matmul_nt(sc.kloc.data() + o * kvl, xn, aw.wk, n, static_cast<int>(kvl), sc.C);
    ref::matmul_nt(sc.vloc.data() + o * kvl, xn, aw.wv, n, static_cast<int>(kvl), sc.C);
    const std::int64_t* rot = sc.rotation.data() + o;
    ref::rope_forward(sc.qloc.data() + o * qdl, rot, 1, n, sc.NHl, sc.hs, m.rope_base);
    ref::rope_forward(sc.kloc.data() + o * kvl, rot, 1, n, sc.NKVl, sc.hs, m.rope_base);
  }
  route(l, st, sc);
  // q gather: every query's NH heads on every rank, [N, NH, hs]
  detail::measured(rank_, traffic_.q_gather, [&] {
    all_gather<T>(comm, std::span<const T>(sc.qloc.data(), sc.qloc.size()), sc.qall.span());
  });
  for (std::size_t p = 0; p < sc.ud; ++p)
    for (std::size_t n = 0; n < rows; ++n)
      std::copy_n(sc.qall.data() + (p * rows + n) * qdl, qdl, sc.q.data() + n * qd + p * qdl);
  // attend: each sequence's queries over this rank's keys of it, masked by global position
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = first_of(b);
    const auto keys = cache_->positions(l, b);
    ref::causal_attention_forward(
        sc.out.data() + o * qd, sc.lse.data() + static_cast<std::size_t>(sc.NH) * o,
        sc.q.data() + o * qd, cache_->keys(l, b), cache_->values(l, b), st.positions.data() + o,
        keys.data(),
        ref::AttentionDims{1, rows_of(b), static_cast<int>(keys.size()), sc.NH, sc.NKV, sc.hs});
    if (fault_ == TspwFault::empty_shard_nan && keys.empty()) {
      const auto n = static_cast<std::size_t>(rows_of(b));
      std::fill_n(sc.out.data() + o * qd, n * qd, std::numeric_limits<T>::quiet_NaN());
      std::fill_n(sc.lse.data() + static_cast<std::size_t>(sc.NH) * o,
                  n * static_cast<std::size_t>(sc.NH), std::numeric_limits<T>::quiet_NaN());
    }
  }
  merge_partials(st, sc);
  // o_proj, row-parallel: mid = x + Σ_r att^(r) · W_O^(r)ᵀ
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = first_of(b);
    ref::matmul_nt(sc.partial.data() + o * Cz, sc.att.data() + o * qdl, aw.wo, rows_of(b), sc.C,
                   static_cast<int>(qdl));
  }
  detail::measured(rank_, traffic_.o_proj, [&] { all_reduce<T>(comm, sc.partial.span()); });
  for (std::size_t i = 0; i < rows * Cz; ++i) sc.mid[i] = sc.x[i] + sc.partial[i];
}

// route: every rank gets head shard p's K/V of every new token; each token's owner appends the
// D slices as one row [NKV, hs].
template <class T>
void BasicTspwDecoder<T>::route(int l, const Step& st, Scratch& sc) {
  const std::size_t kvl = sc.kvl, rows = sc.rows;
  for (std::size_t n = 0; n < rows; ++n) {
    std::copy_n(sc.kloc.data() + n * kvl, kvl, sc.kvsend.data() + n * 2 * kvl);
    std::copy_n(sc.vloc.data() + n * kvl, kvl, sc.kvsend.data() + n * 2 * kvl + kvl);
  }
  detail::measured(rank_, traffic_.kv_route, [&] {
    all_gather<T>(rank_.comm(), std::span<const T>(sc.kvsend.data(), sc.kvsend.size()),
                  sc.kvall.span());
  });
  for (int b = 0; b < sc.B; ++b)
    for (int i = 0; i < st.count[static_cast<std::size_t>(b)]; ++i) {
      const std::size_t n = st.offset[static_cast<std::size_t>(b)] + static_cast<std::size_t>(i);
      const std::int64_t pos = st.positions[n];
      int owner = cache_->ownership().owner(b, pos);
      if (fault_ == TspwFault::kv_wrong_owner && !st.prefill) owner = (owner + 1) % sc.D;
      if (owner != sc.r) continue;
      for (std::size_t p = 0; p < sc.ud; ++p) {
        const T* src = sc.kvall.data() + (p * rows + n) * 2 * kvl;
        std::copy_n(src, kvl, sc.krow.data() + p * kvl);
        std::copy_n(src + kvl, kvl, sc.vrow.data() + p * kvl);
      }
      cache_->append(l, b, pos, sc.krow.data(), sc.vrow.data());
    }
}

// partials to the head owners, merged by log-sum-exp in rank order (decode_parts.hpp): att
// [N, NHl·hs] of this rank's heads.
template <class T>
void BasicTspwDecoder<T>::merge_partials(const Step& st, Scratch& sc) {
  detail::exchange_partials(rank_, rank_.comm(), st, sc.out.data(), sc.lse.data(), sc.NH, sc.hs,
                            sc.att, traffic_.partials);
}

// The MLP block of layer l, column gate/up and row down: x = mid + Σ_r down^(r)(silu(gate^(r)) ⊙
// up^(r)).
template <class T>
void BasicTspwDecoder<T>::mlp(int l, const Step& st, Scratch& sc) {
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
  detail::measured(rank_, traffic_.mlp, [&] { all_reduce<T>(rank_.comm(), sc.partial.span()); });
  for (std::size_t i = 0; i < sc.rows * sc.Cz; ++i) sc.x[i] = sc.mid[i] + sc.partial[i];
}

// LM head: final norm of each sequence's last row, this rank's V/D logits, all-gathered [B, V].
template <class T>
std::vector<T> BasicTspwDecoder<T>::lm_head(const Step& st, Scratch& sc) {
  Arena& a = rank_.arena();
  const std::size_t Vz = static_cast<std::size_t>(sc.Vl), Bz = static_cast<std::size_t>(sc.B);
  const auto V = static_cast<std::size_t>(s_.model.vocab);
  auto mine = a.allocate<T>(Bz * Vz, Category::workspace);
  auto all = a.allocate<T>(sc.ud * Bz * Vz, Category::comm);
  for (std::size_t b = 0; b < Bz; ++b) {
    const std::size_t last = st.offset[b] + static_cast<std::size_t>(st.count[b]) - 1;
    ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.x.data() + last * sc.Cz,
                         w_->final_norm.data(), 1, sc.C, s_.model.norm_eps);
    ref::matmul_nt(mine.data() + b * Vz, sc.xn.data(), w_->head_rows(), 1, sc.Vl, sc.C);
  }
  detail::measured(rank_, traffic_.lm_head, [&] {
    all_gather<T>(rank_.comm(), std::span<const T>(mine.data(), mine.size()), all.span());
  });
  std::vector<T> logits(Bz * V);
  for (std::size_t p = 0; p < sc.ud; ++p)
    for (std::size_t b = 0; b < Bz; ++b)
      std::copy_n(all.data() + (p * Bz + b) * Vz, Vz, logits.data() + b * V + p * Vz);
  return logits;
}

template class DecoderBase<float, DecodeShape, TspwTraffic>;
template class DecoderBase<double, DecodeShape, TspwTraffic>;
template class BasicTspwDecoder<float>;
template class BasicTspwDecoder<double>;

}  // namespace tspemu::tsp
