#include "tspemu/tsp/tsp_mlp.hpp"

#include <cstring>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/trace.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

namespace {

// h[i] = silu(gate) * up of row i of gu ([M, 2·Fl], gate | up per row), h [M, Fl].
template <class T>
void silu_mul_rows(T* h, const T* gu, int M, int Fl) {
  const auto F = static_cast<std::size_t>(Fl);
  for (std::size_t i = 0; i < static_cast<std::size_t>(M); ++i)
    ref::silu_mul_forward(h + i * F, gu + 2 * i * F, gu + 2 * i * F + F, F);
}

// Row i of dgu ([M, 2·Fl]) = d gate | d up of row i of gu, from dh [M, Fl].
template <class T>
void silu_mul_backward_rows(T* dgu, const T* dh, const T* gu, int M, int Fl) {
  const auto F = static_cast<std::size_t>(Fl);
  for (std::size_t i = 0; i < static_cast<std::size_t>(M); ++i)
    ref::silu_mul_backward(dgu + 2 * i * F, dgu + 2 * i * F + F, dh + i * F, gu + 2 * i * F,
                           gu + 2 * i * F + F, F);
}

}  // namespace

template <class T>
BasicTspMlp<T>::BasicTspMlp(Rank& rank, const TspShape& shape, const ref::LayerWeights<T>& master)
    : BasicTspMlp(rank, rank.comm(), shape, master) {}

template <class T>
BasicTspMlp<T>::BasicTspMlp(Rank& rank, Comm& comm, const TspShape& shape,
                            const ref::LayerWeights<T>& master)
    : rank_(rank), comm_(comm), s_(shape) {
  s_.validate();
  if (comm.size() != s_.D)
    throw std::invalid_argument("TspMlp: group " + comm.name() + " has " +
                                std::to_string(comm.size()) +
                                " ranks but D=" + std::to_string(s_.D));
  Arena& a = rank.arena();
  w_ = a.allocate<T>(mlp_shard_size(s_), Category::weights);
  norm_w_ = a.allocate<T>(static_cast<std::size_t>(s_.model.hidden), Category::weights);
  if (dry_run()) return;  // unbacked buffers; `master` may be empty (core/dry_run.hpp)
  pack_mlp_shard(master, s_, comm.rank(), w_.data());
  std::memcpy(norm_w_.data(), master.post_norm.data(), norm_w_.size() * sizeof(T));
}

template <class T>
void BasicTspMlp<T>::store(T* p, std::size_t n) const {
  if (!dry_run()) storage_.store(p, n);
}

template <class T>
void BasicTspMlp<T>::forward(const T* x, T* y) {
  Arena& a = rank_.arena();
  auto phase = a.phase("mlp");
  const int D = s_.D, p = comm_.rank(), M = s_.B * s_.Tl(), C = s_.model.hidden, Fl = s_.Fl();
  const std::size_t MC = static_cast<std::size_t>(M) * C, MF = static_cast<std::size_t>(M) * Fl;
  const std::size_t shard = w_.size();
  xn_.reset();
  rstd_.reset();
  gate_up_.reset();
  xn_ = a.allocate<T>(MC, Category::activations);
  rstd_ = a.allocate<T>(static_cast<std::size_t>(M), Category::activations);
  gate_up_ = a.allocate<T>(2 * MF * D, Category::activations);
  auto h = a.allocate<T>(MF, Category::workspace);
  // Two ring buffers: the one being received into is never the one being sent (that send has
  // completed a step earlier), and the rank's own shard is never overwritten.
  Buffer<T> ring[2];
  if (D > 1) ring[0] = a.allocate<T>(shard, Category::comm);
  if (D > 2) ring[1] = a.allocate<T>(shard, Category::comm);

  ref::rmsnorm_forward(xn_.data(), rstd_.data(), x, norm_w_.data(), M, C, s_.model.norm_eps);
  store(xn_.data(), MC);
  if (!dry_run()) std::memcpy(y, x, MC * sizeof(T));
  const T* cur = w_.data();
  for (int k = 0; k < D; ++k) {
    SendHandle sent;
    RecvHandle received;
    T* next = ring[k % 2].data();
    if (k < D - 1) {
      sent = isend<T>(comm_, std::span<const T>(cur, shard), (p + 1) % D);
      received = irecv<T>(comm_, std::span<T>(next, shard), (p + D - 1) % D);
    }
    const int o = (p - k + D) % D;
    const auto v = mlp_view(cur, s_);
    T* gu = gate_up_.data() + 2 * MF * o;  // [M, 2·Fl]: row i = gate (Fl) | up (Fl)
    {
      // torch: y += (silu(n @ w_gate[o].T) * (n @ w_up[o].T)) @ w_down[:, o].T
      TraceSpan span(comm_, "mlp", 3 * 2.0 * M * Fl * C);
      // gate and up as two GEMMs of N = Fl, as the reference makes them, not one of N = 2·Fl:
      // an sgemm kernel may sum an element in an order that depends on N (OpenBLAS's Zen kernel
      // does), and D = 1 must stay bitwise equal to the reference (tests/tsp/tsp_blocks_test.cpp).
      ref::matmul_nt(gu, xn_.data(), v.gate, M, Fl, C, false, -1, -1, 2 * Fl);
      ref::matmul_nt(gu + Fl, xn_.data(), v.up, M, Fl, C, false, -1, -1, 2 * Fl);
      store(gu, 2 * MF);
      silu_mul_rows(h.data(), gu, M, Fl);
      store(h.data(), MF);
      ref::matmul_nt(y, h.data(), v.down, M, C, Fl, true);  // fp32 accumulator over the D shards
    }
    if (k < D - 1) {
      received.wait();
      sent.wait();
      cur = next;
    }
  }
  store(y, MC);  // y = x + Σ_o partial_o, rounded once, as the reference's fused residual GEMM
}

template <class T>
void BasicTspMlp<T>::backward(const T* x, const T* dy, T* dx) {
  Arena& a = rank_.arena();
  auto phase = a.phase("mlp.backward");
  const int D = s_.D, p = comm_.rank(), M = s_.B * s_.Tl(), C = s_.model.hidden, Fl = s_.Fl();
  const std::size_t MC = static_cast<std::size_t>(M) * C, MF = static_cast<std::size_t>(M) * Fl;
  const std::size_t shard = w_.size();
  if (grad_.empty()) {
    grad_ = a.allocate<T>(shard, Category::gradients);
    grad_norm_ = a.allocate<T>(static_cast<std::size_t>(C), Category::gradients);
  }
  auto dxn = a.allocate<T>(MC, Category::workspace, /*zero=*/true);
  auto h = a.allocate<T>(MF, Category::workspace);
  auto dh = a.allocate<T>(MF, Category::workspace);
  auto dgu = a.allocate<T>(2 * MF, Category::workspace);  // [M, 2·Fl]: d gate | d up per row
  // Weight ring as in forward, plus a gradient ring one shard behind it.
  Buffer<T> wring[2], gring[2];
  if (D > 1) wring[0] = a.allocate<T>(shard, Category::comm);
  if (D > 2) wring[1] = a.allocate<T>(shard, Category::comm);
  gring[0] = a.allocate<T>(shard, Category::comm, /*zero=*/true);
  if (D > 1) gring[1] = a.allocate<T>(shard, Category::comm);

  const T* cur_w = w_.data();
  T* cur_g = gring[0].data();  // the gradient of shard p starts here, at zero
  for (int k = 0; k < D; ++k) {
    SendHandle w_sent;
    RecvHandle w_received;
    T* next_w = wring[k % 2].data();
    if (k < D - 1) {
      w_sent = isend<T>(comm_, std::span<const T>(cur_w, shard), (p + 1) % D);
      w_received = irecv<T>(comm_, std::span<T>(next_w, shard), (p + D - 1) % D);
    }
    const int o = (p - k + D) % D;
    const auto v = mlp_view(cur_w, s_);
    const auto gv = mlp_view(cur_g, s_);
    const T* gu = gate_up_.data() + 2 * MF * o;  // [M, 2·Fl]: gate | up per row
    {
      TraceSpan span(comm_, "mlp backward", 6 * 2.0 * M * Fl * C);
      silu_mul_rows(h.data(), gu, M, Fl);
      store(h.data(), MF);
      // torch: dh = dy @ w_down[:, o] ;  dw_down[:, o] += dy.T @ h
      ref::matmul_nn(dh.data(), dy, v.down, M, Fl, C);
      ref::matmul_tn(gv.down, dy, h.data(), C, Fl, M, true);
      store(dh.data(), MF);
      silu_mul_backward_rows(dgu.data(), dh.data(), gu, M, Fl);
      store(dgu.data(), 2 * MF);
      // torch: dw_gate[o] += dg.T @ n ; dw_up[o] += du.T @ n   (two GEMMs, as in forward)
      ref::matmul_tn(gv.gate, dgu.data(), xn_.data(), Fl, C, M, true, 2 * Fl);
      ref::matmul_tn(gv.up, dgu.data() + Fl, xn_.data(), Fl, C, M, true, 2 * Fl);
      // torch: dn += dg @ w_gate[o] + du @ w_up[o]   (two GEMMs: one over K = 2·Fl would sum
      // in another order than the reference)
      ref::matmul_nn(dxn.data(), dgu.data(), v.gate, M, C, Fl, true, 2 * Fl);
      ref::matmul_nn(dxn.data(), dgu.data() + Fl, v.up, M, C, Fl, true, 2 * Fl);
    }
    if (D > 1) {
      // The gradient shard moves on to the next rank, which adds its tokens' share; after D hops
      // shard o is back at its owner, complete.
      T* next_g = gring[(k + 1) % 2].data();
      SendHandle g_sent = isend<T>(comm_, std::span<const T>(cur_g, shard), (p + 1) % D);
      RecvHandle g_received = irecv<T>(comm_, std::span<T>(next_g, shard), (p + D - 1) % D);
      if (k < D - 1) {
        w_received.wait();
        w_sent.wait();
        cur_w = next_w;
      }
      g_received.wait();
      g_sent.wait();
      cur_g = next_g;
    }
  }
  if (!dry_run()) {
    std::memcpy(grad_.data(), cur_g, shard * sizeof(T));
    std::memset(grad_norm_.data(), 0, grad_norm_.size() * sizeof(T));
  }
  store(dxn.data(), MC);
  ref::rmsnorm_backward(dx, grad_norm_.data(), dxn.data(), x, norm_w_.data(), rstd_.data(), M, C);
  if (!dry_run())
    for (std::size_t i = 0; i < MC; ++i) dx[i] += dy[i];
  store(dx, MC);
  all_reduce<T>(comm_, grad_norm_.span());
}

template class BasicTspMlp<float>;
template class BasicTspMlp<double>;

}  // namespace tspemu::tsp
