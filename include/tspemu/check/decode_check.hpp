// check_decode: runs a user's parallel decode schedule (prefill, then one token per sequence per
// step, e.g. their decode context parallelism) on a World and judges every rank's logits and KV
// cache against the reference decoder (reference/decode.hpp) and the fp64 oracle.
//
// What: the user gives a model config (or float weights), D ranks, a batch of prompts, a number of
//   steps and a per-rank factory of their schedule (RankDecoder: prefill(prompts) -> logits
//   [B, V], decode_step(tokens) -> logits [B, V], and optionally its cache entries). check_decode
//   1. runs the fp64 oracle greedily (ref::generate in double on the float weights widened, so only
//      the arithmetic differs) and the fp32 reference fed the oracle's tokens;
//   2. runs the schedule on D ranks, teacher-forced: step i feeds every rank the oracle's greedy
//      token i of every sequence, so an error never changes later inputs and does not compound;
//   3. judges the logits of every (step, sequence, rank) row [V] by the project's rule
//          err(parallel fp32) <= k · err(reference fp32) + tiny        (reference/numerics.hpp)
//      k = 3 by default (as check_block: a schedule only reorders sums, so its error is of the
//      reference's order and k absorbs the luck of rounding); tiny = 4 fp32 ulps of the row's
//      largest |oracle| (ref::default_tiny);
//   4. requires every rank's logits to be bitwise identical to rank 0's (ranks that disagree would
//      sample different tokens);
//   5. with check_cache, reads every rank's cache after the last step (RankDecoder::cache_entry:
//      post-RoPE K and V [NKV·hs] of (layer, sequence, position)), requires every position held by
//      at least one rank and replicas bitwise equal, and judges each layer's K and V over all
//      sequences and positions by the same rule against the reference's and the oracle's caches;
//   6. with free_run_steps = n > 0, runs the schedule again free: prefill, then n - 1 steps, each
//      rank fed the greedy tokens of its own logits, and compares every rank's n tokens per
//      sequence with the fp32 reference's greedy run and with rank 0's. A token that differs from
//      the reference's is a near-tie, not a failure, only when the oracle says the two choices are
//      within rounding: with o the oracle's logits on the shared context and bound = k · err(ref
//      fp32 row) + tiny, a parallel row within the rule (|c - o| <= bound) and the reference
//      (|r - o| <= bound) can pick t_p and t_r only if |o[t_p] - o[t_r]| <= 2 · bound (near_tie());
//      past a divergence the sequence's contexts differ and its later tokens are not compared.
// Requirements: model.validate(); ranks >= 1; every prompt non-empty with tokens in [0, V);
//   steps >= 0; weights, when given, of the model's config. The factory is called on every rank's
//   thread at once (it must not share mutable state between ranks) and builds that rank's
//   RankDecoder inside the run; every rank's decoder makes the same collective calls. Otherwise
//   std::invalid_argument naming the value, before anything runs (a usage error, not a verdict).
// Guarantees:
//   - A failure is a result, not a crash: each DecodeFailure names the tensor ("logits",
//     "cache K", "cache V", "tokens", "schedule"), the step, sequence, rank, layer and position
//     that apply, and the errors or values. A schedule that throws on one rank (the runtime fails
//     the others' collectives within milliseconds) is a "schedule" failure naming that rank and
//     the step it was in; no verdict on the logits (nor a free run) follows from a failed run.
//   - Deterministic: the same inputs give the same report.
// Cost: the oracle (double) and the reference (float) decoders over steps + 1 passes, once each
//   (twice more with a free run), the schedule once (twice with a free run), and the cache read
//   of 2 · L · Σ_b (P_b + steps) · NKV · hs floats per rank.
//
// Example (TSP-W, see examples/tspw_decode.cpp):
//   check::DecodeCheck c{.name = "tspw", .model = cfg, .ranks = 4, .prompts = prompts,
//                        .steps = 16, .free_run_steps = 32};
//   check::DecodeReport r = check::check_decode(c, [](check::DecodeRank& dr) {
//     return std::make_unique<MyDecoder>(dr);
//   });
//   r.print(std::cout);
//   return r.ok() ? 0 : 1;
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tspemu/check/shard_map.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/rank_kv_cache.hpp"

namespace tspemu::check {

using Prompts = std::vector<std::vector<std::int32_t>>;

struct DecodeCheck {
  std::string name = "decode";
  ref::ModelConfig model{};
  // Float weights to decode with; null: ref::init_weights(model, seed) rounded to float.
  std::shared_ptr<const ref::ModelWeights<float>> weights{};
  int ranks = 1;
  Prompts prompts{};           // B >= 1 prompts, lengths may differ
  int steps = 8;               // teacher-forced decode steps after the prefill
  int free_run_steps = 0;      // > 0: a free greedy run of that many tokens per sequence
  bool check_cache = true;     // read and judge every rank's KV cache after the last step
  std::int64_t max_context{};  // given to the schedule; 0: longest prompt + every step run
  std::uint64_t seed = 1;
  double k = 3.0;         // the rule's factor
  double rtol64 = 1e-13;  // check_decode_double's bound, relative to max |oracle| (derived there)
  std::chrono::milliseconds watchdog_timeout{3'000};
};

// A user's decode schedule on one rank, in scalar T (float: check_decode; double:
// check_decode_double). prefill and decode_step are called with the same arguments on every rank
// and return logits [B, V] (row b: the next-token logits of sequence b).
template <class T>
class BasicRankDecoder {
 public:
  virtual ~BasicRankDecoder() = default;
  virtual std::vector<T> prefill(const Prompts& prompts) = 0;
  virtual std::vector<T> decode_step(std::span<const std::int32_t> tokens) = 0;
  // Whether this rank holds position pos of sequence seq in layer `layer`; if so, copies its
  // post-RoPE K and its V ([NKV, hs] each) into k and v. The default reads kv_cache() and throws
  // std::logic_error when the schedule offers neither (set DecodeCheck::check_cache = false).
  virtual bool cache_entry(int layer, int seq, std::int64_t pos, std::span<T> k,
                           std::span<T> v) const;
  // A schedule that keeps its cache in a tsp::RankKvCache returns it here.
  virtual const tsp::RankKvCache<T>* kv_cache() const { return nullptr; }
};
using RankDecoder = BasicRankDecoder<float>;
using RankDecoder64 = BasicRankDecoder<double>;
extern template class BasicRankDecoder<float>;
extern template class BasicRankDecoder<double>;

// One layer's weights on one rank cut Megatron-style (TP; TSP-W; a Helix FFN), from DecodeRank::
// tp_layer: wq, wk, wv head_sharded (column-parallel: this rank's NH/D query and NKV/D KV heads),
// wo head_sharded along its columns (row-parallel), w_gate, w_up column_parallel (F/D rows),
// w_down row_parallel (F/D columns), the norms replicated.
template <class T>
struct BasicTpLayer {
  Buffer<T> input_norm, wq, wk, wv, wo, post_norm, w_gate, w_up, w_down;
};
using TpLayer = BasicTpLayer<float>;

// What the factory sees on its rank (the master weights in the schedule's scalar T).
template <class T>
class BasicDecodeRank {
 public:
  BasicDecodeRank(Rank& rank, const ref::ModelWeights<T>& master, int batch,
                  std::int64_t max_context)
      : rank_(rank), master_(master), batch_(batch), max_context_(max_context) {}
  Rank& rank() { return rank_; }
  Comm& comm() { return rank_.comm(); }
  Arena& arena() { return rank_.arena(); }
  const ref::ModelConfig& config() const { return master_.config; }
  const ref::ModelWeights<T>& master() const { return master_; }
  int batch() const { return batch_; }
  std::int64_t max_context() const { return max_context_; }  // positions per sequence, at most

  // The master tensor's shape: a layer tensor by its LayerWeights name ("wq", "w_down", ...), or
  // with layer = -1 "embed" [V, C], "lm_head" [V, C] (the embedding when tied), "final_norm".
  TensorShape shape(std::string_view name) const;
  // This rank's shard of a master tensor of layer `layer` (-1: the model's), cut by `map`, in its
  // arena (Category::weights).
  Buffer<T> weight(int layer, std::string_view name, const ShardMap& map);
  // Rank id()'s Megatron shard of layer `layer` over the rank()'s size D (TpLayer); D must divide
  // NH, NKV and F (else std::invalid_argument from ShardMap::resolve naming the tensor).
  BasicTpLayer<T> tp_layer(int layer);

 private:
  Rank& rank_;
  const ref::ModelWeights<T>& master_;
  int batch_;
  std::int64_t max_context_;
};
using DecodeRank = BasicDecodeRank<float>;
using DecodeRank64 = BasicDecodeRank<double>;
extern template class BasicDecodeRank<float>;
extern template class BasicDecodeRank<double>;

using DecoderFactory = std::function<std::unique_ptr<RankDecoder>(DecodeRank&)>;
using DecoderFactory64 = std::function<std::unique_ptr<RankDecoder64>(DecodeRank64&)>;

struct DecodeFailure {
  std::string tensor;  // "logits", "cache K", "cache V", "tokens", "schedule"
  int step = -1, sequence = -1, rank = -1, layer = -1;  // -1: does not apply
  std::int64_t position = -1;
  std::string detail;
  std::string where() const;  // "step 3 sequence 1 rank 2", the parts that apply
};

struct DecodeReport {
  std::string headline;
  int rows_judged = 0;             // (step, sequence, rank) logits rows judged by the rule
  double worst_logits_ratio = 0;   // parallel error / bound, over the rows
  std::string worst_logits_where;  // where it is
  std::vector<std::string> cache;  // one line per judged cache tensor (empty: not checked)
  int free_run_steps = 0;
  std::vector<std::string> near_ties;  // free-run divergences the oracle margin explains
  std::vector<DecodeFailure> failures;
  bool ok() const { return failures.empty(); }
  // The failures of one tensor ("logits", ...).
  std::vector<const DecodeFailure*> find(std::string_view tensor) const;
  // The summary lines, then up to max_per_tensor failures of each tensor, then the verdict.
  void print(std::ostream& out, std::size_t max_per_tensor = 4) const;
};

DecodeReport check_decode(const DecodeCheck& check, const DecoderFactory& factory);

// The double entry point: the same runs with the schedule in double on the float weights widened
// (as check_decode's oracle), checked as the decoder tests check theirs. The fp64 oracle is then
// the reference itself, so the rule's reference error is 0 and the bound is rtol64 (below):
//   - every (step, sequence, rank) logits row and every cache tensor (layer, K or V):
//       max |parallel - oracle| <= rtol64 · max |oracle|        (ref::check_close64)
//     a schedule only reorders double sums, ~1e-14 relative per GEMM chain, so 1e-13 holds at
//     the test models' sizes (tests/reference/decode_test.cpp's kCachedRtol derives it); a bug
//     (a wrong position, shard or owner) moves values by O(1) of their magnitude;
//   - every rank's logits bitwise rank 0's, and replicas of a cache position bitwise equal;
//   - the free run's tokens equal the reference's exactly: in double a divergence is a failure,
//     never a near-tie.
// Requirements, guarantees and failures as check_decode's.
DecodeReport check_decode_double(const DecodeCheck& check, const DecoderFactory64& factory);

// Whether greedy picks t_parallel and t_reference, where they differ, are within rounding of a
// tie: |oracle[t_parallel] - oracle[t_reference]| <= 2 · (k · err(reference row) + tiny) (the
// derivation is in the file comment). margin gets the oracle's top-1 minus top-2 value. The two
// ids must lie in [0, oracle.size()); a non-finite reference row is never a tie.
bool near_tie(std::span<const double> oracle, std::span<const float> reference, int t_parallel,
              int t_reference, double k, double* margin = nullptr);

// B prompts of the given lengths, tokens uniform in [0, vocab) from a seeded stream.
Prompts seeded_prompts(int vocab, const std::vector<int>& lengths, std::uint64_t seed);

}  // namespace tspemu::check
