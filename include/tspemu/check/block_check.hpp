// check_block: runs a user's parallel schedule of one transformer block on a World and judges
// its output, input gradient and every weight gradient against the dense reference.
//
// What: the user gives a model config, a block (attention, MLP or a whole layer), which tokens
// each rank holds (token_shards.hpp) and a per-rank function that runs forward then backward.
// check_block makes the master weights and the inputs x, dy (seeded), scatters the tokens into
// each rank's arena, runs the function on every rank, gathers y, dx and the gradient shards the
// function declares (RankBlock::gradient with a ShardMap), runs the fp32 reference and the fp64
// oracle on the same float inputs, and applies the numerics rule to every named tensor:
//     err(parallel fp32) <= k · err(reference fp32) + tiny       (reference/numerics.hpp)
// Tensors: "y", "dx", and the block's weight gradients under their LayerWeights names
// ("input_norm", "wq", "wk", "wv", "wo" for attention; "post_norm", "w_gate", "w_up", "w_down"
// for the MLP; all nine for a layer: ref::kLayerTensors, layer_tensors.hpp).
// Requirements: the function writes every element of its y and dx and declares gradients whose
// shards, over all ranks, cover each weight tensor of the block (elements held by several ranks
// must be bitwise equal: replicas). Otherwise check_block throws std::invalid_argument naming the
// rank, the tensor and the element (a usage error, not a verdict).
// Guarantees:
//  - A failed tensor names its worst element as (batch, global position, feature) or (head,
//    feature of the head, column), the ranks that hold it, the parallel / reference / oracle
//    values and the ratio to the bound. Replicas that differ fail the tensor, naming both ranks.
//  - With inject_seeds > 0 the schedule is run again under that many injection seeds
//    (injection.hpp); a result that changes names the seed, the tensor and the element.
//  - Failures inside the schedule (RankFailure, HangError, CollectiveMismatch) propagate as the
//    runtime reports them.
// bf16 (BlockCheck::precision = NumType::bf16; docs/bf16.md): the master weights, x and dy are
// rounded to bf16 (the weights the GEMMs read and the stored inputs of a bf16 run); the reference
// is the float reference under StorageRounding::bf16() (reference/storage_rounding.hpp), the
// oracle the double reference on the same rounded values. The schedule reads the policy from
// RankBlock::storage() and rounds at the same points; where it rounds to bf16 and the reference
// does not (a bf16 reduction's partial sums), it records the magnitude with
// RankBlock::extra_rounding, and each tensor is judged by
//     err(parallel) <= k · err(reference bf16) + u · E + tiny,   u = 2^-8
// with E the largest magnitude any rank recorded for it (0 when none: the rounding points
// coincide, and this is the fp32 rule with the bf16 reference).
// Cost: one run of the schedule (plus one per injection seed) and the reference block in float
// and double.
//
// Example (Ulysses attention, see examples/ulysses_attention.cpp):
//   check::BlockCheck c{.name = "ulysses", .model = cfg, .block = check::Block::attention,
//                       .ranks = 4, .B = 2, .S = 64};
//   c.tokens = check::sequence_sharded(tsp::SequenceLayout(tsp::LayoutKind::zigzag, 4, 64), 2);
//   check::Report r = check::check_block(c, [&](check::RankBlock& rb) { ... });
//   r.print(std::cout);
//   return r.ok() ? 0 : 1;
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tspemu/check/shard_map.hpp"
#include "tspemu/check/token_shards.hpp"
#include "tspemu/core/precision.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/storage_rounding.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::check {

enum class Block { attention, mlp, layer };
const char* block_name(Block b);

struct BlockCheck {
  std::string name = "schedule";
  ref::ModelConfig model{};  // one layer of it is used
  Block block = Block::attention;
  int ranks = 1;
  int B = 1, S = 16;
  TokenShards tokens{};  // required
  std::uint64_t seed = 1;
  double k = 3.0;                     // the rule's factor: a schedule only reorders sums
  NumType precision = NumType::fp32;  // bf16: Megatron's storage policy (see above)
  int inject_seeds = 0;  // > 0: re-run under seeds inject.seed, +1, ... and require the same bits
  Injection inject{};    // the delays' probability and length, and the first seed
  bool trace = false;
  std::string trace_path{};                  // non-empty: write the Chrome trace there
  std::optional<SimClockModel> sim_clock{};  // estimate each rank's step (sim_clock.hpp)
  std::chrono::milliseconds watchdog_timeout{3'000};
};

// What the schedule sees on its rank.
class RankBlock {
 public:
  Rank& rank() { return rank_; }
  Comm& comm() { return rank_.comm(); }
  Arena& arena() { return rank_.arena(); }
  const ref::ModelConfig& config() const { return config_; }
  const ref::LayerWeights<float>& master() const { return master_; }
  int batches() const { return tokens_.batches; }                            // local B
  int tokens() const { return static_cast<int>(tokens_.positions.size()); }  // local T
  std::span<const std::int64_t> positions() const { return tokens_.positions; }
  std::span<const float> x() const { return x_; }    // [batches, tokens, C]
  std::span<const float> dy() const { return dy_; }  // [batches, tokens, C]
  std::span<float> y() { return y_; }                // to write, [batches, tokens, C]
  std::span<float> dx() { return dx_; }              // to write, [batches, tokens, C]

  // The master tensor's shape by name ("wq", "post_norm", ...), with its head axis.
  TensorShape shape(std::string_view name) const;
  // This rank's shard of a master weight, cut by `map`, in its arena (Category::weights).
  Buffer<float> weight(std::string_view name, const ShardMap& map);
  // The precision policy's rounding points, for the schedule to round at (fp32: none).
  ref::StorageRounding storage() const { return storage_; }
  // Records E for tensor `name` ("y", "dx" or a weight): the magnitude this rank's schedule
  // rounded to bf16 where the reference does not, the max over the tensor's elements of the sum
  // of |v| over those roundings of the element (a reduction that rounds on several ranks carries
  // the sums with the data, so the rank holding the result records them all). The check uses the
  // largest E any rank recorded; calling it again keeps the largest. E must be >= 0 and finite.
  void extra_rounding(std::string_view name, double E);
  // Declares (copies) this rank's shard of a weight's gradient. May be called several times for
  // one tensor (pieces); every piece's size must equal its map's.
  void gradient(std::string_view name, std::span<const float> shard, const ShardMap& map);

  struct Piece {
    std::string name;
    std::vector<Rect> rects;
    std::vector<float> data;
  };
  // What the schedule declared: gradient pieces and the E it recorded per tensor.
  struct Declared {
    std::vector<Piece> pieces;
    std::map<std::string, double, std::less<>> extra_rounding;
  };
  RankBlock(Rank& rank, const ref::ModelConfig& config, const ref::LayerWeights<float>& master,
            const TokenShard& tokens, std::span<const float> x, std::span<const float> dy,
            std::span<float> y, std::span<float> dx, Declared& declared,
            ref::StorageRounding storage = {})
      : rank_(rank),
        config_(config),
        master_(master),
        tokens_(tokens),
        x_(x),
        dy_(dy),
        y_(y),
        dx_(dx),
        declared_(declared),
        storage_(storage) {}

 private:
  Rank& rank_;
  const ref::ModelConfig& config_;
  const ref::LayerWeights<float>& master_;
  const TokenShard& tokens_;
  std::span<const float> x_, dy_;
  std::span<float> y_, dx_;
  Declared& declared_;
  ref::StorageRounding storage_;
};

struct TensorResult {
  std::string name;
  ref::Verdict verdict;  // the rule on the assembled tensor
  double ratio = 0;      // parallel max error / bound
  std::string worst;     // the worst element, in the tensor's own terms
  std::vector<int> owners;
  double parallel = 0, reference = 0, oracle = 0;  // at the worst element
  std::vector<std::string> replica_mismatches;
  double E = 0;  // the recorded extra rounding magnitude (bf16 rule; 0: none)
  bool ok() const { return verdict.ok && replica_mismatches.empty(); }
};

// The rule on one tensor (ref::check_close against the oracle; with E > 0, check_close_rounded
// with u = bf16_unit_roundoff) and its ratio to the bound (infinite when the bound is 0 and the
// parallel error is not); worst, owners and the values at the worst element are left to the
// caller, which knows the tensor's layout. The command line's runs judge their tensors with it too.
TensorResult judge_tensor(const std::string& name, std::span<const float> parallel,
                          std::span<const float> reference, std::span<const double> oracle,
                          double k, double E = 0);

struct Report {
  std::string headline;  // the schedule, ranks, shapes and the rule
  std::vector<TensorResult> tensors;
  int inject_seeds = 0;
  std::string nondeterminism;             // empty: every seed gave the same bits
  std::vector<double> simulated_seconds;  // per rank, with a simulated clock
  std::string sim_clock;                  // the model's description
  std::string trace_path;
  bool ok() const;
  double worst_ratio() const;
  const TensorResult* find(std::string_view name) const;
  void print(std::ostream& out) const;
};

Report check_block(const BlockCheck& check, const std::function<void(RankBlock&)>& schedule);

}  // namespace tspemu::check
