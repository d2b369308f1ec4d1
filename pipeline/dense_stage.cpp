#include "tspemu/pipeline/dense_stage.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "tspemu/reference/cross_entropy.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"

namespace tspemu::pipeline {

namespace {

template <class T>
void add_into(std::vector<T>& dst, const std::vector<T>& src) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

[[noreturn]] void throw_order(const StageSpan& s, int microbatch, const std::string& what) {
  throw std::logic_error("pipeline: stage " + std::to_string(s.stage) + " microbatch " +
                         std::to_string(microbatch) + ": " + what);
}

}  // namespace

// What backward_input rebuilds of the forward: the layers' inputs and caches, and on the last
// stage the final norm's and the logits.
template <class T>
struct DenseStage<T>::Recompute {
  std::vector<std::vector<T>> x;  // layers + 1 entries of [B, T, C]
  std::vector<ref::LayerCache<T>> layers;
  std::vector<T> xn_final, rstd_final, logits;
};

template <class T>
DenseStage<T>::DenseStage(const ref::ModelWeights<T>& weights, StageSpan span, int micro_batch,
                          int seq, Arena& arena)
    : w_(weights), span_(span), B_(micro_batch), T_(seq), arena_(arena) {
  if (span.end_layer > weights.config.n_layers || span.first_layer < 0 || micro_batch < 1 ||
      seq < 1) {
    throw std::invalid_argument("DenseStage: stage " + std::to_string(span.stage) + " layers [" +
                                std::to_string(span.first_layer) + ", " +
                                std::to_string(span.end_layer) + ") of a model of " +
                                std::to_string(weights.config.n_layers) + ", microbatch " +
                                std::to_string(micro_batch) + " x " + std::to_string(seq));
  }
  positions_.resize(std::size_t(seq));
  for (int t = 0; t < seq; ++t) positions_[std::size_t(t)] = t;
  acc_ = zero_grads();
}

template <class T>
std::size_t DenseStage<T>::activation_elements() const {
  return std::size_t(B_) * std::size_t(T_) * std::size_t(w_.config.hidden);
}

template <class T>
typename DenseStage<T>::Grads DenseStage<T>::zero_grads() const {
  const ref::ModelConfig& cfg = w_.config;
  const std::size_t vc = std::size_t(cfg.vocab) * std::size_t(cfg.hidden);
  Grads g;
  if (span_.first()) g.embed.assign(vc, T(0));
  g.layers.assign(std::size_t(span_.end_layer - span_.first_layer),
                  ref::LayerWeights<T>::zeros(cfg));
  if (span_.last()) {
    g.final_norm.assign(std::size_t(cfg.hidden), T(0));
    g.head.assign(vc, T(0));
  }
  return g;
}

template <class T>
void DenseStage<T>::run_layers(const T* x0, Recompute& r) const {
  const ref::ModelConfig& cfg = w_.config;
  const std::size_t L = std::size_t(span_.end_layer - span_.first_layer);
  r.x.assign(L + 1, std::vector<T>(activation_elements()));
  std::copy_n(x0, activation_elements(), r.x[0].data());
  r.layers.resize(L);
  for (std::size_t l = 0; l < L; ++l) {
    ref::layer_forward(cfg, w_.layers[std::size_t(span_.first_layer) + l], r.x[l].data(),
                       r.x[l + 1].data(), positions_.data(), B_, T_, r.layers[l]);
  }
  if (!span_.last()) return;
  const int N = B_ * T_, C = cfg.hidden, V = cfg.vocab;
  r.xn_final.resize(std::size_t(N) * std::size_t(C));
  r.rstd_final.resize(std::size_t(N));
  r.logits.resize(std::size_t(N) * std::size_t(V));
  ref::rmsnorm_forward(r.xn_final.data(), r.rstd_final.data(), r.x[L].data(), w_.final_norm.data(),
                       N, C, cfg.norm_eps);
  ref::matmul_nt(r.logits.data(), r.xn_final.data(), w_.head().data(), N, V, C);
}

template <class T>
double DenseStage<T>::forward(int microbatch, const ref::Batch& mb, std::span<const T> x,
                              std::span<T> y) {
  if (saved_.count(microbatch)) throw_order(span_, microbatch, "forward run twice");
  const std::size_t n = activation_elements();
  const int C = w_.config.hidden;
  Buffer<T> in = arena_.allocate<T>(n, Category::activations);
  if (span_.first()) {
    // x = embed_tokens(tokens)                                    [B, T, C]
    for (std::size_t i = 0; i < std::size_t(B_) * std::size_t(T_); ++i) {
      std::copy_n(w_.embed.data() + std::size_t(mb.tokens[i]) * std::size_t(C), C,
                  in.data() + i * std::size_t(C));
    }
  } else {
    std::copy_n(x.data(), n, in.data());
  }
  Recompute r;
  run_layers(in.data(), r);
  saved_.emplace(microbatch, std::move(in));
  if (!span_.last()) {
    std::copy_n(r.x.back().data(), n, y.data());
    return 0;
  }
  return ref::cross_entropy_forward(r.logits.data(), mb.targets.data(), B_ * T_, w_.config.vocab);
}

template <class T>
void DenseStage<T>::head_backward(const ref::Batch& mb, Recompute& r, Grads& g, double loss_scale,
                                  std::vector<T>& dh) const {
  const ref::ModelConfig& cfg = w_.config;
  const int N = B_ * T_, C = cfg.hidden, V = cfg.vocab;
  std::vector<T> dlogits(std::size_t(N) * std::size_t(V));  // [B, T, V]
  ref::cross_entropy_backward(dlogits.data(), r.logits.data(), mb.targets.data(), N, V);
  const T scale = T(loss_scale);
  for (T& d : dlogits) d *= scale;
  // logits = xn @ head.T:  dhead += dlogits.T @ xn;  dxn = dlogits @ head
  ref::matmul_tn(g.head.data(), dlogits.data(), r.xn_final.data(), V, C, N, true);
  std::vector<T> dxn(std::size_t(N) * std::size_t(C));
  ref::matmul_nn(dxn.data(), dlogits.data(), w_.head().data(), N, C, V);
  ref::rmsnorm_backward(dh.data(), g.final_norm.data(), dxn.data(), r.x.back().data(),
                        w_.final_norm.data(), r.rstd_final.data(), N, C);
}

template <class T>
void DenseStage<T>::backward_input(int microbatch, const ref::Batch& mb, std::span<const T> dy,
                                   std::span<T> dx, double loss_scale) {
  auto it = saved_.find(microbatch);
  if (it == saved_.end()) throw_order(span_, microbatch, "backward before its forward");
  if (pending_.count(microbatch)) throw_order(span_, microbatch, "input-gradient pass run twice");
  const ref::ModelConfig& cfg = w_.config;
  const std::size_t n = activation_elements();
  Recompute r;
  run_layers(it->second.data(), r);
  Grads g = zero_grads();
  std::vector<T> dh(n), dprev(n);
  if (span_.last()) {
    head_backward(mb, r, g, loss_scale, dh);
  } else {
    std::copy_n(dy.data(), n, dh.data());
  }
  for (std::size_t l = r.layers.size(); l-- > 0;) {
    ref::layer_backward(cfg, w_.layers[std::size_t(span_.first_layer) + l], r.x[l].data(),
                        dh.data(), dprev.data(), positions_.data(), B_, T_, r.layers[l],
                        g.layers[l]);
    std::swap(dh, dprev);
  }
  if (span_.first()) {
    // x = embed[tokens]: scatter-add rows (a token repeated in the batch accumulates)
    const std::size_t C = std::size_t(cfg.hidden);
    for (std::size_t i = 0; i < std::size_t(B_) * std::size_t(T_); ++i) {
      T* row = g.embed.data() + std::size_t(mb.tokens[i]) * C;
      for (std::size_t c = 0; c < C; ++c) row[c] += dh[i * C + c];
    }
  } else {
    std::copy_n(dh.data(), n, dx.data());
  }
  pending_.emplace(microbatch, std::move(g));
}

template <class T>
void DenseStage<T>::backward_weight(int microbatch) {
  auto it = pending_.find(microbatch);
  if (it == pending_.end()) {
    throw_order(span_, microbatch,
                "weight-gradient pass (W) before its input-gradient pass (I or B): no pending "
                "gradient for tensor " +
                    named(acc_, span_).front().name);
  }
  auto acc = named(acc_, span_);
  auto add = named(it->second, span_);
  for (std::size_t i = 0; i < acc.size(); ++i) add_into(*acc[i].data, *add[i].data);
  pending_.erase(it);
  saved_.erase(microbatch);
}

template <class T>
std::vector<GradTensor<T>> DenseStage<T>::named(Grads& g, const StageSpan& s) {
  std::vector<GradTensor<T>> out;
  if (s.first()) out.push_back({"embed", &g.embed});
  for (std::size_t l = 0; l < g.layers.size(); ++l) {
    const std::string prefix = "layers." + std::to_string(s.first_layer + int(l)) + ".";
    for (auto& [name, vec] : g.layers[l].named()) out.push_back({prefix + name, vec});
  }
  if (s.last()) {
    out.push_back({"final_norm", &g.final_norm});
    out.push_back({"lm_head", &g.head});
  }
  return out;
}

template <class T>
std::vector<GradTensor<T>> DenseStage<T>::gradients() {
  return named(acc_, span_);
}

template <class T>
std::vector<T>* DenseStage<T>::tied_part(bool head) {
  if (!w_.config.tie_embeddings) return nullptr;
  if (head) return span_.last() ? &acc_.head : nullptr;
  return span_.first() ? &acc_.embed : nullptr;
}

template <class T>
void DenseStage<T>::export_gradients(ref::ModelWeights<T>& grads) const {
  if (span_.first()) grads.embed = acc_.embed;
  for (std::size_t l = 0; l < acc_.layers.size(); ++l)
    grads.layers[std::size_t(span_.first_layer) + l] = acc_.layers[l];
  if (span_.last()) {
    grads.final_norm = acc_.final_norm;
    (w_.config.tie_embeddings ? grads.embed : grads.lm_head) = acc_.head;
  }
}

template class DenseStage<float>;
template class DenseStage<double>;

}  // namespace tspemu::pipeline
