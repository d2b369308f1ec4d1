#include "tspemu/tsp/mesh_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "baseline_region.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/parameter_shard.hpp"

namespace tspemu::tsp {

namespace {

std::size_t z(std::int64_t v) {
  return static_cast<std::size_t>(v);
}

}  // namespace

MeshModel::MeshModel(Rank& rank, const BaselineShape& shape,
                     std::vector<std::unique_ptr<RankLayer>> layers,
                     const ref::ModelWeights<float>& master)
    : rank_(rank), s_(shape), layers_(std::move(layers)) {
  s_.validate_whole_model();
  if (layers_.size() != z(s_.model.n_layers))
    throw std::invalid_argument("rank " + std::to_string(rank.id()) + ": MeshModel got " +
                                std::to_string(layers_.size()) +
                                " layers for n_layers=" + std::to_string(s_.model.n_layers));
  region_ = std::make_unique<detail::MeshRegion>(rank, s_);
  const int C = s_.model.hidden;
  vocab_rows_ = s_.model.vocab / s_.T;
  first_id_ = s_.col(rank.id()) * vocab_rows_;
  Arena& a = rank.arena();
  const std::size_t shard = z(vocab_rows_) * z(C), first = z(first_id_) * z(C);
  embed_ = a.allocate<float>(shard, Category::weights);
  std::memcpy(embed_.data(), master.embed.data() + first, shard * sizeof(float));
  if (!s_.model.tie_embeddings) {
    head_ = a.allocate<float>(shard, Category::weights);
    std::memcpy(head_.data(), master.lm_head.data() + first, shard * sizeof(float));
  }
  final_norm_ = a.allocate<float>(z(C), Category::weights);
  std::memcpy(final_norm_.data(), master.final_norm.data(), z(C) * sizeof(float));
}

MeshModel::~MeshModel() = default;

const float* MeshModel::row_of(const float* local, Buffer<float>& storage) {
  if (!pieces()) return local;
  storage =
      rank_.arena().allocate<float>(z(s_.B) * z(s_.Tl()) * z(s_.model.hidden), Category::workspace);
  region_->gather_pieces(local, storage.data());
  return storage.data();
}

double MeshModel::forward(std::span<const std::int32_t> tokens,
                          std::span<const std::int32_t> targets) {
  const int B = s_.B, S = s_.S, C = s_.model.hidden, V = s_.model.vocab, Vl = vocab_rows_;
  const std::size_t full = z(B) * z(S);
  if (tokens.size() != full || targets.size() != full)
    throw std::invalid_argument("rank " + std::to_string(rank_.id()) + ": MeshModel::forward got " +
                                std::to_string(tokens.size()) + " tokens and " +
                                std::to_string(targets.size()) +
                                " targets for B·S=" + std::to_string(full));
  // Every rank checks every id, so a bad one fails all ranks alike before any collective.
  for (std::size_t i = 0; i < full; ++i)
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw std::invalid_argument(
          "rank " + std::to_string(rank_.id()) + ": MeshModel::forward: token " +
          std::to_string(tokens[i]) + " or target " + std::to_string(targets[i]) + " at index " +
          std::to_string(i) + " is outside [0, vocab=" + std::to_string(V) + ")");
  Arena& a = rank_.arena();
  detail::MeshRegion& g = *region_;
  const int row = s_.row(rank_.id()), Rt = B * s_.Tl(), M = B * s_.rows();
  const std::size_t RC = z(Rt) * z(C), MC = z(M) * z(C);
  tokens_.reset();
  targets_.reset();
  x_.clear();
  xn_.reset();
  rstd_.reset();
  probs_.reset();
  tokens_ = a.allocate<std::int32_t>(z(Rt), Category::activations);
  targets_ = a.allocate<std::int32_t>(z(Rt), Category::activations);
  const SequenceLayout rows = s_.row_layout();
  rows.scatter(tokens.data(), tokens_.data(), row, B, 1);
  rows.scatter(targets.data(), targets_.data(), row, B, 1);
  for (int l = 0; l <= s_.model.n_layers; ++l)
    x_.push_back(a.allocate<float>(MC, Category::activations));

  {
    auto phase = a.phase("embedding");
    // torch (VocabParallelEmbedding): masked lookup of the owned ids into the row's [B·Tl, C],
    // then the sum over the row.
    auto lookup = [&](float* e) {
      std::memset(e, 0, RC * sizeof(float));
      for (int t = 0; t < Rt; ++t) {
        const int id = tokens_[z(t)] - first_id_;
        if (id >= 0 && id < Vl)
          std::memcpy(e + z(t) * z(C), embed_.data() + z(id) * z(C), z(C) * sizeof(float));
      }
    };
    if (pieces()) {
      auto e = a.allocate<float>(RC, Category::workspace);
      lookup(e.data());
      g.scatter_pieces(e.data(), x_[0].data());
    } else {  // the layer rows are the row's tokens
      lookup(x_[0].data());
      if (s_.T > 1) all_reduce<float>(g.tp(), x_[0].span());
    }
  }
  for (std::size_t l = 0; l < layers_.size(); ++l)
    layers_[l]->forward(x_[l].data(), x_[l + 1].data());

  auto phase = a.phase("head");
  xn_ = a.allocate<float>(MC, Category::activations);
  rstd_ = a.allocate<float>(z(M), Category::activations);
  probs_ = a.allocate<float>(z(Rt) * z(Vl), Category::activations);
  ref::rmsnorm_forward(xn_.data(), rstd_.data(), x_.back().data(), final_norm_.data(), M, C,
                       s_.model.norm_eps);
  Buffer<float> gathered;
  const float* xn_row = row_of(xn_.data(), gathered);
  // torch: logits[:, first:first+Vl] = xn @ head[first:first+Vl].T
  ref::matmul_nt(probs_.data(), xn_row, head(), Rt, Vl, C);
  gathered.reset();
  // vocab_parallel_cross_entropy: max, sum of exp(logit - max) and target logit over the row.
  auto max = a.allocate<float>(z(Rt), Category::workspace);
  auto sum = a.allocate<float>(z(Rt), Category::workspace);
  auto target = a.allocate<float>(z(Rt), Category::workspace, /*zero=*/true);
  for (int t = 0; t < Rt; ++t) {
    const float* l = probs_.data() + z(t) * z(Vl);
    max[z(t)] = *std::max_element(l, l + Vl);
    const int id = targets_[z(t)] - first_id_;
    if (id >= 0 && id < Vl) target[z(t)] = l[id];
  }
  if (s_.T > 1) {
    auto maxima = a.allocate<float>(z(Rt) * z(s_.T), Category::comm);
    all_gather<float>(g.tp(), max.span(), maxima.span());
    for (int t = 0; t < Rt; ++t)
      for (int q = 0; q < s_.T; ++q) max[z(t)] = std::max(max[z(t)], maxima[z(q) * z(Rt) + z(t)]);
  }
  for (int t = 0; t < Rt; ++t) {
    float* l = probs_.data() + z(t) * z(Vl);
    float s = 0;
    for (int j = 0; j < Vl; ++j) s += (l[j] = std::exp(l[j] - max[z(t)]));
    sum[z(t)] = s;
  }
  if (s_.T > 1) {
    all_reduce<float>(g.tp(), sum.span());
    all_reduce<float>(g.tp(), target.span());
  }
  double loss_sum = 0;
  for (int t = 0; t < Rt; ++t) {
    float* l = probs_.data() + z(t) * z(Vl);
    const float inv = 1.0f / sum[z(t)];
    for (int j = 0; j < Vl; ++j) l[j] *= inv;  // softmax, kept for backward
    // loss = log(sum exp(logit - max)) + max - target logit
    loss_sum += static_cast<double>(std::log(sum[z(t)])) + max[z(t)] - target[z(t)];
  }
  if (s_.Sp > 1) all_reduce<double>(g.sp(), std::span<double>(&loss_sum, 1));
  return loss_sum / (static_cast<double>(B) * S);
}

void MeshModel::backward() {
  Arena& a = rank_.arena();
  detail::MeshRegion& g = *region_;
  const int C = s_.model.hidden, Vl = vocab_rows_, Rt = s_.B * s_.Tl(), M = s_.B * s_.rows();
  const std::size_t RC = z(Rt) * z(C), MC = z(M) * z(C), shard = z(Vl) * z(C);
  const float inv_n = static_cast<float>(1.0 / (static_cast<double>(s_.B) * s_.S));
  if (grad_embed_.empty()) {
    grad_embed_ = a.allocate<float>(shard, Category::gradients);
    if (!s_.model.tie_embeddings) grad_head_ = a.allocate<float>(shard, Category::gradients);
    grad_final_norm_ = a.allocate<float>(z(C), Category::gradients);
  }
  // The tied head's gradient waits here for the embedding's.
  Buffer<float> tied_head_grad;
  if (s_.model.tie_embeddings) tied_head_grad = a.allocate<float>(shard, Category::workspace);
  float* dhead = s_.model.tie_embeddings ? tied_head_grad.data() : grad_head_.data();
  auto dx = a.allocate<float>(MC, Category::workspace);
  {
    auto phase = a.phase("head.backward");
    // torch: dlogits = (softmax - onehot(target)) / N, in place of the kept softmax
    for (int t = 0; t < Rt; ++t) {
      float* row = probs_.data() + z(t) * z(Vl);
      const int id = targets_[z(t)] - first_id_;
      if (id >= 0 && id < Vl) row[id] -= 1.f;
      for (int j = 0; j < Vl; ++j) row[j] *= inv_n;
    }
    Buffer<float> gathered;
    const float* xn_row = row_of(xn_.data(), gathered);  // gathered again rather than kept
    // torch: dhead = dlogits.T @ xn ;  dxn = dlogits @ head (this rank's vocabulary share)
    ref::matmul_tn(dhead, probs_.data(), xn_row, Vl, C, Rt);
    gathered.reset();
    if (!s_.model.tie_embeddings && s_.Sp > 1) all_reduce<float>(g.sp(), grad_head_.span());
    auto dxn_row = a.allocate<float>(RC, Category::workspace);
    ref::matmul_nn(dxn_row.data(), probs_.data(), head(), Rt, C, Vl);
    Buffer<float> dxn_piece;
    const float* dxn = dxn_row.data();
    if (pieces()) {
      dxn_piece = a.allocate<float>(MC, Category::workspace);
      g.scatter_pieces(dxn_row.data(), dxn_piece.data());
      dxn = dxn_piece.data();
    } else if (s_.T > 1) {
      all_reduce<float>(g.tp(), dxn_row.span());
    }
    std::memset(grad_final_norm_.data(), 0, z(C) * sizeof(float));
    ref::rmsnorm_backward(dx.data(), grad_final_norm_.data(), dxn, x_.back().data(),
                          final_norm_.data(), rstd_.data(), M, C);
    if (s_.sequence_parallel) {
      if (s_.ranks() > 1) all_reduce<float>(rank_.comm(), grad_final_norm_.span());
    } else if (s_.Sp > 1) {
      all_reduce<float>(g.sp(), grad_final_norm_.span());
    }
  }
  {
    auto dprev = a.allocate<float>(MC, Category::workspace);
    for (std::size_t l = layers_.size(); l-- > 0;) {
      layers_[l]->backward(x_[l].data(), dx.data(), dprev.data());
      std::swap(dx, dprev);
    }
  }
  auto phase = a.phase("embedding.backward");
  Buffer<float> gathered;
  const float* dx_row = row_of(dx.data(), gathered);
  // torch: dembed[tokens] += dx, for the row's tokens whose ids this rank owns
  std::memset(grad_embed_.data(), 0, shard * sizeof(float));
  for (int t = 0; t < Rt; ++t) {
    const int id = tokens_[z(t)] - first_id_;
    if (id < 0 || id >= Vl) continue;
    float* dst = grad_embed_.data() + z(id) * z(C);
    const float* src = dx_row + z(t) * z(C);
    for (int c = 0; c < C; ++c) dst[c] += src[c];
  }
  if (s_.model.tie_embeddings)
    for (std::size_t i = 0; i < shard; ++i) grad_embed_[i] += tied_head_grad[i];
  if (s_.Sp > 1) all_reduce<float>(g.sp(), grad_embed_.span());
}

void MeshModel::write_gradients(ref::ModelWeights<float>& full) const {
  write_tensors(full, false);
}

void MeshModel::write_weights(ref::ModelWeights<float>& full) const {
  write_tensors(full, true);
}

std::vector<ParameterShard> MeshModel::parameters() {
  return model_parameters<float>(embed_, grad_embed_, s_.model.tie_embeddings, head_, grad_head_,
                                 layers_, final_norm_, grad_final_norm_);
}

void MeshModel::write_tensors(ref::ModelWeights<float>& full, bool weights) const {
  // Row 0 reports each column's shards, rank 0 the replicated norms: disjoint elements.
  const int p = rank_.id(), col = s_.col(p);
  const auto first = static_cast<std::ptrdiff_t>(z(first_id_) * z(s_.model.hidden));
  auto put = [](const Buffer<float>& b, std::vector<float>& dst, std::ptrdiff_t at) {
    std::copy(b.begin(), b.end(), dst.begin() + at);
  };
  if (s_.row(p) == 0) {
    put(weights ? embed_ : grad_embed_, full.embed, first);
    if (!s_.model.tie_embeddings) put(weights ? head_ : grad_head_, full.lm_head, first);
  }
  if (p == 0) put(weights ? final_norm_ : grad_final_norm_, full.final_norm, 0);
  const TspShape packing = s_.shard_shape();
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    // parameters(): attention shard, input norm, MLP shard, post norm
    const std::vector<ParameterShard> ps = layers_[l]->parameters();
    auto of = [&](std::size_t i) -> std::span<const float> {
      return weights ? std::span<const float>(ps[i].weight) : ps[i].grad;
    };
    unpack_layer<float>({of(0), of(1), of(2), of(3)}, packing, col, s_.row(p) == 0, p == 0,
                        full.layers[l]);
  }
}

}  // namespace tspemu::tsp
