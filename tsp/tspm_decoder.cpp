#include "tspemu/tsp/tspm_decoder.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

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

constexpr const char* kWho = "TSP-M decode";

std::string str(std::int64_t v) {
  return std::to_string(v);
}

std::size_t z(std::int64_t v) {
  return static_cast<std::size_t>(v);
}

}  // namespace

template <class T>
struct BasicTspmDecoder<T>::Weights : detail::TspShards<T> {
  // In flight (Category::comm): one attention shard, two MLP shards, one vocabulary shard.
  Buffer<T> attention_in, mlp_ring0, mlp_ring1, vocab_in;
};

// The step's tokens (decode_parts' DecodeStep, sequence-major) and who owns each: rows_of[p] lists
// the step rows rank p owns in step order, so rank p's rows of sequence b are
// rows_of[p][first[p][b]..] (cnt[p][b] of them), contiguous.
template <class T>
struct BasicTspmDecoder<T>::Step {
  detail::DecodeStep batch;
  std::vector<std::vector<std::size_t>> rows_of;  // [D][n_p]
  std::vector<std::vector<std::size_t>> first;    // [D][B]
  std::vector<std::vector<int>> cnt;              // [D][B]
  std::vector<int> last_owner;                    // [B] owner of each sequence's last new row

  Step(detail::DecodeStep b, const KvOwnership& own, int D) : batch(std::move(b)) {
    const int B = static_cast<int>(batch.count.size());
    rows_of.assign(z(D), {});
    first.assign(z(D), std::vector<std::size_t>(z(B), 0));
    cnt.assign(z(D), std::vector<int>(z(B), 0));
    for (int s = 0; s < B; ++s) {
      for (int p = 0; p < D; ++p) first[z(p)][z(s)] = rows_of[z(p)].size();
      for (int i = 0; i < batch.count[z(s)]; ++i) {
        const std::size_t n = batch.offset[z(s)] + z(i);
        const int p = own.owner(s, batch.positions[n]);
        rows_of[z(p)].push_back(n);
        ++cnt[z(p)][z(s)];
        if (i + 1 == batch.count[z(s)]) last_owner.push_back(p);
      }
    }
  }
  std::size_t owned(int p) const { return rows_of[z(p)].size(); }
};

// DecodeShape's rules, with TSP-M named: its messages open "TSP-W decode: ".
template <class T>
void BasicTspmDecoder<T>::validate(const DecodeShape& shape) {
  try {
    shape.validate();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what(), tspw = "TSP-W decode: ";
    throw std::invalid_argument(std::string(kWho) + ": " +
                                (what.starts_with(tspw) ? what.substr(tspw.size()) : what));
  }
}

template <class T>
BasicTspmDecoder<T>::BasicTspmDecoder(Rank& rank, const DecodeShape& shape,
                                      const ref::ModelWeights<T>& master)
    : Base(rank, shape, kWho, "tspm"), w_(std::make_unique<Weights>()) {
  validate(s_);
  if (rank.size() != s_.D)
    throw std::invalid_argument(std::string(kWho) + ": world has " + str(rank.size()) +
                                " ranks but D=" + str(s_.D));
  Weights& w = *w_;
  static_cast<detail::TspShards<T>&>(w) =
      detail::load_tsp_shards(kWho, rank.arena(), s_.model, s_.D, rank.id(), master);
  Arena& a = rank.arena();
  const std::size_t shard = z(s_.model.vocab) * z(s_.model.hidden) / z(s_.D);
  w.attention_in = a.allocate<T>(attention_shard_size(w.packing), Category::comm);
  w.mlp_ring0 = a.allocate<T>(mlp_shard_size(w.packing), Category::comm);
  w.mlp_ring1 = a.allocate<T>(mlp_shard_size(w.packing), Category::comm);
  w.vocab_in = a.allocate<T>(shard, Category::comm);
}

template <class T>
BasicTspmDecoder<T>::~BasicTspmDecoder() = default;

// Token shard r of D, every KV head of its positions.
template <class T>
CacheLayout BasicTspmDecoder<T>::cache_layout() const {
  return {rank_.id(), s_.D, s_.interleave, s_.model.n_kv_heads};
}

// The step's dimensions and buffers (arena: workspace, and comm for what collectives move). Own
// rows: this rank's tokens in its rows_of order; step rows: all N tokens in step order.
template <class T>
struct BasicTspmDecoder<T>::Scratch {
  int D, r, B, N, C, NH, NKV, hs, NHl, NKVl, Fl, Vl;
  std::size_t own, rows, qdl, kvl, kvd, Cz, part;  // part: one token's partial (out + lse)
  std::vector<std::int64_t> own_positions;         // [own]
  std::vector<std::int64_t> kpos;                  // one key block's positions
  Buffer<T> x, mid, xn, rstd, q, k, v, stage_k, stage_v, qall, qstep, out, lse, kblk, vblk, send,
      recv, att, att_lse, gate, up, h;

  Scratch(Arena& a, const DecodeShape& s, int rank, const Step& st, const RankKvCache<T>& cache) {
    const ref::ModelConfig& m = s.model;
    D = s.D, r = rank, B = s.batch, N = st.batch.rows(), C = m.hidden, NH = m.n_heads;
    NKV = m.n_kv_heads, hs = m.head_size(), NHl = NH / D, NKVl = NKV / D, Fl = m.ffn / D;
    Vl = m.vocab / D;
    own = st.owned(r), rows = z(N), Cz = z(C);
    qdl = z(NHl) * z(hs), kvl = z(NKVl) * z(hs), kvd = z(NKV) * z(hs);
    part = qdl + z(NHl);
    for (const std::size_t n : st.rows_of[z(r)]) own_positions.push_back(st.batch.positions[n]);
    std::size_t max_keys = 1;
    for (int b = 0; b < B; ++b)
      max_keys = std::max(max_keys, z(cache.held(0, b)) + z(st.cnt[z(r)][z(b)]));
    const std::size_t ownz = std::max<std::size_t>(own, 1), F = ownz * z(Fl);
    x = a.allocate<T>(ownz * Cz, Category::workspace);
    mid = a.allocate<T>(ownz * Cz, Category::workspace);
    xn = a.allocate<T>(ownz * Cz, Category::workspace);
    rstd = a.allocate<T>(ownz, Category::workspace);
    q = a.allocate<T>(ownz * qdl, Category::comm);
    k = a.allocate<T>(ownz * kvl, Category::workspace);
    v = a.allocate<T>(ownz * kvl, Category::workspace);
    stage_k = a.allocate<T>(ownz * kvd, Category::workspace);
    stage_v = a.allocate<T>(ownz * kvd, Category::workspace);
    qall = a.allocate<T>(rows * qdl, Category::comm);
    qstep = a.allocate<T>(rows * qdl, Category::workspace);
    out = a.allocate<T>(rows * qdl, Category::workspace);
    lse = a.allocate<T>(rows * z(NHl), Category::workspace);
    kblk = a.allocate<T>(max_keys * kvl, Category::workspace);
    vblk = a.allocate<T>(max_keys * kvl, Category::workspace);
    send = a.allocate<T>(rows * part, Category::comm);
    recv = a.allocate<T>(z(D) * ownz * part, Category::comm);
    att = a.allocate<T>(ownz * qdl, Category::workspace);
    att_lse = a.allocate<T>(ownz * z(NHl), Category::workspace);
    gate = a.allocate<T>(F, Category::workspace);
    up = a.allocate<T>(F, Category::workspace);
    h = a.allocate<T>(F, Category::workspace);
  }
};

template <class T>
std::vector<T> BasicTspmDecoder<T>::forward(detail::DecodeStep&& step) {
  const Step st(std::move(step), cache_->ownership(), s_.D);
  Scratch sc(rank_.arena(), s_, rank_.id(), st, *cache_);
  embed(st, sc);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, st, sc);
    mlp(l, st, sc);
  }
  return lm_head(st, sc);
}

// x = embed_tokens of this rank's tokens: vocabulary shard s broadcast by its owner, the rows of
// ids in it copied (exact).
template <class T>
void BasicTspmDecoder<T>::embed(const Step& st, Scratch& sc) {
  Weights& w = *w_;
  const std::size_t shard = z(sc.Vl) * sc.Cz;
  for (int s = 0; s < sc.D; ++s) {
    T* E = s == sc.r ? w.embed.data() : w.vocab_in.data();
    detail::measured(rank_, traffic_.embedding,
                     [&] { broadcast<T>(rank_.comm(), std::span<T>(E, shard), s); });
    for (std::size_t i = 0; i < sc.own; ++i) {
      const int t = st.batch.tokens[st.rows_of[z(sc.r)][i]];
      if (t / sc.Vl == s) std::copy_n(E + z(t - s * sc.Vl) * sc.Cz, sc.Cz, sc.x.data() + i * sc.Cz);
    }
  }
}

// The attention block of layer l: mid = x + Σ_s att^(s)·W_O^(s)ᵀ over the D broadcast shards,
// then this step's K/V rows appended to the cache.
template <class T>
void BasicTspmDecoder<T>::attention(int l, const Step& st, Scratch& sc) {
  const auto lz = z(l);
  std::copy_n(sc.x.data(), sc.own * sc.Cz, sc.mid.data());
  ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.x.data(), w_->input_norm[lz].data(),
                       static_cast<int>(sc.own), sc.C, s_.model.norm_eps);
  for (int s = 0; s < sc.D; ++s) attend_shard(l, s, st, sc);
  for (int b = 0; b < sc.B; ++b)
    for (int j = 0; j < st.cnt[z(sc.r)][z(b)]; ++j) {
      const std::size_t i = st.first[z(sc.r)][z(b)] + z(j);
      cache_->append(l, b, sc.own_positions[i], sc.stage_k.data() + i * sc.kvd,
                     sc.stage_v.data() + i * sc.kvd);
    }
}

// Head shard s of layer l: broadcast, this rank's tokens' q/k/v, the queries gathered, partial
// attention over this rank's keys, the partials to their owners, merged, o_proj into mid.
template <class T>
void BasicTspmDecoder<T>::attend_shard(int l, int s, const Step& st, Scratch& sc) {
  const ref::ModelConfig& m = s_.model;
  Weights& w = *w_;
  Comm& comm = rank_.comm();
  const std::size_t qdl = sc.qdl, kvl = sc.kvl, Cz = sc.Cz;
  T* W = s == sc.r ? w.attention[z(l)].data() : w.attention_in.data();
  detail::measured(rank_, traffic_.attention_shards, [&] {
    broadcast<T>(comm, std::span<T>(W, attention_shard_size(w.packing)), s);
  });
  const auto aw = attention_view(static_cast<const T*>(W), w.packing);
  const auto& first = st.first[z(sc.r)];
  const auto& cnt = st.cnt[z(sc.r)];
  for (int b = 0; b < sc.B; ++b) {  // this rank's rows of sequence b
    const std::size_t o = first[z(b)];
    const int n = cnt[z(b)];
    if (n == 0) continue;
    const T* xn = sc.xn.data() + o * Cz;
    ref::matmul_nt(sc.q.data() + o * qdl, xn, aw.wq, n, static_cast<int>(qdl), sc.C);
    ref::matmul_nt(sc.k.data() + o * kvl, xn, aw.wk, n, static_cast<int>(kvl), sc.C);
    ref::matmul_nt(sc.v.data() + o * kvl, xn, aw.wv, n, static_cast<int>(kvl), sc.C);
    const std::int64_t* pos = sc.own_positions.data() + o;
    ref::rope_forward(sc.q.data() + o * qdl, pos, 1, n, sc.NHl, sc.hs, m.rope_base);
    ref::rope_forward(sc.k.data() + o * kvl, pos, 1, n, sc.NKVl, sc.hs, m.rope_base);
  }
  for (std::size_t i = 0; i < sc.own; ++i) {
    std::copy_n(sc.k.data() + i * kvl, kvl, sc.stage_k.data() + i * sc.kvd + z(s) * kvl);
    std::copy_n(sc.v.data() + i * kvl, kvl, sc.stage_v.data() + i * sc.kvd + z(s) * kvl);
  }
  // q gather: every rank's rows, rank-major, then back to step order
  detail::measured(rank_, traffic_.q_gather, [&] {
    all_gatherv<T>(comm, std::span<const T>(sc.q.data(), sc.own * qdl), sc.qall.span());
  });
  std::size_t g = 0;
  for (int p = 0; p < sc.D; ++p)
    for (const std::size_t n : st.rows_of[z(p)])
      std::copy_n(sc.qall.data() + (g++) * qdl, qdl, sc.qstep.data() + n * qdl);
  // attend: each sequence's queries over this rank's keys of it in head slice s
  for (int b = 0; b < sc.B; ++b) {
    const std::size_t o = st.batch.offset[z(b)];
    const auto cached = cache_->positions(l, b);
    const std::size_t held = cached.size(), mine = z(cnt[z(b)]);
    const T* ck = cache_->keys(l, b);
    const T* cv = cache_->values(l, b);
    sc.kpos.assign(cached.begin(), cached.end());
    for (std::size_t t = 0; t < held; ++t) {
      std::copy_n(ck + t * sc.kvd + z(s) * kvl, kvl, sc.kblk.data() + t * kvl);
      std::copy_n(cv + t * sc.kvd + z(s) * kvl, kvl, sc.vblk.data() + t * kvl);
    }
    for (std::size_t i = 0; i < mine; ++i) {
      const std::size_t own_row = first[z(b)] + i;
      std::copy_n(sc.k.data() + own_row * kvl, kvl, sc.kblk.data() + (held + i) * kvl);
      std::copy_n(sc.v.data() + own_row * kvl, kvl, sc.vblk.data() + (held + i) * kvl);
      sc.kpos.push_back(sc.own_positions[own_row]);
    }
    const int nq = st.batch.count[z(b)];
    ref::causal_attention_forward(
        sc.out.data() + o * qdl, sc.lse.data() + z(sc.NHl) * o, sc.qstep.data() + o * qdl,
        sc.kblk.data(), sc.vblk.data(), st.batch.positions.data() + o, sc.kpos.data(),
        ref::AttentionDims{1, nq, static_cast<int>(sc.kpos.size()), sc.NHl, sc.NKVl, sc.hs});
  }
  exchange_partials(st, sc);
  for (int b = 0; b < sc.B; ++b) {  // o_proj of head shard s, added to this rank's rows
    const std::size_t o = first[z(b)];
    if (cnt[z(b)] == 0) continue;
    ref::matmul_nt(sc.mid.data() + o * Cz, sc.att.data() + o * qdl, aw.wo, cnt[z(b)], sc.C,
                   static_cast<int>(qdl), /*accumulate=*/true);
  }
}

// Partials to the token owners. Rank p's message: per sequence b, its cnt[p][b] rows' out
// [cnt, NHl, hs] then their lse [NHl, cnt]; rank p merges the D messages (its own partial in its
// place) in rank order into att, att_lse.
template <class T>
void BasicTspmDecoder<T>::exchange_partials(const Step& st, Scratch& sc) {
  const std::size_t qdl = sc.qdl, NHl = z(sc.NHl);
  std::vector<std::size_t> base(z(sc.D) + 1, 0);  // element offset of rank p's message in send
  for (int p = 0; p < sc.D; ++p) base[z(p) + 1] = base[z(p)] + st.owned(p) * sc.part;
  for (int p = 0; p < sc.D; ++p)
    for (int b = 0; b < sc.B; ++b) {
      const std::size_t c = z(st.cnt[z(p)][z(b)]), f = st.first[z(p)][z(b)];
      if (c == 0) continue;
      T* msg = sc.send.data() + base[z(p)] + f * sc.part;
      const std::size_t o = st.batch.offset[z(b)], nb = z(st.batch.count[z(b)]);
      for (std::size_t i = 0; i < c; ++i) {
        const std::size_t n = st.rows_of[z(p)][f + i];
        std::copy_n(sc.out.data() + n * qdl, qdl, msg + i * qdl);
        for (std::size_t hh = 0; hh < NHl; ++hh)
          msg[c * qdl + hh * c + i] = sc.lse[NHl * o + hh * nb + (n - o)];
      }
    }
  const std::size_t mine = sc.own * sc.part;
  detail::measured(rank_, traffic_.partials, [&] {
    std::vector<SendHandle> sends;
    std::vector<RecvHandle> recvs;
    for (int p = 0; p < sc.D; ++p)
      if (p != sc.r && st.owned(p) > 0)
        sends.push_back(isend<T>(
            rank_.comm(),
            std::span<const T>(sc.send.data() + base[z(p)], base[z(p) + 1] - base[z(p)]), p));
    if (mine > 0)
      for (int q = 0; q < sc.D; ++q)
        if (q != sc.r)
          recvs.push_back(
              irecv<T>(rank_.comm(), std::span<T>(sc.recv.data() + z(q) * mine, mine), q));
    for (RecvHandle& h : recvs) h.wait();
    for (SendHandle& h : sends) h.wait();
  });
  std::fill_n(sc.att.data(), sc.own * qdl, T(0));
  std::fill_n(sc.att_lse.data(), sc.own * NHl, -std::numeric_limits<T>::infinity());
  for (int q = 0; q < sc.D; ++q) {  // rank order: the same sums whoever owns the token
    const T* from = q == sc.r ? sc.send.data() + base[z(sc.r)] : sc.recv.data() + z(q) * mine;
    for (int b = 0; b < sc.B; ++b) {
      const int c = st.cnt[z(sc.r)][z(b)];
      if (c == 0) continue;
      const std::size_t f = st.first[z(sc.r)][z(b)];
      const T* part = from + f * sc.part;
      ref::merge_attention_partials(sc.att.data() + f * qdl, sc.att_lse.data() + NHl * f, part,
                                    part + z(c) * qdl,
                                    ref::AttentionDims{1, c, 0, sc.NHl, sc.NHl, sc.hs});
    }
  }
}

// The MLP block of layer l: x = mid + Σ_o down^(o)(silu(gate^(o)) ⊙ up^(o)), the shards arriving
// round the ring (o = r, r-1, ...), the next hop in flight during each shard's GEMMs.
template <class T>
void BasicTspmDecoder<T>::mlp(int l, const Step& st, Scratch& sc) {
  Weights& w = *w_;
  const std::size_t shard = mlp_shard_size(w.packing);
  ref::rmsnorm_forward(sc.xn.data(), sc.rstd.data(), sc.mid.data(), w.post_norm[z(l)].data(),
                       static_cast<int>(sc.own), sc.C, s_.model.norm_eps);
  std::copy_n(sc.mid.data(), sc.own * sc.Cz, sc.x.data());
  const auto& first = st.first[z(sc.r)];
  const auto& cnt = st.cnt[z(sc.r)];
  T* cur = w.mlp[z(l)].data();
  for (int k = 0; k < sc.D; ++k) {
    T* next = k % 2 == 0 ? w.mlp_ring0.data() : w.mlp_ring1.data();
    SendHandle sent;
    RecvHandle got;
    if (k + 1 < sc.D)
      detail::measured(rank_, traffic_.mlp_shards, [&] {
        sent = isend<T>(rank_.comm(), std::span<const T>(cur, shard), (sc.r + 1) % sc.D);
        got = irecv<T>(rank_.comm(), std::span<T>(next, shard), (sc.r + sc.D - 1) % sc.D);
      });
    const auto mw = mlp_view(static_cast<const T*>(cur), w.packing);
    for (int b = 0; b < sc.B; ++b) {
      const std::size_t o = first[z(b)];
      const int n = cnt[z(b)];
      if (n == 0) continue;
      const std::size_t f = o * z(sc.Fl);
      ref::matmul_nt(sc.gate.data() + f, sc.xn.data() + o * sc.Cz, mw.gate, n, sc.Fl, sc.C);
      ref::matmul_nt(sc.up.data() + f, sc.xn.data() + o * sc.Cz, mw.up, n, sc.Fl, sc.C);
      ref::silu_mul_forward(sc.h.data() + f, sc.gate.data() + f, sc.up.data() + f, z(n) * z(sc.Fl));
      ref::matmul_nt(sc.x.data() + o * sc.Cz, sc.h.data() + f, mw.down, n, sc.C, sc.Fl,
                     /*accumulate=*/true);
    }
    if (k + 1 < sc.D) {
      detail::measured(rank_, traffic_.mlp_shards, [&] {
        got.wait();
        sent.wait();
      });
      cur = next;
    }
  }
}

// LM head: final norm of each sequence's last row on its owner, logits against the D broadcast
// vocabulary shards, the owners' rows all-gathered into [B, V].
template <class T>
std::vector<T> BasicTspmDecoder<T>::lm_head(const Step& st, Scratch& sc) {
  Arena& a = rank_.arena();
  Weights& w = *w_;
  const auto V = z(s_.model.vocab), Vl = z(sc.Vl), shard = Vl * sc.Cz;
  std::vector<std::size_t> last;  // own row index of each sequence's last row this rank owns
  for (int b = 0; b < sc.B; ++b)
    if (st.last_owner[z(b)] == sc.r)
      last.push_back(st.first[z(sc.r)][z(b)] + z(st.cnt[z(sc.r)][z(b)]) - 1);
  auto xn = a.allocate<T>(std::max<std::size_t>(last.size(), 1) * sc.Cz, Category::workspace);
  auto mine = a.allocate<T>(std::max<std::size_t>(last.size(), 1) * V, Category::comm);
  auto all = a.allocate<T>(z(sc.B) * V, Category::comm);
  for (std::size_t i = 0; i < last.size(); ++i)
    ref::rmsnorm_forward(xn.data() + i * sc.Cz, sc.rstd.data(), sc.x.data() + last[i] * sc.Cz,
                         w.final_norm.data(), 1, sc.C, s_.model.norm_eps);
  for (int s = 0; s < sc.D; ++s) {
    T* H = s == sc.r ? w.head_rows() : w.vocab_in.data();
    detail::measured(rank_, traffic_.lm_head,
                     [&] { broadcast<T>(rank_.comm(), std::span<T>(H, shard), s); });
    for (std::size_t i = 0; i < last.size(); ++i)
      ref::matmul_nt(mine.data() + i * V + z(s) * Vl, xn.data() + i * sc.Cz, H, 1, sc.Vl, sc.C);
  }
  detail::measured(rank_, traffic_.logits, [&] {
    all_gatherv<T>(rank_.comm(), std::span<const T>(mine.data(), last.size() * V), all.span());
  });
  std::vector<T> logits(z(sc.B) * V);
  std::size_t g = 0;
  for (int p = 0; p < sc.D; ++p)
    for (int b = 0; b < sc.B; ++b)
      if (st.last_owner[z(b)] == p)
        std::copy_n(all.data() + (g++) * V, V, logits.data() + z(b) * V);
  return logits;
}

template class DecoderBase<float, DecodeShape, TspmTraffic>;
template class DecoderBase<double, DecodeShape, TspmTraffic>;
template class BasicTspmDecoder<float>;
template class BasicTspmDecoder<double>;

}  // namespace tspemu::tsp
