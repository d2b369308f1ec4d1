// The dense reference transformer (Llama-style), forward and backward, per block and whole model.
//
// What: token embedding; L x [x += o_proj(attn(rope(q,k), v)) of input_layernorm(x);
//   x += down(silu(gate(n)) * up(n)) with n = post_attention_layernorm(x)]; final norm; LM head
//   (optionally tied to the embedding); mean cross-entropy over next-token targets.
//   It knows nothing of ranks: the parallel schedules call the kernels in rmsnorm.hpp, rope.hpp,
//   attention.hpp, silu_mul.hpp and matmul.hpp on their shards and are checked against these
//   entry points block by block.
// What it refuses to do: no threads, no fused or reordered arithmetic beyond GEMM, no dropout,
//   no KV cache (decoding with one is decode.hpp, on these blocks). T = float is "the fp32
//   reference"; T = double is the oracle. Mixed precision is one policy, for the blocks and the
//   layer: StorageRounding::bf16() (storage_rounding.hpp) rounds the tensors a bf16 run stores at
//   the points listed there ("the bf16 reference"); the default, fp32, rounds nothing. The whole
//   model, the layer stack and the loss are fp32/double only.
// Requirements: a validated ModelConfig; weights shaped as ModelWeights::zeros(config).
//   Weight layout is PyTorch Linear: W is [out, in] and y = x · Wᵀ.
// Guarantees:
//   - Block entry points include their residual (y = x + f(norm(x))), take the GLOBAL positions of
//     their T tokens, overwrite dx, and ACCUMULATE parameter gradients into `grads` (so a caller
//     can sum partial contributions; zero them first with ModelWeights::zeros / LayerWeights).
//   - model_backward overwrites all of `grads`.
//   - The attention and MLP blocks also come with a replaceable core (AttentionCore, MlpCore
//     below); the entry points without one use the reference cores and are bitwise the same.
//   - Deterministic: same inputs, same bits (one-threaded BLAS, fixed loop orders).
//   - Reentrant: no shared mutable state, so rank threads may call any entry point or kernel
//     concurrently on their own buffers (OpenBLAS concurrency is covered by blas_threads_test).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/layer_tensors.hpp"
#include "tspemu/reference/model_config.hpp"
#include "tspemu/reference/storage_rounding.hpp"

namespace tspemu::ref {

template <class T>
struct LayerWeights {
  std::vector<T> input_norm;  // [C]      model.layers.N.input_layernorm.weight
  std::vector<T> wq;          // [NH*hs, C]  model.layers.N.self_attn.q_proj.weight
  std::vector<T> wk;          // [NKV*hs, C] model.layers.N.self_attn.k_proj.weight
  std::vector<T> wv;          // [NKV*hs, C] model.layers.N.self_attn.v_proj.weight
  std::vector<T> wo;          // [C, NH*hs]  model.layers.N.self_attn.o_proj.weight
  std::vector<T> post_norm;   // [C]      model.layers.N.post_attention_layernorm.weight
  std::vector<T> w_gate;      // [F, C]   model.layers.N.mlp.gate_proj.weight
  std::vector<T> w_up;        // [F, C]   model.layers.N.mlp.up_proj.weight
  std::vector<T> w_down;      // [C, F]   model.layers.N.mlp.down_proj.weight

  static LayerWeights zeros(const ModelConfig& cfg);

  // The nine tensors under their field names, in the order of kLayerTensors (layer_tensors.hpp):
  // the attention block's five (input_norm, wq, wk, wv, wo), then the MLP block's four
  // (post_norm, w_gate, w_up, w_down).
  template <class Self>
  static auto named(Self& w) {
    using Vec = std::conditional_t<std::is_const_v<Self>, const std::vector<T>, std::vector<T>>;
    const std::array<Vec*, 9> fields{&w.input_norm, &w.wq,     &w.wk,   &w.wv,    &w.wo,
                                     &w.post_norm,  &w.w_gate, &w.w_up, &w.w_down};
    std::array<std::pair<const char*, Vec*>, 9> out{};
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = {kLayerTensors[i].name, fields[i]};
    return out;
  }
  auto named() { return named(*this); }
  auto named() const { return named(*this); }
};

template <class T>
struct ModelWeights {
  ModelConfig config;
  std::vector<T> embed;  // [V, C]  model.embed_tokens.weight
  std::vector<LayerWeights<T>> layers;
  std::vector<T> final_norm;  // [C]     model.norm.weight
  std::vector<T> lm_head;     // [V, C]  lm_head.weight; empty when config.tie_embeddings

  static ModelWeights zeros(const ModelConfig& cfg);  // validates cfg
  const std::vector<T>& head() const { return config.tie_embeddings ? embed : lm_head; }
};

// One parameter tensor under its Llama checkpoint name. Vec is std::vector<T> or const of it.
template <class Vec>
struct ParamRef {
  std::string name;
  std::vector<std::int64_t> shape;
  Vec* data;
};
// Every parameter of the model in checkpoint order (embed, layers..., norm, lm_head if untied).
template <class T>
std::vector<ParamRef<std::vector<T>>> parameters(ModelWeights<T>& w);
template <class T>
std::vector<ParamRef<const std::vector<T>>> parameters(const ModelWeights<T>& w);

// ---- replaceable cores
// The attention block is norm -> QKV -> RoPE -> core -> o_proj -> residual and the MLP block
// norm -> core -> residual. A schedule that parallelizes only the core (Ulysses: all-to-all inside
// the core; ring attention: K/V blocks passed round inside it and merged by their lse) supplies
// its own and reuses the rest of the block, so it is checked against the reference core alone.
// A core may keep state between forward and backward (a gathered K/V, its own statistics) in its
// closures; std::function copies its target, so keep such state behind a std::shared_ptr. A core
// with state (MlpCore::gated) is one layer's, used by one thread at a time.
//
// Gradient ownership: the attention block accumulates input_norm, wq, wk, wv, wo (the attention
// core has no parameters); the MLP block accumulates post_norm and its core accumulates the
// gradients of the weights it holds (the reference core: w_gate, w_up, w_down into the grads
// given to MlpCore::gated).
// Storage rounding (StorageRounding, the last argument of every block entry point): the block
// rounds what its core returns (att; dq, dk, dv; the MLP core's y and dxn) and its own tensors;
// only the MLP core's inner activations (gate, up, h; dh, dgate, dup) are the core's to round.

// Attention core: causal attention of the block's T local tokens. The block passes
// d = {B, T, T, NH, NKV, hs} and the tokens' GLOBAL positions [T].
//   forward:  att [B, T, NH, hs] and lse [B, NH, T] overwritten, from q [B, T, NH, hs] and k
//             [B, T, NKV, hs] after RoPE and v [B, T, NKV, hs]. The block keeps att (for o_proj's
//             weight gradient) and lse in its cache and hands both back to backward; lse is the
//             core's to fill (the reference core writes the softmax logsumexp).
//   backward: dq [B, T, NH, hs], dk, dv [B, T, NKV, hs] overwritten: gradients w.r.t. the rotated
//             q, k (the block applies rope_backward) and v, given datt [B, T, NH, hs].
template <class T>
struct AttentionCore {
  using Forward = std::function<void(T* att, T* lse, const T* q, const T* k, const T* v,
                                     const std::int64_t* positions, const AttentionDims& d)>;
  using Backward = std::function<void(T* dq, T* dk, T* dv, const T* datt, const T* q, const T* k,
                                      const T* v, const T* att, const T* lse,
                                      const std::int64_t* positions, const AttentionDims& d)>;
  Forward forward;
  Backward backward;

  // The reference core: causal_attention_forward / _backward of the local tokens on themselves.
  static AttentionCore local_causal();
};

// MLP core: the position-wise part of the MLP block on its N = B*T local tokens.
//   forward:  y [N, C] += mlp(xn [N, C]). y holds the residual x on entry, so a core that
//             produces its output in pieces (a weight ring, row-parallel partials) adds each
//             piece straight in, and the reference keeps its one fused GEMM-accumulate.
//   backward: dxn [N, C] overwritten with the gradient w.r.t. xn, given dout [N, C] (the block's
//             dy); the core accumulates the gradients of its own weights.
template <class T>
struct MlpCore {
  using Forward = std::function<void(T* y, const T* xn, int N)>;
  using Backward = std::function<void(T* dxn, const T* dout, const T* xn, int N)>;
  Forward forward;
  Backward backward;

  // The reference core: y += down(silu(gate(xn)) * up(xn)); backward accumulates into
  // grads.w_gate, w_up, w_down. Keeps gate, up, h (3*N*F elements) from forward for backward.
  // w and grads are held by reference: they must outlive the core.
  // storage: where gate, up, h (forward) and dh, dgate, dup (backward) are rounded.
  static MlpCore gated(const ModelConfig& cfg, const LayerWeights<T>& w, LayerWeights<T>& grads,
                       StorageRounding storage = {});
};

// ---- attention block: y = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),
//      n = input_layernorm(x)
template <class T>
struct AttentionCache {
  std::vector<T> xn;    // [B, T, C]      input_layernorm(x)
  std::vector<T> rstd;  // [B*T]
  std::vector<T> q;     // [B, T, NH, hs] after RoPE
  std::vector<T> k;     // [B, T, NKV, hs] after RoPE
  std::vector<T> v;     // [B, T, NKV, hs]
  std::vector<T> att;   // [B, T, NH, hs] attention output, before o_proj
  std::vector<T> lse;   // [B, NH, T]
};

template <class T>
void attention_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w,
                             const T* x,                     // [B, T, C]
                             T* y,                           // [B, T, C]
                             const std::int64_t* positions,  // [T]
                             int B, int T_, AttentionCache<T>& cache, StorageRounding storage = {});

template <class T>
void attention_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w,
                              const T* x,   // [B, T, C]
                              const T* dy,  // [B, T, C]
                              T* dx,        // [B, T, C], overwritten
                              const std::int64_t* positions, int B, int T_,
                              const AttentionCache<T>& cache, LayerWeights<T>& grads,
                              StorageRounding storage = {});

// The same with a replaceable core; without one, AttentionCore<T>::local_causal(). Reads (and
// accumulates the gradients of) only input_norm, wq, wk, wv, wo. An empty core function throws.
template <class T>
void attention_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y,
                             const std::int64_t* positions, int B, int T_, AttentionCache<T>& cache,
                             const AttentionCore<T>& core, StorageRounding storage = {});

template <class T>
void attention_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x,
                              const T* dy, T* dx, const std::int64_t* positions, int B, int T_,
                              const AttentionCache<T>& cache, LayerWeights<T>& grads,
                              const AttentionCore<T>& core, StorageRounding storage = {});

// ---- MLP block: y = x + down(silu(gate(n)) * up(n)),  n = post_attention_layernorm(x)
template <class T>
struct MlpCache {
  std::vector<T> xn;    // [B, T, C]
  std::vector<T> rstd;  // [B*T]
  // The reference core's activations, filled by the entry points without a core; with an
  // explicit core they are left alone (the core keeps what it needs).
  std::vector<T> gate;  // [B, T, F]  n · W_gateᵀ
  std::vector<T> up;    // [B, T, F]  n · W_upᵀ
  std::vector<T> h;     // [B, T, F]  silu(gate) * up
};

template <class T>
void mlp_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w,
                       const T* x,  // [B, T, C]
                       T* y,        // [B, T, C]
                       int B, int T_, MlpCache<T>& cache, StorageRounding storage = {});

template <class T>
void mlp_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, const T* dy,
                        T* dx,  // [B, T, C], overwritten
                        int B, int T_, const MlpCache<T>& cache, LayerWeights<T>& grads,
                        StorageRounding storage = {});

// The same with a replaceable core; without one, the reference gated core. Reads only
// w.post_norm and accumulates only grads.post_norm (the core owns the MLP weights). An empty core
// function throws.
template <class T>
void mlp_block_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y, int B,
                       int T_, MlpCache<T>& cache, const MlpCore<T>& core,
                       StorageRounding storage = {});

template <class T>
void mlp_block_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, const T* dy,
                        T* dx, int B, int T_, const MlpCache<T>& cache, LayerWeights<T>& grads,
                        const MlpCore<T>& core, StorageRounding storage = {});

// ---- one layer = attention block then MLP block
template <class T>
struct LayerCache {
  AttentionCache<T> attn;
  std::vector<T> mid;  // [B, T, C] output of the attention block, input of the MLP block
  MlpCache<T> mlp;
};

template <class T>
void layer_forward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, T* y,
                   const std::int64_t* positions, int B, int T_, LayerCache<T>& cache,
                   StorageRounding storage = {});

template <class T>
void layer_backward(const ModelConfig& cfg, const LayerWeights<T>& w, const T* x, const T* dy,
                    T* dx, const std::int64_t* positions, int B, int T_, const LayerCache<T>& cache,
                    LayerWeights<T>& grads, StorageRounding storage = {});

// ---- a layer stack: L layers, no embedding, LM head or loss
// The layer-only runs (the command line's `--layers-only`, its stand-in training objective) are
// checked against these: forward through every layer, then backward through them in reverse.
template <class T>
struct StackCache {
  std::vector<std::int64_t> positions;  // [T]: 0..T-1
  std::vector<std::vector<T>> x;        // L+1 entries of [B, T, C]: x[l] enters layer l, x[L] = y
  std::vector<LayerCache<T>> layers;    // L
};

// Runs x [B, T, C] through the layers w (L = w.size()) at positions 0..T-1; returns the output
// y = cache.x[L].
template <class T>
const std::vector<T>& layer_stack_forward(const ModelConfig& cfg,
                                          const std::vector<LayerWeights<T>>& w,
                                          const std::vector<T>& x, int B, int T_,
                                          StackCache<T>& cache);

// Given dy [B, T, C], overwrites dx [B, T, C] and grads (one LayerWeights per layer).
template <class T>
void layer_stack_backward(const ModelConfig& cfg, const std::vector<LayerWeights<T>>& w,
                          const std::vector<T>& dy, int B, int T_, const StackCache<T>& cache,
                          std::vector<T>& dx, std::vector<LayerWeights<T>>& grads);

// ---- whole model
struct Batch {
  int B = 0;
  int T = 0;
  std::span<const std::int32_t> tokens;     // [B, T]
  std::span<const std::int32_t> targets;    // [B, T], next-token ids (already shifted)
  std::span<const std::int64_t> positions;  // [T]; empty means 0..T-1
};

template <class T>
struct ModelCache {
  std::vector<std::int64_t> positions;  // [T] as used
  std::vector<std::vector<T>> x;        // L+1 entries of [B, T, C]: x[l] enters layer l
  std::vector<LayerCache<T>> layers;    // L
  std::vector<T> xn_final;              // [B, T, C]
  std::vector<T> rstd_final;            // [B*T]
  std::vector<T> logits;                // [B, T, V]
  double loss = 0;
};

// Returns the mean cross-entropy loss (also stored in cache.loss).
template <class T>
double model_forward(const ModelWeights<T>& w, const Batch& batch, ModelCache<T>& cache);

// Gradients of the loss w.r.t. every parameter (grads overwritten) and, if d_embedded is given,
// w.r.t. the embedding output x[0] ([B, T, C]).
template <class T>
void model_backward(const ModelWeights<T>& w, const Batch& batch, const ModelCache<T>& cache,
                    ModelWeights<T>& grads, std::vector<T>* d_embedded = nullptr);

}  // namespace tspemu::ref
