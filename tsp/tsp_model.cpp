#include "tspemu/tsp/tsp_model.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/packed_shards.hpp"

namespace tspemu::tsp {

template <class T>
BasicTspModel<T>::BasicTspModel(Rank& rank, const TspShape& shape,
                                const ref::ModelWeights<T>& master)
    : rank_(rank), s_(shape) {
  s_.validate_whole_model();
  const int V = s_.model.vocab, C = s_.model.hidden, D = s_.D;
  vocab_rows_ = V / D;
  Arena& a = rank.arena();
  const std::size_t shard = static_cast<std::size_t>(vocab_rows_) * C;
  const std::size_t first = static_cast<std::size_t>(rank.id()) * shard;
  embed_ = a.allocate<T>(shard, Category::weights);
  std::memcpy(embed_.data(), master.embed.data() + first, shard * sizeof(T));
  if (!s_.model.tie_embeddings) {
    head_ = a.allocate<T>(shard, Category::weights);
    std::memcpy(head_.data(), master.lm_head.data() + first, shard * sizeof(T));
  }
  final_norm_ = a.allocate<T>(static_cast<std::size_t>(C), Category::weights);
  std::memcpy(final_norm_.data(), master.final_norm.data(), final_norm_.size() * sizeof(T));
  for (int l = 0; l < s_.model.n_layers; ++l) {
    layers_.push_back(
        std::make_unique<BasicTspLayer<T>>(rank, s_, master.layers[static_cast<std::size_t>(l)]));
  }
}

template <class T>
double BasicTspModel<T>::forward(const std::int32_t* tokens, const std::int32_t* targets) {
  Arena& a = rank_.arena();
  const int D = s_.D, C = s_.model.hidden, L = s_.model.n_layers, Vl = vocab_rows_;
  const int M = s_.B * s_.Tl();
  const std::size_t MC = static_cast<std::size_t>(M) * C, shard = static_cast<std::size_t>(Vl) * C;
  tokens_.reset();
  targets_.reset();
  tokens_ = a.allocate<std::int32_t>(static_cast<std::size_t>(M), Category::activations);
  targets_ = a.allocate<std::int32_t>(static_cast<std::size_t>(M), Category::activations);
  std::copy(tokens, tokens + M, tokens_.begin());
  std::copy(targets, targets + M, targets_.begin());
  for (int t = 0; t < M; ++t)
    if (tokens_[static_cast<std::size_t>(t)] < 0 ||
        tokens_[static_cast<std::size_t>(t)] >= s_.model.vocab ||
        targets_[static_cast<std::size_t>(t)] < 0 ||
        targets_[static_cast<std::size_t>(t)] >= s_.model.vocab)
      throw std::invalid_argument("rank " + std::to_string(rank_.id()) +
                                  ": token or target id at local index " + std::to_string(t) +
                                  " is outside [0, vocab=" + std::to_string(s_.model.vocab) + ")");
  x_.clear();
  xn_final_.reset();
  rstd_final_.reset();
  lse_.reset();
  for (int l = 0; l <= L; ++l) x_.push_back(a.allocate<T>(MC, Category::activations));
  auto wbuf = a.allocate<T>(shard, Category::comm);

  {
    auto phase = a.phase("embedding");
    for (int r = 0; r < D; ++r) {
      T* E = r == rank_.id() ? embed_.data() : wbuf.data();
      broadcast<T>(rank_.comm(), std::span<T>(E, shard), r);
      for (int t = 0; t < M; ++t) {
        const int id = tokens_[static_cast<std::size_t>(t)];
        if (id / Vl == r)
          std::memcpy(x_[0].data() + static_cast<std::size_t>(t) * C,
                      E + static_cast<std::size_t>(id % Vl) * C,
                      static_cast<std::size_t>(C) * sizeof(T));
      }
    }
  }
  for (int l = 0; l < L; ++l) {
    layers_[static_cast<std::size_t>(l)]->forward(x_[static_cast<std::size_t>(l)].data(),
                                                  x_[static_cast<std::size_t>(l) + 1].data());
  }

  auto phase = a.phase("head");
  xn_final_ = a.allocate<T>(MC, Category::activations);
  rstd_final_ = a.allocate<T>(static_cast<std::size_t>(M), Category::activations);
  lse_ = a.allocate<T>(static_cast<std::size_t>(M), Category::activations);
  auto logits = a.allocate<T>(static_cast<std::size_t>(M) * Vl, Category::workspace);
  auto run_max = a.allocate<T>(static_cast<std::size_t>(M), Category::workspace);
  auto run_sum = a.allocate<T>(static_cast<std::size_t>(M), Category::workspace);
  auto target_logit = a.allocate<T>(static_cast<std::size_t>(M), Category::workspace);
  ref::rmsnorm_forward(xn_final_.data(), rstd_final_.data(), x_[static_cast<std::size_t>(L)].data(),
                       final_norm_.data(), M, C, s_.model.norm_eps);
  for (int t = 0; t < M; ++t) {
    run_max[static_cast<std::size_t>(t)] = -std::numeric_limits<T>::infinity();
    run_sum[static_cast<std::size_t>(t)] = 0.f;
  }
  for (int r = 0; r < D; ++r) {
    T* H = r == rank_.id() ? head_shard() : wbuf.data();
    broadcast<T>(rank_.comm(), std::span<T>(H, shard), r);
    // torch: logits[:, r·Vl:(r+1)·Vl] = xn @ head[r·Vl:(r+1)·Vl].T
    ref::matmul_nt(logits.data(), xn_final_.data(), H, M, Vl, C);
    for (int t = 0; t < M; ++t) {
      const T* row = logits.data() + static_cast<std::size_t>(t) * Vl;
      T m = run_max[static_cast<std::size_t>(t)];
      for (int j = 0; j < Vl; ++j) m = std::max(m, row[j]);
      // Online logsumexp: rescale the running sum to the new maximum.
      T s =
          run_sum[static_cast<std::size_t>(t)] * std::exp(run_max[static_cast<std::size_t>(t)] - m);
      for (int j = 0; j < Vl; ++j) s += std::exp(row[j] - m);
      run_max[static_cast<std::size_t>(t)] = m;
      run_sum[static_cast<std::size_t>(t)] = s;
      const int target = targets_[static_cast<std::size_t>(t)];
      if (target / Vl == r) target_logit[static_cast<std::size_t>(t)] = row[target % Vl];
    }
  }
  double loss_sum = 0;
  for (int t = 0; t < M; ++t) {
    lse_[static_cast<std::size_t>(t)] =
        run_max[static_cast<std::size_t>(t)] + std::log(run_sum[static_cast<std::size_t>(t)]);
    loss_sum += static_cast<double>(lse_[static_cast<std::size_t>(t)]) -
                target_logit[static_cast<std::size_t>(t)];
  }
  all_reduce<double>(rank_.comm(), std::span<double>(&loss_sum, 1));
  return loss_sum / (static_cast<double>(s_.B) * s_.S);
}

template <class T>
void BasicTspModel<T>::backward() {
  Arena& a = rank_.arena();
  const int D = s_.D, C = s_.model.hidden, L = s_.model.n_layers, Vl = vocab_rows_;
  const int M = s_.B * s_.Tl();
  const std::size_t MC = static_cast<std::size_t>(M) * C, shard = static_cast<std::size_t>(Vl) * C;
  const T inv_n = static_cast<T>(1.0 / (static_cast<double>(s_.B) * s_.S));
  if (grad_embed_.empty()) {
    grad_embed_ = a.allocate<T>(shard, Category::gradients);
    if (!s_.model.tie_embeddings) grad_head_ = a.allocate<T>(shard, Category::gradients);
    grad_final_norm_ = a.allocate<T>(static_cast<std::size_t>(C), Category::gradients);
  }
  auto wbuf = a.allocate<T>(shard, Category::comm);
  auto partial = a.allocate<T>(shard, Category::comm);
  auto head_grad = a.allocate<T>(shard, Category::workspace);  // this rank's own head shard's
  auto dx = a.allocate<T>(MC, Category::workspace);
  auto dprev = a.allocate<T>(MC, Category::workspace);
  {
    auto phase = a.phase("head.backward");
    auto dxn = a.allocate<T>(MC, Category::workspace, /*zero=*/true);
    auto dlogits = a.allocate<T>(static_cast<std::size_t>(M) * Vl, Category::workspace);
    for (int r = 0; r < D; ++r) {
      T* H = r == rank_.id() ? head_shard() : wbuf.data();
      broadcast<T>(rank_.comm(), std::span<T>(H, shard), r);
      ref::matmul_nt(dlogits.data(), xn_final_.data(), H, M, Vl, C);
      // torch: dlogits = (softmax(logits) - onehot(target)) / N
      for (int t = 0; t < M; ++t) {
        T* row = dlogits.data() + static_cast<std::size_t>(t) * Vl;
        const T lse = lse_[static_cast<std::size_t>(t)];
        for (int j = 0; j < Vl; ++j) row[j] = std::exp(row[j] - lse);
        const int target = targets_[static_cast<std::size_t>(t)];
        if (target / Vl == r) row[target % Vl] -= 1.f;
        for (int j = 0; j < Vl; ++j) row[j] *= inv_n;
      }
      // torch: dxn += dlogits @ head_r ;  dhead_r = dlogits.T @ xn (this rank's share)
      ref::matmul_nn(dxn.data(), dlogits.data(), H, M, C, Vl, true);
      ref::matmul_tn(partial.data(), dlogits.data(), xn_final_.data(), Vl, C, M);
      reduce<T>(rank_.comm(), std::span<const T>(partial.data(), shard),
                r == rank_.id() ? head_grad.span() : std::span<T>(), r);
    }
    std::memset(grad_final_norm_.data(), 0, grad_final_norm_.size() * sizeof(T));
    ref::rmsnorm_backward(dx.data(), grad_final_norm_.data(), dxn.data(),
                          x_[static_cast<std::size_t>(L)].data(), final_norm_.data(),
                          rstd_final_.data(), M, C);
    all_reduce<T>(rank_.comm(), grad_final_norm_.span());
  }
  for (int l = L - 1; l >= 0; --l) {
    layers_[static_cast<std::size_t>(l)]->backward(x_[static_cast<std::size_t>(l)].data(),
                                                   dx.data(), dprev.data());
    std::swap(dx, dprev);
  }
  auto phase = a.phase("embedding.backward");
  for (int r = 0; r < D; ++r) {
    // torch: dembed[tokens] += dx, for this rank's tokens whose ids are in shard r
    std::memset(partial.data(), 0, shard * sizeof(T));
    for (int t = 0; t < M; ++t) {
      const int id = tokens_[static_cast<std::size_t>(t)];
      if (id / Vl != r) continue;
      T* dst = partial.data() + static_cast<std::size_t>(id % Vl) * C;
      const T* src = dx.data() + static_cast<std::size_t>(t) * C;
      for (int c = 0; c < C; ++c) dst[c] += src[c];
    }
    reduce<T>(rank_.comm(), std::span<const T>(partial.data(), shard),
              r == rank_.id() ? grad_embed_.span() : std::span<T>(), r);
  }
  if (s_.model.tie_embeddings) {
    for (std::size_t i = 0; i < shard; ++i) grad_embed_[i] += head_grad[i];
  } else {
    std::memcpy(grad_head_.data(), head_grad.data(), shard * sizeof(T));
  }
}

template <class T>
void BasicTspModel<T>::write_gradients(ref::ModelWeights<T>& full) const {
  write_tensors(full, false);
}

template <class T>
void BasicTspModel<T>::write_weights(ref::ModelWeights<T>& full) const {
  write_tensors(full, true);
}

template <class T>
std::vector<BasicParameterShard<T>> BasicTspModel<T>::parameters() {
  return model_parameters<T>(embed_, grad_embed_, s_.model.tie_embeddings, head_, grad_head_,
                             layers_, final_norm_, grad_final_norm_);
}

template <class T>
void BasicTspModel<T>::write_tensors(ref::ModelWeights<T>& full, bool weights) const {
  const int p = rank_.id();
  const Buffer<T>& embed = weights ? embed_ : grad_embed_;
  const Buffer<T>& head = weights ? head_ : grad_head_;
  const Buffer<T>& final_norm = weights ? final_norm_ : grad_final_norm_;
  const std::size_t shard = embed.size();
  std::copy(embed.begin(), embed.end(),
            full.embed.begin() + static_cast<std::ptrdiff_t>(p * shard));
  if (!s_.model.tie_embeddings)
    std::copy(head.begin(), head.end(),
              full.lm_head.begin() + static_cast<std::ptrdiff_t>(p * shard));
  for (int l = 0; l < s_.model.n_layers; ++l) {
    const BasicTspAttention<T>& at = attention(l);
    const BasicTspMlp<T>& ml = mlp(l);
    const PackedLayer<T> packed{
        (weights ? at.weight_shard() : at.grad_shard()).span(),
        (weights ? at.norm_weight() : at.grad_norm()).span(),
        (weights ? ml.weight_shard() : ml.grad_shard()).span(),
        (weights ? ml.norm_weight() : ml.grad_norm()).span(),
    };
    unpack_layer(packed, s_, p, true, p == 0, full.layers[static_cast<std::size_t>(l)]);
  }
  if (p == 0) std::copy(final_norm.begin(), final_norm.end(), full.final_norm.begin());
}

template class BasicTspModel<float>;
template class BasicTspModel<double>;

}  // namespace tspemu::tsp
