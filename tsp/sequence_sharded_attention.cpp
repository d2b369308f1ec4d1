#include "tspemu/tsp/sequence_sharded_attention.hpp"

#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "sequence_core.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/runtime/reduce_buffers.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

namespace {

constexpr const char* kWho = "sequence-sharded attention";

// The world's rank's zigzag row, once the shape is known to be valid on this world.
std::vector<std::int64_t> world_positions(const Rank& rank, const BaselineShape& shape) {
  detail::check_sequence_shape(kWho, rank.size(), shape);
  return shape.positions(rank.id());
}

}  // namespace

SequenceShardedAttention::SequenceShardedAttention(Rank& rank, const BaselineShape& shape,
                                                   const ref::LayerWeights<float>& master,
                                                   ref::AttentionCore<float> core)
    : SequenceShardedAttention(rank.comm(), rank.arena(), shape, world_positions(rank, shape),
                               master, std::move(core)) {}

SequenceShardedAttention::SequenceShardedAttention(Comm& group, Arena& arena,
                                                   const BaselineShape& shape,
                                                   std::span<const std::int64_t> pos,
                                                   const ref::LayerWeights<float>& master,
                                                   ref::AttentionCore<float> core)
    : comm_(group), arena_(arena), s_(shape), shard_(shape.shard_shape()), core_(std::move(core)) {
  detail::check_sequence_shape(kWho, group.size(), s_);
  if (!core_.forward || !core_.backward)
    throw std::invalid_argument(
        "sequence-sharded attention: the core's forward or backward is "
        "empty");
  if (pos.size() != static_cast<std::size_t>(s_.Tl()))
    throw std::invalid_argument("sequence-sharded attention: " + std::to_string(pos.size()) +
                                " positions for Tl=" + std::to_string(s_.Tl()) + " tokens");
  Arena& a = arena;
  positions_ = a.allocate<std::int64_t>(pos.size(), Category::other);
  w_ = a.allocate<float>(attention_shard_size(shard_), Category::weights);
  norm_w_ = a.allocate<float>(static_cast<std::size_t>(s_.model.hidden), Category::weights);
  if (dry_run()) return;  // unbacked buffers; `master` may be empty (core/dry_run.hpp)
  std::memcpy(positions_.data(), pos.data(), pos.size() * sizeof(std::int64_t));
  pack_attention_shard(master, shard_, 0, w_.data());
  std::memcpy(norm_w_.data(), master.input_norm.data(), norm_w_.size() * sizeof(float));
}

void SequenceShardedAttention::project(float* q, float* k, float* v) {
  const int M = s_.B * s_.Tl(), C = s_.model.hidden, NH = s_.model.n_heads;
  const int NKV = s_.model.n_kv_heads, hs = s_.hs();
  const auto w = attention_view(static_cast<const float*>(w_.data()), shard_);
  // torch: q = n @ wq.T ; k = n @ wk.T ; v = n @ wv.T ; q, k = rope(q, k)
  ref::matmul_nt(q, xn_.data(), w.wq, M, NH * hs, C);
  ref::matmul_nt(k, xn_.data(), w.wk, M, NKV * hs, C);
  ref::matmul_nt(v, xn_.data(), w.wv, M, NKV * hs, C);
  ref::rope_forward(q, positions_.data(), s_.B, s_.Tl(), NH, hs, s_.model.rope_base);
  ref::rope_forward(k, positions_.data(), s_.B, s_.Tl(), NKV, hs, s_.model.rope_base);
}

void SequenceShardedAttention::forward(const float* x, float* y) {
  Arena& a = arena_;
  auto phase = a.phase("attention");
  const int M = s_.B * s_.Tl(), C = s_.model.hidden;
  const int qd = s_.model.q_dim(), kvd = s_.model.kv_dim();
  const std::size_t Mq = static_cast<std::size_t>(M) * qd, Mk = static_cast<std::size_t>(M) * kvd;
  xn_.reset();
  rstd_.reset();
  att_.reset();
  lse_.reset();
  xn_ = a.allocate<float>(static_cast<std::size_t>(M) * C, Category::activations);
  rstd_ = a.allocate<float>(static_cast<std::size_t>(M), Category::activations);
  att_ = a.allocate<float>(Mq, Category::activations);
  lse_ = a.allocate<float>(static_cast<std::size_t>(s_.B) * s_.model.n_heads * s_.Tl(),
                           Category::activations);
  ref::rmsnorm_forward(xn_.data(), rstd_.data(), x, norm_w_.data(), M, C, s_.model.norm_eps);
  auto q = a.allocate<float>(Mq, Category::workspace);       // [B, Tl, NH, hs]
  auto kv = a.allocate<float>(2 * Mk, Category::workspace);  // K then V, [B, Tl, NKV, hs] each
  project(q.data(), kv.data(), kv.data() + Mk);
  const ref::AttentionDims d{s_.B,   s_.Tl(), s_.Tl(), s_.model.n_heads, s_.model.n_kv_heads,
                             s_.hs()};
  core_.forward(att_.data(), lse_.data(), q.data(), kv.data(), kv.data() + Mk, positions_.data(),
                d);
  // torch: y = x + att @ wo.T      (as the reference: the residual first, then accumulate)
  if (!dry_run()) std::memcpy(y, x, static_cast<std::size_t>(M) * C * sizeof(float));
  ref::matmul_nt(y, att_.data(), attention_view(w_.data(), shard_).wo, M, C, qd, true);
}

void SequenceShardedAttention::backward(const float* x, const float* dy, float* dx) {
  Arena& a = arena_;
  auto phase = a.phase("attention.backward");
  const int M = s_.B * s_.Tl(), C = s_.model.hidden;
  const int qd = s_.model.q_dim(), kvd = s_.model.kv_dim();
  const std::size_t Mq = static_cast<std::size_t>(M) * qd, Mk = static_cast<std::size_t>(M) * kvd;
  if (grad_.empty()) {
    grad_ = a.allocate<float>(w_.size(), Category::gradients);
    grad_norm_ = a.allocate<float>(static_cast<std::size_t>(C), Category::gradients);
  }
  const auto w = attention_view(static_cast<const float*>(w_.data()), shard_);
  const auto g = attention_view(grad_.data(), shard_);
  auto da = a.allocate<float>(Mq, Category::workspace);
  // torch: da = dy @ wo ;  dwo = dy.T @ att
  ref::matmul_nn(da.data(), dy, w.wo, M, qd, C);
  ref::matmul_tn(g.wo, dy, att_.data(), C, qd, M);
  auto q = a.allocate<float>(Mq, Category::workspace);
  auto kv = a.allocate<float>(2 * Mk, Category::workspace);
  project(q.data(), kv.data(), kv.data() + Mk);
  auto dq = a.allocate<float>(Mq, Category::workspace);
  auto dkv = a.allocate<float>(2 * Mk, Category::workspace);
  float* dk = dkv.data();
  float* dv = dkv.data() + Mk;
  const ref::AttentionDims d{s_.B,   s_.Tl(), s_.Tl(), s_.model.n_heads, s_.model.n_kv_heads,
                             s_.hs()};
  core_.backward(dq.data(), dk, dv, da.data(), q.data(), kv.data(), kv.data() + Mk, att_.data(),
                 lse_.data(), positions_.data(), d);
  // Q, K, V and dA are done with: release them before dN is allocated.
  q.reset();
  kv.reset();
  da.reset();
  ref::rope_backward(dq.data(), positions_.data(), s_.B, s_.Tl(), d.NH, d.hs, s_.model.rope_base);
  ref::rope_backward(dk, positions_.data(), s_.B, s_.Tl(), d.NKV, d.hs, s_.model.rope_base);
  // torch: dn = dq @ wq + dk @ wk + dv @ wv ;  dwq = dq.T @ n  (likewise dwk, dwv)
  auto dxn = a.allocate<float>(static_cast<std::size_t>(M) * C, Category::workspace);
  ref::matmul_nn(dxn.data(), dq.data(), w.wq, M, C, qd);
  ref::matmul_nn(dxn.data(), dk, w.wk, M, C, kvd, true);
  ref::matmul_nn(dxn.data(), dv, w.wv, M, C, kvd, true);
  ref::matmul_tn(g.wq, dq.data(), xn_.data(), qd, C, M);
  ref::matmul_tn(g.wk, dk, xn_.data(), kvd, C, M);
  ref::matmul_tn(g.wv, dv, xn_.data(), kvd, C, M);
  if (!dry_run()) std::memset(grad_norm_.data(), 0, grad_norm_.size() * sizeof(float));
  ref::rmsnorm_backward(dx, grad_norm_.data(), dxn.data(), x, norm_w_.data(), rstd_.data(), M, C);
  if (!dry_run())
    for (std::size_t i = 0; i < static_cast<std::size_t>(M) * C; ++i) dx[i] += dy[i];  // residual
  if (s_.Sp > 1) {
    // This rank's tokens' share of every gradient → the sum over the ranks, one collective.
    const std::span<float> sets[] = {grad_.span(), grad_norm_.span()};
    all_reduce_buffers<float>(comm_, sets);
  }
}

}  // namespace tspemu::tsp
