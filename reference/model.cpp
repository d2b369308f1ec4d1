#include "tspemu/reference/model.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/cross_entropy.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/reference/silu_mul.hpp"

namespace tspemu::ref {

namespace {

using Shape = std::vector<std::int64_t>;

template <class T>
void require_size(const std::vector<T>& v, std::size_t n, const char* what) {
  if (v.size() != n) {
    throw std::invalid_argument(std::string("reference: ") + what + " has " +
                                std::to_string(v.size()) + " elements, expected " +
                                std::to_string(n));
  }
}

// Requires the sizes of the rows of kLayerTensors that `which_rows` selects, in table order,
// naming a wrong one "<which>.<name>".
template <class T, class Rows>
void require_shapes(const ModelConfig& cfg, const LayerWeights<T>& w, const std::string& which,
                    Rows which_rows) {
  const auto named = w.named();
  for (std::size_t i = 0; i < kLayerTensors.size(); ++i)
    if (which_rows(kLayerTensors[i]))
      require_size(*named[i].second, std::size_t(layer_tensor_shape(cfg, kLayerTensors[i]).size()),
                   (which + "." + named[i].first).c_str());
}

// The tensors the attention block reads (and whose gradients it accumulates).
template <class T>
void require_attention_shapes(const ModelConfig& cfg, const LayerWeights<T>& w,
                              const std::string& which) {
  require_shapes(cfg, w, which,
                 [](const LayerTensor& t) { return t.block == LayerBlock::attention; });
}

// The tensors of the reference MLP core: the MLP block's matrices (not its norm).
template <class T>
void require_gated_mlp_shapes(const ModelConfig& cfg, const LayerWeights<T>& w,
                              const std::string& which) {
  require_shapes(cfg, w, which, [](const LayerTensor& t) {
    return t.block == LayerBlock::mlp && t.rows != LayerDim::one;
  });
}

template <class T>
void require_layer_shapes(const ModelConfig& cfg, const LayerWeights<T>& w, const char* which) {
  require_shapes(cfg, w, which, [](const LayerTensor&) { return true; });
}

template <class Fn>
void require_callable(const Fn& fn, const char* what) {
  if (!fn) throw std::invalid_argument(std::string(what) + " is empty (no function set)");
}

template <class T>
void add_into(T* dst, const T* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

template <class T>
LayerWeights<T> LayerWeights<T>::zeros(const ModelConfig& cfg) {
  LayerWeights w;
  for (std::size_t i = 0; auto& [name, v] : w.named())
    v->assign(std::size_t(layer_tensor_shape(cfg, kLayerTensors[i++]).size()), T(0));
  return w;
}

template <class T>
ModelWeights<T> ModelWeights<T>::zeros(const ModelConfig& cfg) {
  cfg.validate();
  ModelWeights w;
  w.config = cfg;
  const std::size_t V = cfg.vocab, C = cfg.hidden;
  w.embed.assign(V * C, T(0));
  w.layers.assign(cfg.n_layers, LayerWeights<T>::zeros(cfg));
  w.final_norm.assign(C, T(0));
  if (!cfg.tie_embeddings) w.lm_head.assign(V * C, T(0));
  return w;
}

namespace {

template <class Vec, class W>
std::vector<ParamRef<Vec>> parameters_impl(W& w) {
  const ModelConfig& cfg = w.config;
  const std::int64_t V = cfg.vocab, C = cfg.hidden;
  std::vector<ParamRef<Vec>> out;
  out.push_back({"model.embed_tokens.weight", {V, C}, &w.embed});
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (std::size_t i = 0; const auto& [name, v] : w.layers[l].named()) {
      const LayerTensor& t = kLayerTensors[i++];
      const LayerTensorShape s = layer_tensor_shape(cfg, t);
      out.push_back({p + t.hf_name,
                     t.rows == LayerDim::one ? std::vector<std::int64_t>{s.cols}
                                             : std::vector<std::int64_t>{s.rows, s.cols},
                     v});
    }
  }
  out.push_back({"model.norm.weight", {C}, &w.final_norm});
  if (!cfg.tie_embeddings) out.push_back({"lm_head.weight", {V, C}, &w.lm_head});
  return out;
}

}  // namespace

template <class T>
std::vector<ParamRef<std::vector<T>>> parameters(ModelWeights<T>& w) {
  return parameters_impl<std::vector<T>>(w);
}
template <class T>
std::vector<ParamRef<const std::vector<T>>> parameters(const ModelWeights<T>& w) {
  return parameters_impl<const std::vector<T>>(w);
}

// ---------------------------------------------------------------- cores

template <class T>
AttentionCore<T> AttentionCore<T>::local_causal() {
  AttentionCore core;
  core.forward = [](T* att, T* lse, const T* q, const T* k, const T* v,
                    const std::int64_t* positions, const AttentionDims& d) {
    causal_attention_forward(att, lse, q, k, v, positions, positions, d);
  };
  core.backward = [](T* dq, T* dk, T* dv, const T* datt, const T* q, const T* k, const T* v,
                     const T* /*att*/, const T* lse, const std::int64_t* positions,
                     const AttentionDims& d) {
    causal_attention_backward(dq, dk, dv, datt, q, k, v, lse, positions, positions, d);
  };
  return core;
}

namespace {

// The reference MLP core's two halves over caller-owned activations gate, up, h ([N, F] each),
// shared by MlpCore::gated (activations in the core) and the entry points without a core
// (activations in MlpCache).
template <class T>
void gated_mlp_forward(const ModelConfig& cfg, const LayerWeights<T>& w, T* y, const T* xn, int N,
                       std::vector<T>& gate, std::vector<T>& up, std::vector<T>& h,
                       StorageRounding storage) {
  const int C = cfg.hidden, F = cfg.ffn;
  gate.resize(std::size_t(N) * F);
  up.resize(std::size_t(N) * F);
  h.resize(std::size_t(N) * F);
  // gate = xn @ Wgate.T; up = xn @ Wup.T                        [N, F]
  matmul_nt(gate.data(), xn, w.w_gate.data(), N, F, C);
  matmul_nt(up.data(), xn, w.w_up.data(), N, F, C);
  storage.store(gate);
  storage.store(up);
  // h = F.silu(gate) * up                                       [N, F]
  silu_mul_forward(h.data(), gate.data(), up.data(), std::size_t(N) * F);
  storage.store(h);
  // y += h @ Wdown.T                                            [N, C]
  matmul_nt(y, h.data(), w.w_down.data(), N, C, F, /*accumulate=*/true);
}

template <class T>
void gated_mlp_backward(const ModelConfig& cfg, const LayerWeights<T>& w, T* dxn, const T* dout,
                        const T* xn, int N, const std::vector<T>& gate, const std::vector<T>& up,
                        const std::vector<T>& h, LayerWeights<T>& grads, StorageRounding storage) {
  const int C = cfg.hidden, F = cfg.ffn;
  if (h.size() != std::size_t(N) * F) {
    throw std::invalid_argument("gated MLP backward: N=" + std::to_string(N) + " needs " +
                                std::to_string(std::size_t(N) * F) + " saved activations, have " +
                                std::to_string(h.size()) + " (forward not run on these tokens?)");
  }
  std::vector<T> dh(std::size_t(N) * F), dgate(std::size_t(N) * F), dup(std::size_t(N) * F);
  // dh = dout @ Wdown;  dWdown += dout.T @ h
  matmul_nn(dh.data(), dout, w.w_down.data(), N, F, C);
  matmul_tn(grads.w_down.data(), dout, h.data(), C, F, N, true);
  storage.store(dh);
  silu_mul_backward(dgate.data(), dup.data(), dh.data(), gate.data(), up.data(),
                    std::size_t(N) * F);
  storage.store(dgate);
  storage.store(dup);
  // dxn = dgate @ Wgate + dup @ Wup;  dWgate += dgate.T @ xn;  dWup += dup.T @ xn
  matmul_nn(dxn, dgate.data(), w.w_gate.data(), N, C, F);
  matmul_nn(dxn, dup.data(), w.w_up.data(), N, C, F, true);
  matmul_tn(grads.w_gate.data(), dgate.data(), xn, F, C, N, true);
  matmul_tn(grads.w_up.data(), dup.data(), xn, F, C, N, true);
}

template <class T>
struct GatedMlpActivations {
  std::vector<T> gate, up, h;  // [N, F] each
};

}  // namespace

template <class T>
MlpCore<T> MlpCore<T>::gated(const ModelConfig& cfg, const LayerWeights<T>& w,
                             LayerWeights<T>& grads, StorageRounding storage) {
  require_gated_mlp_shapes(cfg, w, "MlpCore::gated weights");
  require_gated_mlp_shapes(cfg, grads, "MlpCore::gated grads");
  auto act = std::make_shared<GatedMlpActivations<T>>();
  MlpCore core;
  core.forward = [cfg, &w, act, storage](T* y, const T* xn, int N) {
    gated_mlp_forward(cfg, w, y, xn, N, act->gate, act->up, act->h, storage);
  };
  core.backward = [cfg, &w, &grads, act, storage](T* dxn, const T* dout, const T* xn, int N) {
    gated_mlp_backward(cfg, w, dxn, dout, xn, N, act->gate, act->up, act->h, grads, storage);
  };
  return core;
}

// ---------------------------------------------------------------- attention block

template <class T>
void attention_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y,
                             const std::int64_t* positions, int B, int T_, AttentionCache<T>& cache,
                             const AttentionCore<T>& core, StorageRounding storage) {
  require_attention_shapes(cfg, w, "attention_block_forward weights");
  require_callable(core.forward, "attention_block_forward: core.forward");
  const int N = B * T_, C = cfg.hidden, NH = cfg.n_heads, NKV = cfg.n_kv_heads;
  const int hs = cfg.head_size(), qd = cfg.q_dim(), kvd = cfg.kv_dim();
  cache.xn.resize(std::size_t(N) * C);
  cache.rstd.resize(N);
  cache.q.resize(std::size_t(N) * qd);
  cache.k.resize(std::size_t(N) * kvd);
  cache.v.resize(std::size_t(N) * kvd);
  cache.att.resize(std::size_t(N) * qd);
  cache.lse.resize(std::size_t(B) * NH * T_);

  // xn = input_layernorm(x)                                     [B, T, C]
  rmsnorm_forward(cache.xn.data(), cache.rstd.data(), x, w.input_norm.data(), N, C, cfg.norm_eps);
  storage.store(cache.xn);
  // q = xn @ Wq.T; k = xn @ Wk.T; v = xn @ Wv.T                 [B, T, NH|NKV, hs]
  matmul_nt(cache.q.data(), cache.xn.data(), w.wq.data(), N, qd, C);
  matmul_nt(cache.k.data(), cache.xn.data(), w.wk.data(), N, kvd, C);
  matmul_nt(cache.v.data(), cache.xn.data(), w.wv.data(), N, kvd, C);
  for (auto* t : {&cache.q, &cache.k, &cache.v}) storage.store(*t);
  // q, k = apply_rotary_pos_emb(q, k, cos, sin)
  rope_forward(cache.q.data(), positions, B, T_, NH, hs, cfg.rope_base);
  rope_forward(cache.k.data(), positions, B, T_, NKV, hs, cfg.rope_base);
  storage.store(cache.q);
  storage.store(cache.k);
  // att = softmax(q k.T / sqrt(hs) + causal mask) v             [B, T, NH, hs]
  const AttentionDims dims{B, T_, T_, NH, NKV, hs};
  core.forward(cache.att.data(), cache.lse.data(), cache.q.data(), cache.k.data(), cache.v.data(),
               positions, dims);
  storage.store(cache.att);
  // y = x + att @ Wo.T                                          [B, T, C]
  std::copy_n(x, std::size_t(N) * C, y);
  matmul_nt(y, cache.att.data(), w.wo.data(), N, C, qd, /*accumulate=*/true);
  storage.store(y, std::size_t(N) * C);
}

template <class T>
void attention_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y,
                             const std::int64_t* positions, int B, int T_, AttentionCache<T>& cache,
                             StorageRounding storage) {
  require_layer_shapes(cfg, w, "attention_block_forward weights");
  attention_block_forward(cfg, w, x, y, positions, B, T_, cache, AttentionCore<T>::local_causal(),
                          storage);
}

template <class T>
void attention_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x,
                              const T* dy, T* dx, const std::int64_t* positions, int B, int T_,
                              const AttentionCache<T>& cache, LayerWeights<T>& grads,
                              const AttentionCore<T>& core, StorageRounding storage) {
  require_attention_shapes(cfg, w, "attention_block_backward weights");
  require_attention_shapes(cfg, grads, "attention_block_backward grads");
  require_callable(core.backward, "attention_block_backward: core.backward");
  const int N = B * T_, C = cfg.hidden, NH = cfg.n_heads, NKV = cfg.n_kv_heads;
  const int hs = cfg.head_size(), qd = cfg.q_dim(), kvd = cfg.kv_dim();
  std::vector<T> datt(std::size_t(N) * qd);  // [B, T, NH, hs]
  std::vector<T> dq(std::size_t(N) * qd);    // [B, T, NH, hs]
  std::vector<T> dk(std::size_t(N) * kvd);   // [B, T, NKV, hs]
  std::vector<T> dv(std::size_t(N) * kvd);   // [B, T, NKV, hs]
  std::vector<T> dxn(std::size_t(N) * C);    // [B, T, C]

  // y = x + att @ Wo.T:  datt = dy @ Wo;  dWo += dy.T @ att
  matmul_nn(datt.data(), dy, w.wo.data(), N, qd, C);
  matmul_tn(grads.wo.data(), dy, cache.att.data(), C, qd, N, true);
  storage.store(datt);
  const AttentionDims dims{B, T_, T_, NH, NKV, hs};
  core.backward(dq.data(), dk.data(), dv.data(), datt.data(), cache.q.data(), cache.k.data(),
                cache.v.data(), cache.att.data(), cache.lse.data(), positions, dims);
  for (auto* t : {&dq, &dk, &dv}) storage.store(*t);
  rope_backward(dq.data(), positions, B, T_, NH, hs, cfg.rope_base);
  rope_backward(dk.data(), positions, B, T_, NKV, hs, cfg.rope_base);
  storage.store(dq);
  storage.store(dk);
  // dxn = dq @ Wq + dk @ Wk + dv @ Wv;  dW* += d*.T @ xn
  matmul_nn(dxn.data(), dq.data(), w.wq.data(), N, C, qd);
  matmul_nn(dxn.data(), dk.data(), w.wk.data(), N, C, kvd, true);
  matmul_nn(dxn.data(), dv.data(), w.wv.data(), N, C, kvd, true);
  matmul_tn(grads.wq.data(), dq.data(), cache.xn.data(), qd, C, N, true);
  matmul_tn(grads.wk.data(), dk.data(), cache.xn.data(), kvd, C, N, true);
  matmul_tn(grads.wv.data(), dv.data(), cache.xn.data(), kvd, C, N, true);
  storage.store(dxn);
  rmsnorm_backward(dx, grads.input_norm.data(), dxn.data(), x, w.input_norm.data(),
                   cache.rstd.data(), N, C);
  add_into(dx, dy, std::size_t(N) * C);  // the residual path
  storage.store(dx, std::size_t(N) * C);
}

template <class T>
void attention_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x,
                              const T* dy, T* dx, const std::int64_t* positions, int B, int T_,
                              const AttentionCache<T>& cache, LayerWeights<T>& grads,
                              StorageRounding storage) {
  require_layer_shapes(cfg, w, "attention_block_backward weights");
  require_layer_shapes(cfg, grads, "attention_block_backward grads");
  attention_block_backward(cfg, w, x, dy, dx, positions, B, T_, cache, grads,
                           AttentionCore<T>::local_causal(), storage);
}

// ---------------------------------------------------------------- MLP block

template <class T>
void mlp_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y, int B,
                       int T_, MlpCache<T>& cache, const MlpCore<T>& core,
                       StorageRounding storage) {
  require_size(w.post_norm, std::size_t(cfg.hidden), "mlp_block_forward weights.post_norm");
  require_callable(core.forward, "mlp_block_forward: core.forward");
  const int N = B * T_, C = cfg.hidden;
  cache.xn.resize(std::size_t(N) * C);
  cache.rstd.resize(N);
  // xn = post_attention_layernorm(x)                            [B, T, C]
  rmsnorm_forward(cache.xn.data(), cache.rstd.data(), x, w.post_norm.data(), N, C, cfg.norm_eps);
  storage.store(cache.xn);
  // y = x + mlp(xn)                                             [B, T, C]
  std::copy_n(x, std::size_t(N) * C, y);
  core.forward(y, cache.xn.data(), N);
  storage.store(y, std::size_t(N) * C);
}

template <class T>
void mlp_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y, int B,
                       int T_, MlpCache<T>& cache, StorageRounding storage) {
  require_layer_shapes(cfg, w, "mlp_block_forward weights");
  MlpCore<T> core;  // the reference core, its activations in the cache
  core.forward = [&](T* out, const T* xn, int N) {
    gated_mlp_forward(cfg, w, out, xn, N, cache.gate, cache.up, cache.h, storage);
  };
  mlp_block_forward(cfg, w, x, y, B, T_, cache, core, storage);
}

template <class T>
void mlp_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, const T* dy,
                        T* dx, int B, int T_, const MlpCache<T>& cache, LayerWeights<T>& grads,
                        const MlpCore<T>& core, StorageRounding storage) {
  require_size(w.post_norm, std::size_t(cfg.hidden), "mlp_block_backward weights.post_norm");
  require_size(grads.post_norm, std::size_t(cfg.hidden), "mlp_block_backward grads.post_norm");
  require_callable(core.backward, "mlp_block_backward: core.backward");
  const int N = B * T_, C = cfg.hidden;
  std::vector<T> dxn(std::size_t(N) * C);  // [B, T, C]
  core.backward(dxn.data(), dy, cache.xn.data(), N);
  storage.store(dxn);
  rmsnorm_backward(dx, grads.post_norm.data(), dxn.data(), x, w.post_norm.data(), cache.rstd.data(),
                   N, C);
  add_into(dx, dy, std::size_t(N) * C);  // the residual path
  storage.store(dx, std::size_t(N) * C);
}

template <class T>
void mlp_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, const T* dy,
                        T* dx, int B, int T_, const MlpCache<T>& cache, LayerWeights<T>& grads,
                        StorageRounding storage) {
  require_layer_shapes(cfg, w, "mlp_block_backward weights");
  require_layer_shapes(cfg, grads, "mlp_block_backward grads");
  MlpCore<T> core;  // the reference core, its activations from the cache
  core.backward = [&](T* dxn, const T* dout, const T* xn, int N) {
    gated_mlp_backward(cfg, w, dxn, dout, xn, N, cache.gate, cache.up, cache.h, grads, storage);
  };
  mlp_block_backward(cfg, w, x, dy, dx, B, T_, cache, grads, core, storage);
}

// ---------------------------------------------------------------- layer

template <class T>
void layer_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y,
                   const std::int64_t* positions, int B, int T_, LayerCache<T>& cache,
                   StorageRounding storage) {
  cache.mid.resize(std::size_t(B) * T_ * cfg.hidden);
  attention_block_forward(cfg, w, x, cache.mid.data(), positions, B, T_, cache.attn, storage);
  mlp_block_forward(cfg, w, cache.mid.data(), y, B, T_, cache.mlp, storage);
}

template <class T>
void layer_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, const T* dy,
                    T* dx, const std::int64_t* positions, int B, int T_, const LayerCache<T>& cache,
                    LayerWeights<T>& grads, StorageRounding storage) {
  std::vector<T> dmid(std::size_t(B) * T_ * cfg.hidden);
  mlp_block_backward(cfg, w, cache.mid.data(), dy, dmid.data(), B, T_, cache.mlp, grads, storage);
  attention_block_backward(cfg, w, x, dmid.data(), dx, positions, B, T_, cache.attn, grads,
                           storage);
}

// ---------------------------------------------------------------- layer stack

template <class T>
const std::vector<T>& layer_stack_forward(const ModelConfig& cfg,
                                          const std::vector<LayerWeights<T>>& w,
                                          const std::vector<T>& x, int B, int T_,
                                          StackCache<T>& cache) {
  const std::size_t L = w.size();
  cache.positions.resize(std::size_t(T_));
  for (int t = 0; t < T_; ++t) cache.positions[std::size_t(t)] = t;
  cache.x.assign(L + 1, x);
  cache.layers.resize(L);
  for (std::size_t l = 0; l < L; ++l)
    layer_forward(cfg, w[l], cache.x[l].data(), cache.x[l + 1].data(), cache.positions.data(), B,
                  T_, cache.layers[l]);
  return cache.x.back();
}

template <class T>
void layer_stack_backward(const ModelConfig& cfg, const std::vector<LayerWeights<T>>& w,
                          const std::vector<T>& dy, int B, int T_, const StackCache<T>& cache,
                          std::vector<T>& dx, std::vector<LayerWeights<T>>& grads) {
  dx = dy;
  std::vector<T> dx_prev(dy.size());
  grads.assign(w.size(), LayerWeights<T>::zeros(cfg));
  for (std::size_t l = w.size(); l-- > 0;) {
    layer_backward(cfg, w[l], cache.x[l].data(), dx.data(), dx_prev.data(), cache.positions.data(),
                   B, T_, cache.layers[l], grads[l]);
    std::swap(dx, dx_prev);
  }
}

// ---------------------------------------------------------------- whole model

namespace {

void check_batch(const ModelConfig& cfg, const Batch& batch) {
  const std::size_t n = std::size_t(std::max(batch.B, 0)) * std::max(batch.T, 0);
  if (batch.B <= 0 || batch.T <= 0 || batch.tokens.size() != n || batch.targets.size() != n ||
      (!batch.positions.empty() && batch.positions.size() != std::size_t(batch.T))) {
    throw std::invalid_argument(
        "model: batch B=" + std::to_string(batch.B) + " T=" + std::to_string(batch.T) +
        " with tokens=" + std::to_string(batch.tokens.size()) +
        " targets=" + std::to_string(batch.targets.size()) +
        " positions=" + std::to_string(batch.positions.size()) + " elements");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= cfg.vocab) {
      throw std::invalid_argument("model: tokens[" + std::to_string(i) +
                                  "]=" + std::to_string(batch.tokens[i]) + " outside [0, " +
                                  std::to_string(cfg.vocab) + ")");
    }
  }
}

}  // namespace

template <class T>
double model_forward(const ModelWeights<T>& w, const Batch& batch, ModelCache<T>& cache) {
  const ModelConfig& cfg = w.config;
  check_batch(cfg, batch);
  const int B = batch.B, T_ = batch.T, N = B * T_, C = cfg.hidden, V = cfg.vocab;
  require_size(w.embed, std::size_t(V) * C, "embed");
  require_size(w.head(), std::size_t(V) * C, "lm_head");
  if (batch.positions.empty()) {
    cache.positions.resize(T_);
    for (int t = 0; t < T_; ++t) cache.positions[t] = t;
  } else {
    cache.positions.assign(batch.positions.begin(), batch.positions.end());
  }
  const std::int64_t* pos = cache.positions.data();

  cache.x.assign(cfg.n_layers + 1, std::vector<T>(std::size_t(N) * C));
  cache.layers.resize(cfg.n_layers);
  // x = embed_tokens(tokens)                                    [B, T, C]
  for (int n = 0; n < N; ++n) {
    std::copy_n(w.embed.data() + std::size_t(batch.tokens[n]) * C, C,
                cache.x[0].data() + std::size_t(n) * C);
  }
  for (int l = 0; l < cfg.n_layers; ++l) {
    layer_forward(cfg, w.layers[l], cache.x[l].data(), cache.x[l + 1].data(), pos, B, T_,
                  cache.layers[l]);
  }
  // logits = norm(x) @ lm_head.T                                [B, T, V]
  cache.xn_final.resize(std::size_t(N) * C);
  cache.rstd_final.resize(N);
  cache.logits.resize(std::size_t(N) * V);
  rmsnorm_forward(cache.xn_final.data(), cache.rstd_final.data(), cache.x[cfg.n_layers].data(),
                  w.final_norm.data(), N, C, cfg.norm_eps);
  matmul_nt(cache.logits.data(), cache.xn_final.data(), w.head().data(), N, V, C);
  cache.loss = cross_entropy_forward(cache.logits.data(), batch.targets.data(), N, V);
  return cache.loss;
}

template <class T>
void model_backward(const ModelWeights<T>& w, const Batch& batch, const ModelCache<T>& cache,
                    ModelWeights<T>& grads, std::vector<T>* d_embedded) {
  const ModelConfig& cfg = w.config;
  check_batch(cfg, batch);
  const int B = batch.B, T_ = batch.T, N = B * T_, C = cfg.hidden, V = cfg.vocab;
  grads = ModelWeights<T>::zeros(cfg);
  std::vector<T>& dhead = cfg.tie_embeddings ? grads.embed : grads.lm_head;

  std::vector<T> dlogits(std::size_t(N) * V);  // [B, T, V]
  cross_entropy_backward(dlogits.data(), cache.logits.data(), batch.targets.data(), N, V);
  // logits = xn @ head.T:  dhead += dlogits.T @ xn;  dxn = dlogits @ head
  matmul_tn(dhead.data(), dlogits.data(), cache.xn_final.data(), V, C, N, true);
  std::vector<T> dxn(std::size_t(N) * C), dx(std::size_t(N) * C), dx_prev(std::size_t(N) * C);
  matmul_nn(dxn.data(), dlogits.data(), w.head().data(), N, C, V);
  rmsnorm_backward(dx.data(), grads.final_norm.data(), dxn.data(), cache.x[cfg.n_layers].data(),
                   w.final_norm.data(), cache.rstd_final.data(), N, C);
  for (int l = cfg.n_layers - 1; l >= 0; --l) {
    layer_backward(cfg, w.layers[l], cache.x[l].data(), dx.data(), dx_prev.data(),
                   cache.positions.data(), B, T_, cache.layers[l], grads.layers[l]);
    std::swap(dx, dx_prev);
  }
  // x = embed[tokens]: scatter-add rows (a token repeated in the batch accumulates)
  for (int n = 0; n < N; ++n) {
    add_into(grads.embed.data() + std::size_t(batch.tokens[n]) * C, dx.data() + std::size_t(n) * C,
             C);
  }
  if (d_embedded) *d_embedded = std::move(dx);
}

#define TSPEMU_INSTANTIATE(T)                                                                     \
  template struct LayerWeights<T>;                                                                \
  template struct ModelWeights<T>;                                                                \
  template std::vector<ParamRef<std::vector<T>>> parameters<T>(ModelWeights<T>&);                 \
  template std::vector<ParamRef<const std::vector<T>>> parameters<T>(const ModelWeights<T>&);     \
  template struct AttentionCore<T>;                                                               \
  template struct MlpCore<T>;                                                                     \
  template void attention_block_forward<T>(const ModelConfig&, const LayerWeights<T>&, const T*,  \
                                           T*, const std::int64_t*, int, int, AttentionCache<T>&, \
                                           const AttentionCore<T>&, StorageRounding);             \
  template void attention_block_backward<T>(const ModelConfig&, const LayerWeights<T>&, const T*, \
                                            const T*, T*, const std::int64_t*, int, int,          \
                                            const AttentionCache<T>&, LayerWeights<T>&,           \
                                            const AttentionCore<T>&, StorageRounding);            \
  template void mlp_block_forward<T>(const ModelConfig&, const LayerWeights<T>&, const T*, T*,    \
                                     int, int, MlpCache<T>&, const MlpCore<T>&, StorageRounding); \
  template void mlp_block_backward<T>(const ModelConfig&, const LayerWeights<T>&, const T*,       \
                                      const T*, T*, int, int, const MlpCache<T>&,                 \
                                      LayerWeights<T>&, const MlpCore<T>&, StorageRounding);      \
  template void attention_block_forward<T>(const ModelConfig&, const LayerWeights<T>&, const T*,  \
                                           T*, const std::int64_t*, int, int, AttentionCache<T>&, \
                                           StorageRounding);                                      \
  template void attention_block_backward<T>(                                                      \
      const ModelConfig&, const LayerWeights<T>&, const T*, const T*, T*, const std::int64_t*,    \
      int, int, const AttentionCache<T>&, LayerWeights<T>&, StorageRounding);                     \
  template void mlp_block_forward<T>(const ModelConfig&, const LayerWeights<T>&, const T*, T*,    \
                                     int, int, MlpCache<T>&, StorageRounding);                    \
  template void mlp_block_backward<T>(const ModelConfig&, const LayerWeights<T>&, const T*,       \
                                      const T*, T*, int, int, const MlpCache<T>&,                 \
                                      LayerWeights<T>&, StorageRounding);                         \
  template void layer_forward<T>(const ModelConfig&, const LayerWeights<T>&, const T*, T*,        \
                                 const std::int64_t*, int, int, LayerCache<T>&, StorageRounding); \
  template void layer_backward<T>(const ModelConfig&, const LayerWeights<T>&, const T*, const T*, \
                                  T*, const std::int64_t*, int, int, const LayerCache<T>&,        \
                                  LayerWeights<T>&, StorageRounding);                             \
  template const std::vector<T>& layer_stack_forward<T>(                                          \
      const ModelConfig&, const std::vector<LayerWeights<T>>&, const std::vector<T>&, int, int,   \
      StackCache<T>&);                                                                            \
  template void layer_stack_backward<T>(const ModelConfig&, const std::vector<LayerWeights<T>>&,  \
                                        const std::vector<T>&, int, int, const StackCache<T>&,    \
                                        std::vector<T>&, std::vector<LayerWeights<T>>&);          \
  template double model_forward<T>(const ModelWeights<T>&, const Batch&, ModelCache<T>&);         \
  template void model_backward<T>(const ModelWeights<T>&, const Batch&, const ModelCache<T>&,     \
                                  ModelWeights<T>&, std::vector<T>*);
TSPEMU_INSTANTIATE(float)
TSPEMU_INSTANTIATE(double)
#undef TSPEMU_INSTANTIATE

}  // namespace tspemu::ref
