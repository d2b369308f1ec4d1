#include "tspemu/tsp/baseline_attention.hpp"

#include <cstring>
#include <numeric>

#include "baseline_region.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/runtime/trace.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

BaselineAttention::BaselineAttention(Rank& rank, const BaselineShape& shape,
                                     const ref::LayerWeights<float>& master)
    : rank_(rank), s_(shape), shard_(shape.shard_shape()) {
  s_.validate();
  if (rank.size() != s_.ranks())
    throw std::invalid_argument(
        s_.strategy() + " attention: world has " + std::to_string(rank.size()) +
        " ranks but T·Sp=" + std::to_string(s_.T) + "·" + std::to_string(s_.Sp));
  region_ = std::make_unique<detail::MeshRegion>(rank, s_);
  Arena& a = rank.arena();
  const SequenceLayout rl = s_.row_layout();
  const int row = s_.row(rank.id()), col = s_.col(rank.id());
  positions_ = a.allocate<std::int64_t>(static_cast<std::size_t>(s_.Tl()), Category::other);
  k_positions_ = a.allocate<std::int64_t>(static_cast<std::size_t>(s_.S), Category::other);
  w_ = a.allocate<float>(attention_shard_size(shard_), Category::weights);
  norm_w_ = a.allocate<float>(static_cast<std::size_t>(s_.model.hidden), Category::weights);
  if (dry_run()) return;  // unbacked buffers; `master` may be empty (core/dry_run.hpp)
  for (int i = 0; i < s_.Tl(); ++i) positions_[static_cast<std::size_t>(i)] = rl.position(row, i);
  std::iota(k_positions_.begin(), k_positions_.end(), 0);
  pack_attention_shard(master, shard_, col, w_.data());
  std::memcpy(norm_w_.data(), master.input_norm.data(), norm_w_.size() * sizeof(float));
}

BaselineAttention::~BaselineAttention() = default;

void BaselineAttention::project_q(float* q) {
  const int M = s_.B * s_.Tl(), C = s_.model.hidden, qc = s_.NHl() * s_.hs();
  // torch: q = n @ wq.T
  TraceSpan span(rank_.comm(), "q projection", 2.0 * M * qc * C);
  ref::matmul_nt(q, xn_.data(), attention_view(w_.data(), shard_).wq, M, qc, C);
  ref::rope_forward(q, positions_.data(), s_.B, s_.Tl(), s_.NHl(), s_.hs(), s_.model.rope_base);
}

void BaselineAttention::project_kv(float* k, float* v) {
  const int M = s_.B * s_.Tl(), C = s_.model.hidden, kc = s_.NKVl() * s_.hs();
  const auto view = attention_view(w_.data(), shard_);
  // torch: k = n @ wk.T ;  v = n @ wv.T
  TraceSpan span(rank_.comm(), "k/v projection", 2.0 * 2 * M * kc * C);
  ref::matmul_nt(k, xn_.data(), view.wk, M, kc, C);
  ref::matmul_nt(v, xn_.data(), view.wv, M, kc, C);
  ref::rope_forward(k, positions_.data(), s_.B, s_.Tl(), s_.NKVl(), s_.hs(), s_.model.rope_base);
}

void BaselineAttention::gather_kv(const float* kv_local, float* gathered, float* k_all,
                                  float* v_all) {
  const std::size_t count = 2 * static_cast<std::size_t>(s_.B) * s_.Tl() * s_.NKVl() * s_.hs();
  all_gather<float>(region_->sp(), std::span<const float>(kv_local, count),
                    std::span<float>(gathered, count * s_.Sp));
  detail::kv_order_by_position(s_.row_layout(), s_.B, s_.NKVl() * s_.hs(), gathered, k_all, v_all);
}

void BaselineAttention::forward(const float* x, float* y) {
  Arena& a = rank_.arena();
  auto phase = a.phase("attention");
  const int M = s_.B * s_.Tl(), C = s_.model.hidden;
  const int qc = s_.NHl() * s_.hs(), kc = s_.NKVl() * s_.hs();
  const std::size_t Mk = static_cast<std::size_t>(M) * kc;
  const std::size_t full_kv = static_cast<std::size_t>(s_.B) * s_.S * kc;
  xn_.reset();
  rstd_.reset();
  att_.reset();
  lse_.reset();
  xn_ = a.allocate<float>(static_cast<std::size_t>(M) * C, Category::activations);
  rstd_ = a.allocate<float>(static_cast<std::size_t>(s_.B) * s_.rows(), Category::activations);
  att_ = a.allocate<float>(static_cast<std::size_t>(M) * qc, Category::activations);
  lse_ =
      a.allocate<float>(static_cast<std::size_t>(s_.B) * s_.NHl() * s_.Tl(), Category::activations);
  region_->enter(x, norm_w_.data(), xn_.data(), rstd_.data());
  auto q = a.allocate<float>(static_cast<std::size_t>(M) * qc, Category::workspace);
  auto kv_local = a.allocate<float>(2 * Mk, Category::workspace);
  project_q(q.data());
  project_kv(kv_local.data(), kv_local.data() + Mk);
  const float* k = kv_local.data();
  const float* v = kv_local.data() + Mk;
  Buffer<float> kv_gathered, k_all, v_all;
  if (s_.Sp > 1) {
    kv_gathered = a.allocate<float>(2 * Mk * s_.Sp, Category::kv);
    k_all = a.allocate<float>(full_kv, Category::kv);
    v_all = a.allocate<float>(full_kv, Category::kv);
    gather_kv(kv_local.data(), kv_gathered.data(), k_all.data(), v_all.data());
    k = k_all.data();
    v = v_all.data();
  }
  const ref::AttentionDims ad{s_.B, s_.Tl(), s_.S, s_.NHl(), s_.NKVl(), s_.hs()};
  {
    // QK^T and PV over the causal half of the keys: 2 x 2 x B x NHl x Tl x S x hs / 2 FLOPs.
    TraceSpan span(rank_.comm(), "attention", 2.0 * s_.B * s_.NHl() * s_.Tl() * s_.S * s_.hs());
    ref::causal_attention_forward(att_.data(), lse_.data(), q.data(), k, v, positions_.data(),
                                  k_positions_.data(), ad);
  }
  const float* wo = attention_view(w_.data(), shard_).wo;
  region_->exit(x, y, [&](float* out, bool accumulate) {
    // torch: out (+)= att @ wo.T        (partial o_proj over this shard's heads)
    TraceSpan span(rank_.comm(), "o projection", 2.0 * M * C * qc);
    ref::matmul_nt(out, att_.data(), wo, M, C, qc, accumulate);
  });
}

void BaselineAttention::backward(const float* x, const float* dy, float* dx) {
  Arena& a = rank_.arena();
  auto phase = a.phase("attention.backward");
  const int M = s_.B * s_.Tl(), C = s_.model.hidden;
  const int qc = s_.NHl() * s_.hs(), kc = s_.NKVl() * s_.hs();
  const std::size_t Mk = static_cast<std::size_t>(M) * kc;
  const std::size_t full_kv = static_cast<std::size_t>(s_.B) * s_.S * kc;
  if (grad_.empty()) {
    grad_ = a.allocate<float>(w_.size(), Category::gradients);
    grad_norm_ = a.allocate<float>(static_cast<std::size_t>(C), Category::gradients);
  }
  const auto view = attention_view(static_cast<const float*>(w_.data()), shard_);
  const auto g = attention_view(grad_.data(), shard_);
  Buffer<float> dy_storage;
  const float* dyf = region_->enter_backward(dy, dy_storage);
  auto da = a.allocate<float>(static_cast<std::size_t>(M) * qc, Category::workspace);
  {
    // torch: da = dy @ wo ;  dwo = dy.T @ att
    TraceSpan span(rank_.comm(), "o projection backward", 2.0 * 2 * M * qc * C);
    ref::matmul_nn(da.data(), dyf, view.wo, M, qc, C);
    ref::matmul_tn(g.wo, dyf, att_.data(), C, qc, M);
  }
  dy_storage.reset();

  auto q = a.allocate<float>(static_cast<std::size_t>(M) * qc, Category::workspace);
  auto dq = a.allocate<float>(static_cast<std::size_t>(M) * qc, Category::workspace);
  auto kv_local = a.allocate<float>(2 * Mk, Category::workspace);
  project_q(q.data());
  project_kv(kv_local.data(), kv_local.data() + Mk);
  const float* k = kv_local.data();
  const float* v = kv_local.data() + Mk;
  Buffer<float> kv_gathered, k_all, v_all;
  if (s_.Sp > 1) {
    kv_gathered = a.allocate<float>(2 * Mk * s_.Sp, Category::kv);
    k_all = a.allocate<float>(full_kv, Category::kv);
    v_all = a.allocate<float>(full_kv, Category::kv);
    gather_kv(kv_local.data(), kv_gathered.data(), k_all.data(), v_all.data());
    k = k_all.data();
    v = v_all.data();
  }
  auto dk_all = a.allocate<float>(full_kv, Category::kv);
  auto dv_all = a.allocate<float>(full_kv, Category::kv);
  const ref::AttentionDims ad{s_.B, s_.Tl(), s_.S, s_.NHl(), s_.NKVl(), s_.hs()};
  {
    // Twice the forward's FLOPs (dQ, dK from dS; dV, dP from dO).
    TraceSpan span(rank_.comm(), "attention backward",
                   2 * 2.0 * s_.B * s_.NHl() * s_.Tl() * s_.S * s_.hs());
    ref::causal_attention_backward(dq.data(), dk_all.data(), dv_all.data(), da.data(), q.data(), k,
                                   v, lse_.data(), positions_.data(), k_positions_.data(), ad);
  }
  float* dk = dk_all.data();
  float* dv = dv_all.data();
  Buffer<float> dkv_local;
  if (s_.Sp > 1) {
    // dK, dV of every token go back to the row that owns it, summed over every row's queries
    // (reduce_scatter over the column, rank order).
    dkv_local = a.allocate<float>(2 * Mk, Category::workspace);
    detail::kv_order_by_rank(s_.row_layout(), s_.B, kc, dk_all.data(), dv_all.data(),
                             kv_gathered.data());
    reduce_scatter<float>(region_->sp(),
                          std::span<const float>(kv_gathered.data(), kv_gathered.size()),
                          dkv_local.span());
    dk = dkv_local.data();
    dv = dkv_local.data() + Mk;
  }
  ref::rope_backward(dq.data(), positions_.data(), s_.B, s_.Tl(), s_.NHl(), s_.hs(),
                     s_.model.rope_base);
  ref::rope_backward(dk, positions_.data(), s_.B, s_.Tl(), s_.NKVl(), s_.hs(), s_.model.rope_base);
  // torch: dwq = dq.T @ n ; dn = dq @ wq + dk @ wk + dv @ wv   (likewise dwk, dwv)
  auto dxn = a.allocate<float>(static_cast<std::size_t>(M) * C, Category::workspace);
  TraceSpan span(rank_.comm(), "q/k/v projection backward", 2.0 * 2 * M * C * (qc + 2 * kc));
  ref::matmul_tn(g.wq, dq.data(), xn_.data(), qc, C, M);
  ref::matmul_tn(g.wk, dk, xn_.data(), kc, C, M);
  ref::matmul_tn(g.wv, dv, xn_.data(), kc, C, M);
  ref::matmul_nn(dxn.data(), dq.data(), view.wq, M, C, qc);
  ref::matmul_nn(dxn.data(), dk, view.wk, M, C, kc, true);
  ref::matmul_nn(dxn.data(), dv, view.wv, M, C, kc, true);
  region_->exit_backward(dxn.data(), x, dy, norm_w_.data(), rstd_.data(), dx, grad_norm_);
  region_->reduce_weight_grads(grad_);
}

}  // namespace tspemu::tsp
