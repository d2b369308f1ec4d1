#include "tspemu/tsp/tsp_attention.hpp"

#include <cstring>
#include <numeric>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/trace.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

namespace {

struct Dims {
  int B, Tl, S, C, D, hs, NHl, NKVl, nb, NHb, NKVb;
  int M() const { return B * Tl; }                                           // local token rows
  std::size_t q_cols() const { return static_cast<std::size_t>(NHb) * hs; }  // one bucket's Q width
  std::size_t kv_cols() const {
    return static_cast<std::size_t>(NKVb) * hs;
  }  // one bucket's K width
};

Dims dims_of(const TspShape& s) {
  const int nb = s.options.head_buckets;
  return {s.B,     s.Tl(),   s.S, s.model.hidden, s.D,          s.hs(),
          s.NHl(), s.NKVl(), nb,  s.NHl() / nb,   s.NKVl() / nb};
}

// Gathered K/V arrive rank-major, [D][2][B·Tl, NKVb·hs] (K then V of each rank); the attention
// kernel wants them by global position, [B, S, NKVb·hs] each. (and back, for the gradients)
template <class T>
void order_by_position(const SequenceLayout& layout, const Dims& d, const T* gathered, T* k_all,
                       T* v_all) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const std::size_t row = d.kv_cols();
  const std::size_t block = static_cast<std::size_t>(d.M()) * row;
  for (int q = 0; q < d.D; ++q)
    for (int b = 0; b < d.B; ++b)
      for (int i = 0; i < d.Tl; ++i) {
        const std::size_t src = static_cast<std::size_t>(q) * 2 * block +
                                (static_cast<std::size_t>(b) * d.Tl + i) * row;
        const std::size_t dst = (static_cast<std::size_t>(b) * d.S + layout.position(q, i)) * row;
        std::memcpy(k_all + dst, gathered + src, row * sizeof(T));
        std::memcpy(v_all + dst, gathered + src + block, row * sizeof(T));
      }
}

template <class T>
void order_by_rank(const SequenceLayout& layout, const Dims& d, const T* dk_all, const T* dv_all,
                   T* scattered) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  const std::size_t row = d.kv_cols();
  const std::size_t block = static_cast<std::size_t>(d.M()) * row;
  for (int q = 0; q < d.D; ++q)
    for (int b = 0; b < d.B; ++b)
      for (int i = 0; i < d.Tl; ++i) {
        const std::size_t dst = static_cast<std::size_t>(q) * 2 * block +
                                (static_cast<std::size_t>(b) * d.Tl + i) * row;
        const std::size_t src = (static_cast<std::size_t>(b) * d.S + layout.position(q, i)) * row;
        std::memcpy(scattered + dst, dk_all + src, row * sizeof(T));
        std::memcpy(scattered + dst + block, dv_all + src, row * sizeof(T));
      }
}

}  // namespace

template <class T>
BasicTspAttention<T>::BasicTspAttention(Rank& rank, const TspShape& shape,
                                        const ref::LayerWeights<T>& master)
    : BasicTspAttention(rank, rank.comm(), shape, master) {}

template <class T>
BasicTspAttention<T>::BasicTspAttention(Rank& rank, Comm& comm, const TspShape& shape,
                                        const ref::LayerWeights<T>& master)
    : rank_(rank), comm_(comm), s_(shape), layout_(shape.layout()) {
  s_.validate();
  if (comm.size() != s_.D)
    throw std::invalid_argument("TspAttention: group " + comm.name() + " has " +
                                std::to_string(comm.size()) +
                                " ranks but D=" + std::to_string(s_.D));
  const Dims d = dims_of(s_);
  Arena& a = rank.arena();
  positions_ = a.allocate<std::int64_t>(static_cast<std::size_t>(d.Tl), Category::other);
  k_positions_ = a.allocate<std::int64_t>(static_cast<std::size_t>(d.S), Category::other);
  w_ = a.allocate<T>(attention_shard_size(s_), Category::weights);
  norm_w_ = a.allocate<T>(static_cast<std::size_t>(d.C), Category::weights);
  if (dry_run()) return;  // unbacked buffers; `master` may be empty (core/dry_run.hpp)
  for (int i = 0; i < d.Tl; ++i)
    positions_[static_cast<std::size_t>(i)] = layout_.position(comm.rank(), i);
  std::iota(k_positions_.begin(), k_positions_.end(), 0);
  pack_attention_shard(master, s_, comm.rank(), w_.data());
  std::memcpy(norm_w_.data(), master.input_norm.data(), norm_w_.size() * sizeof(T));
}

template <class T>
void BasicTspAttention<T>::store(T* p, std::size_t n) const {
  if (!dry_run()) storage_.store(p, n);
}

// Q of one bucket of shard W for this rank's tokens, RoPE at their global positions.
template <class T>
void BasicTspAttention<T>::project_q(const T* W, int bucket, T* q) {
  const Dims d = dims_of(s_);
  const int qc = static_cast<int>(d.q_cols());
  // torch: q = n @ wq[bucket].T
  TraceSpan span(comm_, "q projection", 2.0 * d.M() * qc * d.C);
  ref::matmul_nt(q, xn_.data(),
                 attention_view(W, s_).wq + static_cast<std::size_t>(bucket) * qc * d.C, d.M(), qc,
                 d.C);
  store(q, static_cast<std::size_t>(d.M()) * qc);
  ref::rope_forward(q, positions_.data(), d.B, d.Tl, d.NHb, d.hs, s_.model.rope_base);
  store(q, static_cast<std::size_t>(d.M()) * qc);
}

// K and V of one bucket for this rank's tokens (RoPE on K) into kv_local, [2][B·Tl, NKVb·hs].
template <class T>
void BasicTspAttention<T>::project_kv(const T* W, int bucket, T* kv_local) {
  const Dims d = dims_of(s_);
  const auto view = attention_view(W, s_);
  const int M = d.M(), C = d.C, kc = static_cast<int>(d.kv_cols());
  T* k_local = kv_local;
  T* v_local = kv_local + static_cast<std::size_t>(M) * kc;
  // torch: k = n @ wk[bucket].T ;  v = n @ wv[bucket].T
  TraceSpan span(comm_, "k/v projection", 2.0 * 2 * M * kc * C);
  ref::matmul_nt(k_local, xn_.data(), view.wk + static_cast<std::size_t>(bucket) * kc * C, M, kc,
                 C);
  ref::matmul_nt(v_local, xn_.data(), view.wv + static_cast<std::size_t>(bucket) * kc * C, M, kc,
                 C);
  store(kv_local, 2 * static_cast<std::size_t>(M) * kc);
  ref::rope_forward(k_local, positions_.data(), d.B, d.Tl, d.NKVb, d.hs, s_.model.rope_base);
  store(k_local, static_cast<std::size_t>(M) * kc);
}

// One bucket's K/V projected and its all-gather issued (kv_local -> kv_gathered, rank-major);
// order_by_position after the wait puts it in global order.
template <class T>
CollectiveHandle BasicTspAttention<T>::start_kv_gather(const T* W, int bucket, T* kv_local,
                                                       T* kv_gathered) {
  const Dims d = dims_of(s_);
  project_kv(W, bucket, kv_local);
  const std::size_t kv_count = 2 * static_cast<std::size_t>(d.M()) * d.kv_cols();
  return iall_gather<T>(comm_, std::span<const T>(kv_local, kv_count),
                        std::span<T>(kv_gathered, kv_count * d.D));
}

// The serial form: projected, gathered (blocking) and put in global order into k_all, v_all.
template <class T>
void BasicTspAttention<T>::project_and_gather_kv(const T* W, int bucket, T* kv_local,
                                                 T* kv_gathered, T* k_all, T* v_all) {
  const Dims d = dims_of(s_);
  project_kv(W, bucket, kv_local);
  const std::size_t kv_count = 2 * static_cast<std::size_t>(d.M()) * d.kv_cols();
  all_gather<T>(comm_, std::span<const T>(kv_local, kv_count),
                std::span<T>(kv_gathered, kv_count * d.D));
  order_by_position(layout_, d, kv_gathered, k_all, v_all);
}

template <class T>
T* BasicTspAttention<T>::kept_shard(int r) {
  return r == comm_.rank() ? w_.data()
                           : kept_shards_.data() + static_cast<std::size_t>(r) * w_.size();
}

template <class T>
T* BasicTspAttention<T>::kept_k(int r, int bucket) {
  const Dims d = dims_of(s_);
  const std::size_t full = static_cast<std::size_t>(d.B) * d.S * d.kv_cols();
  return kept_kv_.data() + (static_cast<std::size_t>(r) * d.nb + bucket) * 2 * full;
}

template <class T>
T* BasicTspAttention<T>::kept_v(int r, int bucket) {
  const Dims d = dims_of(s_);
  return kept_k(r, bucket) + static_cast<std::size_t>(d.B) * d.S * d.kv_cols();
}

template <class T>
void BasicTspAttention<T>::forward(const T* x, T* y) {
  const Dims d = dims_of(s_);
  Arena& a = rank_.arena();
  auto phase = a.phase("attention");
  const int M = d.M(), C = d.C;
  const std::size_t MC = static_cast<std::size_t>(M) * C;
  const std::size_t full_kv = static_cast<std::size_t>(d.B) * d.S * d.kv_cols();
  // Drop the previous step's activations before taking new ones (peak = one step's worth).
  xn_.reset();
  rstd_.reset();
  att_.reset();
  lse_.reset();
  kept_shards_.reset();
  kept_kv_.reset();
  xn_ = a.allocate<T>(MC, Category::activations);
  rstd_ = a.allocate<T>(static_cast<std::size_t>(M), Category::activations);
  att_ =
      a.allocate<T>(static_cast<std::size_t>(d.D) * d.nb * M * d.q_cols(), Category::activations);
  lse_ = a.allocate<T>(static_cast<std::size_t>(d.D) * d.nb * d.B * d.NHb * d.Tl,
                       Category::activations);
  // Shard buffers for the non-owned shards: two when the next shard's broadcast is in flight
  // while the current one is used (options.overlap).
  const bool overlap = s_.options.overlap;
  auto wbuf = a.allocate<T>(attention_shard_size(s_) * (overlap ? 2 : 1), Category::comm);
  auto q = a.allocate<T>(static_cast<std::size_t>(M) * d.q_cols(), Category::workspace);
  auto kv_local = a.allocate<T>(2 * static_cast<std::size_t>(M) * d.kv_cols(), Category::workspace);
  auto kv_gathered =
      a.allocate<T>(2 * static_cast<std::size_t>(M) * d.kv_cols() * d.D, Category::kv);
  auto k_all = a.allocate<T>(full_kv, Category::kv);
  auto v_all = a.allocate<T>(full_kv, Category::kv);
  if (s_.options.keep_attention_shards)
    kept_shards_ = a.allocate<T>(w_.size() * d.D, Category::comm);
  if (s_.options.keep_kv) kept_kv_ = a.allocate<T>(full_kv * 2 * d.D * d.nb, Category::kv);

  ref::rmsnorm_forward(xn_.data(), rstd_.data(), x, norm_w_.data(), M, C, s_.model.norm_eps);
  store(xn_.data(), MC);
  if (!dry_run()) std::memcpy(y, x, MC * sizeof(T));
  const ref::AttentionDims ad{d.B, d.Tl, d.S, d.NHb, d.NKVb, d.hs};
  // The owner broadcasts straight from its weight buffer; the others receive into wbuf (shard r
  // into half r mod 2 when overlapping, so shard r+1 can arrive while shard r is in use).
  auto shard_buffer = [&](int r) {
    return r == comm_.rank()                  ? w_.data()
           : s_.options.keep_attention_shards ? kept_shard(r)
                                              : wbuf.data() + (overlap ? r % 2 : 0) * w_.size();
  };
  // Overlapped, the communication stream carries each transfer in the order it is needed: shard
  // r's bucket b+1 K/V all-gather is issued before bucket b's attention, and shard r+1's
  // broadcast right after shard r's last all-gather, so it runs under shard r's last attention.
  CollectiveHandle next_shard, gathering;
  if (overlap) next_shard = ibroadcast<T>(comm_, std::span<T>(shard_buffer(0), w_.size()), 0);
  for (int r = 0; r < d.D; ++r) {
    T* W = shard_buffer(r);
    auto after_last_gather = [&](int bkt) {
      if (bkt == d.nb - 1 && r + 1 < d.D)
        next_shard = ibroadcast<T>(comm_, std::span<T>(shard_buffer(r + 1), w_.size()), r + 1);
    };
    if (overlap) {
      next_shard.wait();
      gathering = start_kv_gather(W, 0, kv_local.data(), kv_gathered.data());
      after_last_gather(0);
    } else {
      broadcast<T>(comm_, std::span<T>(W, w_.size()), r);
    }
    const auto view = attention_view(static_cast<const T*>(W), s_);
    for (int bkt = 0; bkt < d.nb; ++bkt) {
      T* k = s_.options.keep_kv ? kept_k(r, bkt) : k_all.data();
      T* v = s_.options.keep_kv ? kept_v(r, bkt) : v_all.data();
      project_q(W, bkt, q.data());
      if (overlap) {
        // kv_local and kv_gathered are free again once bucket bkt is in global order.
        gathering.wait();
        order_by_position(layout_, d, kv_gathered.data(), k, v);
        if (bkt + 1 < d.nb) {
          gathering = start_kv_gather(W, bkt + 1, kv_local.data(), kv_gathered.data());
          after_last_gather(bkt + 1);
        }
      } else {
        project_and_gather_kv(W, bkt, kv_local.data(), kv_gathered.data(), k, v);
      }
      T* att = att_.data() + (static_cast<std::size_t>(r) * d.nb + bkt) * M * d.q_cols();
      T* lse = lse_.data() + (static_cast<std::size_t>(r) * d.nb + bkt) * d.B * d.NHb * d.Tl;
      {
        // QK^T and PV over the causal half of the keys: 2 x 2 x B x NHb x Tl x S x hs / 2 FLOPs.
        TraceSpan span(comm_, "attention", 2.0 * d.B * d.NHb * d.Tl * d.S * d.hs);
        ref::causal_attention_forward(att, lse, q.data(), k, v, positions_.data(),
                                      k_positions_.data(), ad);
        store(att, static_cast<std::size_t>(M) * d.q_cols());
      }
      // torch: y += att @ wo[:, bucket].T       (partial o_proj over this shard's heads)
      TraceSpan span(comm_, "o projection", 2.0 * M * C * d.q_cols());
      ref::matmul_nt(y, att, view.wo + bkt * d.q_cols(), M, C, static_cast<int>(d.q_cols()), true,
                     static_cast<int>(d.q_cols()), d.NHl * d.hs, C);
    }
  }
  store(y, MC);  // y = x + Σ over shards and buckets, fp32, rounded once as in the reference
}

template <class T>
void BasicTspAttention<T>::backward(const T* x, const T* dy, T* dx) {
  const Dims d = dims_of(s_);
  Arena& a = rank_.arena();
  auto phase = a.phase("attention.backward");
  const int M = d.M(), C = d.C;
  const int qc = static_cast<int>(d.q_cols()), kc = static_cast<int>(d.kv_cols());
  const std::size_t MC = static_cast<std::size_t>(M) * C;
  const std::size_t full_kv = static_cast<std::size_t>(d.B) * d.S * d.kv_cols();
  const std::size_t shard = attention_shard_size(s_);
  if (grad_.empty()) {
    grad_ = a.allocate<T>(shard, Category::gradients);
    grad_norm_ = a.allocate<T>(static_cast<std::size_t>(C), Category::gradients);
  }
  // options.overlap: two shard buffers (shard r+1 arrives while shard r is in use) and two
  // partial gradients (shard r's is reduced to its owner while shard r+1's accumulates).
  const bool overlap = s_.options.overlap;
  const bool gather_kv = !s_.options.keep_kv;
  const std::size_t halves = overlap ? 2 : 1;
  auto wbuf = a.allocate<T>(s_.options.keep_attention_shards ? 0 : shard * halves, Category::comm);
  // This rank's share of dW of shard r.
  auto partial = a.allocate<T>(shard * halves, Category::comm);
  // Overlapped with head buckets, bucket b+1's K/V all-gather lands in kv_gathered while bucket
  // b's dK/dV are reduce-scattered: they leave from this buffer of the same size instead.
  const bool dkv_apart = overlap && gather_kv && d.nb > 1;
  auto dkv_send =
      a.allocate<T>(dkv_apart ? 2 * static_cast<std::size_t>(M) * kc * d.D : 0, Category::comm);
  auto dxn = a.allocate<T>(MC, Category::workspace, /*zero=*/true);
  auto q = a.allocate<T>(static_cast<std::size_t>(M) * qc, Category::workspace);
  auto dq = a.allocate<T>(static_cast<std::size_t>(M) * qc, Category::workspace);
  auto da = a.allocate<T>(static_cast<std::size_t>(M) * qc, Category::workspace);
  auto kv_local = a.allocate<T>(2 * static_cast<std::size_t>(M) * kc, Category::workspace);
  auto dkv_local = a.allocate<T>(2 * static_cast<std::size_t>(M) * kc, Category::workspace);
  auto kv_gathered = a.allocate<T>(2 * static_cast<std::size_t>(M) * kc * d.D, Category::kv);
  auto k_all = a.allocate<T>(s_.options.keep_kv ? 0 : full_kv, Category::kv);
  auto v_all = a.allocate<T>(s_.options.keep_kv ? 0 : full_kv, Category::kv);
  auto dk_all = a.allocate<T>(full_kv, Category::kv);
  auto dv_all = a.allocate<T>(full_kv, Category::kv);
  T* dkv_scattered = dkv_apart ? dkv_send.data() : kv_gathered.data();

  const ref::AttentionDims ad{d.B, d.Tl, d.S, d.NHb, d.NKVb, d.hs};
  const bool rebroadcast = !s_.options.keep_attention_shards;
  auto shard_buffer = [&](int r) {
    return !rebroadcast        ? kept_shard(r)
           : r == comm_.rank() ? w_.data()
                               : wbuf.data() + (overlap ? r % 2 : 0) * shard;
  };
  // Overlapped, as in forward: bucket b+1's K/V all-gather is issued before bucket b's attention
  // backward, shard r+1's broadcast right after shard r's last all-gather (at the shard's start
  // when K/V are kept), bucket b's dK/dV reduce-scatter runs under its dQ GEMMs, and shard r's
  // weight-gradient reduce runs under shard r+1 (waited at its end).
  CollectiveHandle next_shard, gathering, scattering, reducing;
  if (overlap && rebroadcast)
    next_shard = ibroadcast<T>(comm_, std::span<T>(shard_buffer(0), shard), 0);
  const int last_gather = gather_kv ? d.nb - 1 : 0;
  for (int r = 0; r < d.D; ++r) {
    T* W = shard_buffer(r);
    auto after_gather = [&](int bkt) {
      if (overlap && rebroadcast && bkt == last_gather && r + 1 < d.D)
        next_shard = ibroadcast<T>(comm_, std::span<T>(shard_buffer(r + 1), shard), r + 1);
    };
    if (rebroadcast && overlap) next_shard.wait();
    if (rebroadcast && !overlap) broadcast<T>(comm_, std::span<T>(W, shard), r);
    if (overlap && gather_kv)
      gathering = start_kv_gather(W, 0, kv_local.data(), kv_gathered.data());
    after_gather(0);
    // Half r mod 2: its last reduce (shard r-2's) was waited at the end of shard r-1.
    T* P = partial.data() + (overlap ? r % 2 : 0) * shard;
    const auto view = attention_view(static_cast<const T*>(W), s_);
    const auto g = attention_view(P, s_);
    if (!dry_run()) std::memset(P, 0, shard * sizeof(T));
    for (int bkt = 0; bkt < d.nb; ++bkt) {
      project_q(W, bkt, q.data());
      T* k = s_.options.keep_kv ? kept_k(r, bkt) : k_all.data();
      T* v = s_.options.keep_kv ? kept_v(r, bkt) : v_all.data();
      if (gather_kv && overlap) {
        gathering.wait();
        order_by_position(layout_, d, kv_gathered.data(), k, v);
        if (bkt + 1 < d.nb) {
          gathering = start_kv_gather(W, bkt + 1, kv_local.data(), kv_gathered.data());
          after_gather(bkt + 1);
        }
      } else if (gather_kv) {
        project_and_gather_kv(W, bkt, kv_local.data(), kv_gathered.data(), k, v);
      }
      const T* att = att_.data() + (static_cast<std::size_t>(r) * d.nb + bkt) * M * d.q_cols();
      const T* lse = lse_.data() + (static_cast<std::size_t>(r) * d.nb + bkt) * d.B * d.NHb * d.Tl;
      const int ldo = d.NHl * d.hs;  // row stride of wo [C, NHl·hs]
      {
        TraceSpan span(comm_, "attention backward",
                       2.0 * 2 * M * qc * C + 2 * 2.0 * d.B * d.NHb * d.Tl * d.S * d.hs);
        // torch: da = dy @ wo[:, bucket] ;  dwo[:, bucket] += dy.T @ att
        ref::matmul_nn(da.data(), dy, view.wo + bkt * qc, M, qc, C, false, C, ldo, qc);
        ref::matmul_tn(g.wo + bkt * qc, dy, att, C, qc, M, true, C, qc, ldo);
        store(da.data(), static_cast<std::size_t>(M) * qc);
        ref::causal_attention_backward(dq.data(), dk_all.data(), dv_all.data(), da.data(), q.data(),
                                       k, v, lse, positions_.data(), k_positions_.data(), ad);
        store(dq.data(), static_cast<std::size_t>(M) * qc);
        // dK/dV stay fp32 until summed over every rank's queries (reduce_scatter below).
      }
      // dK, dV of every token go back to the rank that owns the token, summed over all ranks'
      // queries (reduce_scatter, rank order).
      order_by_rank(layout_, d, dk_all.data(), dv_all.data(), dkv_scattered);
      const std::size_t kv_count = 2 * static_cast<std::size_t>(M) * kc;
      const std::span<const T> dkv_all(dkv_scattered, kv_count * d.D);
      const std::span<T> dkv_mine(dkv_local.data(), kv_count);
      if (overlap)
        scattering = ireduce_scatter<T>(comm_, dkv_all, dkv_mine);
      else
        reduce_scatter<T>(comm_, dkv_all, dkv_mine);
      const std::size_t qo = static_cast<std::size_t>(bkt) * qc * C,
                        ko = static_cast<std::size_t>(bkt) * kc * C;
      ref::rope_backward(dq.data(), positions_.data(), d.B, d.Tl, d.NHb, d.hs, s_.model.rope_base);
      store(dq.data(), static_cast<std::size_t>(M) * qc);
      {
        // torch: dwq[bucket] += dq.T @ n ; dn += dq @ wq[bucket]   (before dK/dV: they need only
        // dQ)
        TraceSpan span(comm_, "q projection backward", 2.0 * 2 * M * C * qc);
        ref::matmul_tn(g.wq + qo, dq.data(), xn_.data(), qc, C, M, true);
        ref::matmul_nn(dxn.data(), dq.data(), view.wq + qo, M, C, qc, true);
      }
      scattering.wait();
      T* dk = dkv_local.data();
      T* dv = dkv_local.data() + static_cast<std::size_t>(M) * kc;
      store(dkv_local.data(), 2 * static_cast<std::size_t>(M) * kc);  // summed: the core's dk, dv
      ref::rope_backward(dk, positions_.data(), d.B, d.Tl, d.NKVb, d.hs, s_.model.rope_base);
      store(dk, static_cast<std::size_t>(M) * kc);
      // torch: dwk[bucket] += dk.T @ n ; dn += dk @ wk[bucket]   (likewise v)
      TraceSpan span(comm_, "k/v projection backward", 2.0 * 2 * M * C * 2 * kc);
      ref::matmul_tn(g.wk + ko, dk, xn_.data(), kc, C, M, true);
      ref::matmul_tn(g.wv + ko, dv, xn_.data(), kc, C, M, true);
      ref::matmul_nn(dxn.data(), dk, view.wk + ko, M, C, kc, true);
      ref::matmul_nn(dxn.data(), dv, view.wv + ko, M, C, kc, true);
    }
    // Every rank's partial dW of shard r, summed at its owner in rank order.
    const std::span<T> owned = r == comm_.rank() ? grad_.span() : std::span<T>();
    if (overlap) {
      CollectiveHandle reduced = ireduce<T>(comm_, std::span<const T>(P, shard), owned, r);
      reducing.wait();  // shard r-1's: frees its half for shard r+1
      reducing = std::move(reduced);
    } else {
      reduce<T>(comm_, std::span<const T>(P, shard), owned, r);
    }
  }
  reducing.wait();
  if (!dry_run()) std::memset(grad_norm_.data(), 0, grad_norm_.size() * sizeof(T));
  store(dxn.data(), MC);
  ref::rmsnorm_backward(dx, grad_norm_.data(), dxn.data(), x, norm_w_.data(), rstd_.data(), M, C);
  if (!dry_run())
    for (std::size_t i = 0; i < MC; ++i) dx[i] += dy[i];  // residual
  store(dx, MC);
  all_reduce<T>(comm_, grad_norm_.span());
}

template class BasicTspAttention<float>;
template class BasicTspAttention<double>;

}  // namespace tspemu::tsp
