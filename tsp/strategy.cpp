#include "tspemu/tsp/strategy.hpp"

#include <stdexcept>
#include <string>

#include "tspemu/tsp/baseline_attention.hpp"
#include "tspemu/tsp/baseline_mlp.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/mesh_model.hpp"
#include "tspemu/tsp/ring_attention.hpp"
#include "tspemu/tsp/sequence_sharded_attention.hpp"
#include "tspemu/tsp/tsp_layer.hpp"
#include "tspemu/tsp/tsp_model.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"

namespace tspemu::tsp {

namespace {

using cost::Scheme;
using cost::Strategy;

// ---- Block factory --------------------------------------------------------------------------

// TSP's layer as it is (tsp_layer.hpp).
class TspRankLayer final : public RankLayer {
 public:
  TspRankLayer(Rank& rank, const TspShape& s, const ref::LayerWeights<float>& w)
      : layer_(rank, s, w) {}
  void forward(const float* x, float* y) override { layer_.forward(x, y); }
  void backward(const float* x, const float* dy, float* dx) override { layer_.backward(x, dy, dx); }
  std::span<const float> attention_grad_shard() const override {
    return layer_.attention().grad_shard();
  }
  std::span<const float> mlp_grad_shard() const override { return layer_.mlp().grad_shard(); }
  std::span<const float> attention_grad_norm() const override {
    return layer_.attention().grad_norm();
  }
  std::span<const float> mlp_grad_norm() const override { return layer_.mlp().grad_norm(); }
  std::vector<ParameterShard> parameters() override { return layer_.parameters(); }

 private:
  TspLayer layer_;
};

// A mesh layer: an attention block (BaselineAttention, or SequenceShardedAttention with its core)
// then BaselineMlp, holding the attention output like TspLayer does.
template <class Attention>
class MeshRankLayer final : public RankLayer {
 public:
  MeshRankLayer(Rank& rank, const BaselineShape& s, std::unique_ptr<Attention> attention,
                const ref::LayerWeights<float>& w)
      : rank_(rank),
        rows_(static_cast<std::size_t>(s.B) * s.rows() * s.model.hidden),
        attention_(std::move(attention)),
        mlp_(rank, s, w) {}
  void forward(const float* x, float* y) override {
    mid_.reset();
    mid_ = rank_.arena().allocate<float>(rows_, Category::activations);
    attention_->forward(x, mid_.data());
    mlp_.forward(mid_.data(), y);
  }
  void backward(const float* x, const float* dy, float* dx) override {
    auto dmid = rank_.arena().allocate<float>(rows_, Category::workspace);
    mlp_.backward(mid_.data(), dy, dmid.data());
    attention_->backward(x, dmid.data(), dx);
  }
  std::span<const float> attention_grad_shard() const override { return attention_->grad_shard(); }
  std::span<const float> mlp_grad_shard() const override { return mlp_.grad_shard(); }
  std::span<const float> attention_grad_norm() const override { return attention_->grad_norm(); }
  std::span<const float> mlp_grad_norm() const override { return mlp_.grad_norm(); }
  std::vector<ParameterShard> parameters() override {
    const auto a = attention_->parameters();
    const auto m = mlp_.parameters();
    return {a[0], a[1], m[0], m[1]};
  }

 private:
  Rank& rank_;
  std::size_t rows_;
  std::unique_ptr<Attention> attention_;
  BaselineMlp mlp_;
  Buffer<float> mid_;  // attention output = MLP input (activations)
};

TspShape tsp_shape(const LayerProblem& p, const Strategy& st) {
  return {.model = p.model, .D = st.D, .B = p.B, .S = p.S, .options = p.tsp};
}

template <bool SequenceParallel>
BaselineShape mesh_shape(const LayerProblem& p, const Strategy& st) {
  return {.model = p.model,
          .T = st.T,
          .Sp = st.Sp,
          .B = p.B,
          .S = p.S,
          .sequence_parallel = SequenceParallel};
}

RankPlacement tsp_place(const LayerProblem& p, const Strategy& st, int rank) {
  const TspShape t = tsp_shape(p, st);
  return {t.layout().positions(rank), t, rank, true, true};
}

template <bool SequenceParallel>
RankPlacement mesh_place(const LayerProblem& p, const Strategy& st, int rank) {
  const BaselineShape b = mesh_shape<SequenceParallel>(p, st);
  // The ranks of a row hold the same tokens (each its own piece under Megatron-SP), the ranks
  // of a column the same shard.
  return {b.positions(rank), b.shard_shape(), b.col(rank), SequenceParallel || b.col(rank) == 0,
          b.row(rank) == 0};
}

std::unique_ptr<RankLayer> tsp_layer(Rank& rank, const LayerProblem& p, const Strategy& st,
                                     const ref::LayerWeights<float>& w) {
  return std::make_unique<TspRankLayer>(rank, tsp_shape(p, st), w);
}

template <bool SequenceParallel>
std::unique_ptr<RankLayer> baseline_layer(Rank& rank, const LayerProblem& p, const Strategy& st,
                                          const ref::LayerWeights<float>& w) {
  const BaselineShape b = mesh_shape<SequenceParallel>(p, st);
  return std::make_unique<MeshRankLayer<BaselineAttention>>(
      rank, b, std::make_unique<BaselineAttention>(rank, b, w), w);
}

// Ulysses and ring attention: the SP shape (zigzag tokens, replicated weights), the core built
// first, then the sequence-sharded attention block and SP's MLP block.
template <ref::AttentionCore<float> (*Core)(Rank&, const BaselineShape&)>
std::unique_ptr<RankLayer> sequence_core_layer(Rank& rank, const LayerProblem& p,
                                               const Strategy& st,
                                               const ref::LayerWeights<float>& w) {
  const BaselineShape b = mesh_shape<false>(p, st);
  auto core = Core(rank, b);
  return std::make_unique<MeshRankLayer<SequenceShardedAttention>>(
      rank, b, std::make_unique<SequenceShardedAttention>(rank, b, w, std::move(core)), w);
}

// TspModel behind the common interface: each rank scatters its zigzag (layout) tokens.
class TspRankModel final : public RankModel {
 public:
  TspRankModel(Rank& rank, const TspShape& s, const ref::ModelWeights<float>& w)
      : rank_(rank), s_(s), model_(rank, s, w) {}
  double forward(std::span<const std::int32_t> tokens,
                 std::span<const std::int32_t> targets) override {
    const std::size_t full = static_cast<std::size_t>(s_.B) * s_.S;
    if (tokens.size() != full || targets.size() != full)
      throw std::invalid_argument("rank " + std::to_string(rank_.id()) + ": TSP model got " +
                                  std::to_string(tokens.size()) + " tokens and " +
                                  std::to_string(targets.size()) +
                                  " targets for B·S=" + std::to_string(full));
    std::vector<std::int32_t> tl(static_cast<std::size_t>(s_.B) * s_.Tl()), yl(tl.size());
    const SequenceLayout layout = s_.layout();
    layout.scatter(tokens.data(), tl.data(), rank_.id(), s_.B, 1);
    layout.scatter(targets.data(), yl.data(), rank_.id(), s_.B, 1);
    return model_.forward(tl.data(), yl.data());
  }
  void backward() override { model_.backward(); }
  void write_gradients(ref::ModelWeights<float>& full) const override {
    model_.write_gradients(full);
  }
  void write_weights(ref::ModelWeights<float>& full) const override { model_.write_weights(full); }
  std::vector<ParameterShard> parameters() override { return model_.parameters(); }

 private:
  Rank& rank_;
  TspShape s_;
  TspModel model_;
};

std::unique_ptr<RankModel> tsp_model(Rank& rank, const LayerProblem& p, const Strategy& st,
                                     const ref::ModelWeights<float>& w) {
  return std::make_unique<TspRankModel>(rank, tsp_shape(p, st), w);
}

// Every mesh strategy's model: the vocabulary handling of mesh_model.hpp around the strategy's
// own layers.
template <bool SequenceParallel>
std::unique_ptr<RankModel> mesh_model(Rank& rank, const LayerProblem& p, const Strategy& st,
                                      const ref::ModelWeights<float>& w) {
  const BaselineShape b = mesh_shape<SequenceParallel>(p, st);
  b.validate_whole_model();
  std::vector<std::unique_ptr<RankLayer>> layers;
  for (const auto& lw : w.layers)
    layers.push_back(strategy_blocks(st.scheme).make_layer(rank, p, st, lw));
  return std::make_unique<MeshModel>(rank, b, std::move(layers), w);
}

// ---- The blocks' table -----------------------------------------------------------------------

// Indexed by cost::Scheme (checked below), in the planner table's order.
constexpr StrategyBlocks kBlocks[] = {
    {Scheme::tsp, tsp_place, tsp_layer, tsp_model},
    {Scheme::tp, mesh_place<false>, baseline_layer<false>, mesh_model<false>},
    {Scheme::megatron_sp, mesh_place<true>, baseline_layer<true>, mesh_model<true>},
    {Scheme::sp, mesh_place<false>, baseline_layer<false>, mesh_model<false>},
    {Scheme::ulysses, mesh_place<false>, sequence_core_layer<ulysses_attention_core>,
     mesh_model<false>},
    {Scheme::ring, mesh_place<false>, sequence_core_layer<ring_attention_core>, mesh_model<false>},
    {Scheme::tp_sp, mesh_place<false>, baseline_layer<false>, mesh_model<false>},
};

static_assert(indexed_by_scheme(kBlocks),
              "one entry per cost::Scheme, kBlocks[i] describing value i");

}  // namespace

const StrategyBlocks& strategy_blocks(Scheme s) {
  const auto i = static_cast<std::size_t>(s);
  if (i >= std::size(kBlocks))
    throw std::invalid_argument("strategy blocks: no entry for scheme " + std::to_string(i));
  return kBlocks[i];
}

}  // namespace tspemu::tsp
