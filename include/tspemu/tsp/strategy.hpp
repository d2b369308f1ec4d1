// The blocks half of the strategy table: for each strategy (plan/strategy_table.hpp holds its
// name, mesh, rules and traffic formulas), where a rank sits and the per-rank layer and whole model
// `run` builds from the master weights. Indexed by cost::Scheme like the planner's table, so a
// strategy is one entry in each; tsp/strategy.cpp holds the factories.
//
// Requirements: a cost::Strategy whose rules hold (strategy_table.hpp's violation() is nullopt;
// the whole model also with RuleOptions::whole_model).
// Guarantees: strategy_blocks(s).scheme == s for every scheme (checked at compile time).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/parameter_shard.hpp"
#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {

// ---- Block factory --------------------------------------------------------------------------

// The problem a strategy's blocks run: the model (n_layers unused), batch, sequence and TSP's
// options (the baselines use zigzag rows).
struct LayerProblem {
  ref::ModelConfig model;
  int B = 1;
  int S = 0;
  TspOptions tsp;
};

// Where a rank sits: its tokens, and the weight shard it holds.
struct RankPlacement {
  std::vector<std::int64_t> positions;  // global positions of its token rows, in local order
  TspShape shard_shape;                 // the packing of its shards (packed_shards.hpp)
  int shard = 0;                        // which shard of shard_shape.D it holds
  bool reports_tokens = false;          // the one replica that reports these tokens' outputs
  bool reports_shard = false;           // the one replica that reports this shard's gradients
};

// One rank's layer: the attention block then the MLP block, on the rank's token rows
// ([B, rows, C], rows = placement.positions.size()). The attention output is kept between
// forward and backward (activations); backward allocates its gradient (workspace).
class RankLayer {
 public:
  virtual ~RankLayer() = default;
  virtual void forward(const float* x, float* y) = 0;
  // x: forward's input; dx overwritten; the blocks' gradients overwritten.
  virtual void backward(const float* x, const float* dy, float* dx) = 0;
  // Packed like the weights (placement's shard_shape, shard); norms [C], complete on every rank.
  virtual std::span<const float> attention_grad_shard() const = 0;
  virtual std::span<const float> mlp_grad_shard() const = 0;
  virtual std::span<const float> attention_grad_norm() const = 0;
  virtual std::span<const float> mlp_grad_norm() const = 0;
  // The layer's parameters for the optimizer: attention shard, input norm, MLP shard, post norm
  // (packed like the gradients; valid after the first backward, which allocates the gradients).
  virtual std::vector<ParameterShard> parameters() = 0;
};

// One rank's whole model: embedding, L layers (its strategy's RankLayer), final RMSNorm, LM head
// and the mean cross-entropy, forward and backward. How each strategy shards the embedding and
// the LM head is its model's header: tsp_model.hpp (TSP: vocabulary shards broadcast one owner at
// a time), mesh_model.hpp (TP, Megatron-SP, TP+SP: vocabulary-parallel over the TP group; SP,
// Ulysses, ring: replicated).
class RankModel {
 public:
  virtual ~RankModel() = default;
  // tokens, targets: the full [B, S] ids, the same on every rank; each rank reads the tokens it
  // holds. Returns the mean cross-entropy over all B·S tokens, bitwise the same on every rank.
  // An id outside [0, vocab) throws std::invalid_argument naming the rank and the id.
  virtual double forward(std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets) = 0;
  // The loss' gradient of every parameter this rank holds (overwritten); once per forward.
  virtual void backward() = 0;
  // Writes this rank's share of the gradients (weights) into their places in full-size tensors.
  // One replica writes each element, so every rank may fill the same `full` concurrently.
  virtual void write_gradients(ref::ModelWeights<float>& full) const = 0;
  virtual void write_weights(ref::ModelWeights<float>& full) const = 0;
  // Every parameter this rank holds, for the optimizer (valid after the first backward).
  virtual std::vector<ParameterShard> parameters() = 0;
};

// ---- The blocks' table ----------------------------------------------------------------------

struct StrategyBlocks {
  cost::Scheme scheme;
  // Where `rank` sits: its tokens and the weight shard it holds.
  RankPlacement (*place)(const LayerProblem& p, const cost::Strategy& st, int rank);
  // The block factory: `rank`'s layer built from the master weights.
  std::unique_ptr<RankLayer> (*make_layer)(Rank& rank, const LayerProblem& p,
                                           const cost::Strategy& st,
                                           const ref::LayerWeights<float>& master);
  // The whole-model factory: `rank`'s model (p.model.n_layers layers of make_layer) from the
  // master weights; the rules with RuleOptions::whole_model must hold. Its traffic outside the
  // layers is the planner table's vocab_traffic.
  std::unique_ptr<RankModel> (*make_model)(Rank& rank, const LayerProblem& p,
                                           const cost::Strategy& st,
                                           const ref::ModelWeights<float>& master);
};

// The blocks of scheme s; std::invalid_argument for a value outside the enum.
const StrategyBlocks& strategy_blocks(cost::Scheme s);

}  // namespace tspemu::tsp
