#include "tspemu/tsp/baseline_mlp.hpp"

#include <cstring>

#include "baseline_region.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/trace.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

BaselineMlp::BaselineMlp(Rank& rank, const BaselineShape& shape,
                         const ref::LayerWeights<float>& master)
    : rank_(rank), s_(shape), shard_(shape.shard_shape()) {
  s_.validate();
  if (rank.size() != s_.ranks())
    throw std::invalid_argument(s_.strategy() + " MLP: world has " + std::to_string(rank.size()) +
                                " ranks but T·Sp=" + std::to_string(s_.T) + "·" +
                                std::to_string(s_.Sp));
  region_ = std::make_unique<detail::MeshRegion>(rank, s_);
  Arena& a = rank.arena();
  w_ = a.allocate<float>(mlp_shard_size(shard_), Category::weights);
  norm_w_ = a.allocate<float>(static_cast<std::size_t>(s_.model.hidden), Category::weights);
  if (dry_run()) return;  // unbacked buffers; `master` may be empty (core/dry_run.hpp)
  pack_mlp_shard(master, shard_, s_.col(rank.id()), w_.data());
  std::memcpy(norm_w_.data(), master.post_norm.data(), norm_w_.size() * sizeof(float));
}

BaselineMlp::~BaselineMlp() = default;

void BaselineMlp::forward(const float* x, float* y) {
  Arena& a = rank_.arena();
  auto phase = a.phase("mlp");
  const int M = s_.B * s_.Tl(), C = s_.model.hidden, Fl = s_.Fl();
  const std::size_t MF = static_cast<std::size_t>(M) * Fl;
  xn_.reset();
  rstd_.reset();
  gate_.reset();
  up_.reset();
  xn_ = a.allocate<float>(static_cast<std::size_t>(M) * C, Category::activations);
  rstd_ = a.allocate<float>(static_cast<std::size_t>(s_.B) * s_.rows(), Category::activations);
  gate_ = a.allocate<float>(MF, Category::activations);
  up_ = a.allocate<float>(MF, Category::activations);
  region_->enter(x, norm_w_.data(), xn_.data(), rstd_.data());
  const auto v = mlp_view(static_cast<const float*>(w_.data()), shard_);
  auto h = a.allocate<float>(MF, Category::workspace);
  {
    // torch: y = x + (silu(n @ w_gate.T) * (n @ w_up.T)) @ w_down.T   (partial over this shard)
    TraceSpan span(rank_.comm(), "gate/up projection", 2 * 2.0 * M * Fl * C);
    ref::matmul_nt(gate_.data(), xn_.data(), v.gate, M, Fl, C);
    ref::matmul_nt(up_.data(), xn_.data(), v.up, M, Fl, C);
    ref::silu_mul_forward(h.data(), gate_.data(), up_.data(), MF);
  }
  region_->exit(x, y, [&](float* out, bool accumulate) {
    TraceSpan span(rank_.comm(), "down projection", 2.0 * M * C * Fl);
    ref::matmul_nt(out, h.data(), v.down, M, C, Fl, accumulate);
  });
}

void BaselineMlp::backward(const float* x, const float* dy, float* dx) {
  Arena& a = rank_.arena();
  auto phase = a.phase("mlp.backward");
  const int M = s_.B * s_.Tl(), C = s_.model.hidden, Fl = s_.Fl();
  const std::size_t MF = static_cast<std::size_t>(M) * Fl;
  if (grad_.empty()) {
    grad_ = a.allocate<float>(w_.size(), Category::gradients);
    grad_norm_ = a.allocate<float>(static_cast<std::size_t>(C), Category::gradients);
  }
  const auto v = mlp_view(static_cast<const float*>(w_.data()), shard_);
  const auto g = mlp_view(grad_.data(), shard_);
  Buffer<float> dy_storage;
  const float* dyf = region_->enter_backward(dy, dy_storage);
  auto h = a.allocate<float>(MF, Category::workspace);
  auto dh = a.allocate<float>(MF, Category::workspace);
  {
    TraceSpan span(rank_.comm(), "down projection backward", 2 * 2.0 * M * Fl * C);
    ref::silu_mul_forward(h.data(), gate_.data(), up_.data(), MF);
    // torch: dh = dy @ w_down ;  dw_down = dy.T @ h
    ref::matmul_nn(dh.data(), dyf, v.down, M, Fl, C);
    ref::matmul_tn(g.down, dyf, h.data(), C, Fl, M);
  }
  dy_storage.reset();
  auto dg = a.allocate<float>(MF, Category::workspace);
  auto du = a.allocate<float>(MF, Category::workspace);
  auto dxn = a.allocate<float>(static_cast<std::size_t>(M) * C, Category::workspace);
  {
    TraceSpan span(rank_.comm(), "gate/up projection backward", 4 * 2.0 * M * Fl * C);
    ref::silu_mul_backward(dg.data(), du.data(), dh.data(), gate_.data(), up_.data(), MF);
    // torch: dw_gate = dg.T @ n ; dw_up = du.T @ n ; dn = dg @ w_gate + du @ w_up
    ref::matmul_tn(g.gate, dg.data(), xn_.data(), Fl, C, M);
    ref::matmul_tn(g.up, du.data(), xn_.data(), Fl, C, M);
    ref::matmul_nn(dxn.data(), dg.data(), v.gate, M, C, Fl);
    ref::matmul_nn(dxn.data(), du.data(), v.up, M, C, Fl, true);
  }
  region_->exit_backward(dxn.data(), x, dy, norm_w_.data(), rstd_.data(), dx, grad_norm_);
  region_->reduce_weight_grads(grad_);
}

}  // namespace tspemu::tsp
