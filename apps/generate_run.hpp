// A generation run of `tspemu generate`: one decode strategy (decode_session.hpp) prefills a
// batch of prompts and decodes N tokens per sequence on a World of D ranks, timed, measured and
// checked against the reference decoder and the fp64 oracle.
//
// What runs: every rank makes its session, then step 0 is the prefill and steps 1..N-1 are decode
//   steps, each fed the tokens picked at the step before: N new tokens per sequence. After each
//   step every rank samples its own logits with its own copy of the sampler (greedy, or seeded:
//   one stream, the same seed on every rank, sampling.hpp); the ranks' picks must be equal,
//   otherwise the run fails naming the rank, the step and both picks (a schedule whose ranks
//   disagree would feed them different tokens).
// Measured: each step barrier to barrier on rank 0 (sampling included); time to first token =
//   the prefill step; time per output token = the median decode step; tokens/s = B·N over the
//   whole run; each rank's KV cache bytes after the run against the strategy's closed form (the
//   reference's: S_b = P_b + N - 1 cached positions, the last token sampled, never fed), to the
//   byte; each rank's bytes received in the prefill and per decode step, and, where the strategy
//   states it, each rank's decode-step traffic against its closed form, kind by kind, with ==.
// The check (optional), after the run, teacher-forced on the run's own tokens so that every
//   decoder sees the same context at every step and errors do not compound:
//   - the fp64 oracle (the reference decoder in double on the same float weights) and, for a
//     parallel strategy, the fp32 reference decoder, each fed the run's tokens;
//   - per step, the run's logits [B, V] judged by the project's rule against the fp32 reference
//     and the oracle (check::judge_tensor: err(run) <= k·err(reference) + tiny); the reference
//     strategy is its own fp32 reference;
//   - per step and sequence, the token the run picked (and the fp32 reference's pick) against the
//     token the oracle's logits give under the same sampler state. A different token is a
//     divergence, judged by the oracle's margin against the rule's bound on that row, e =
//     k·err(reference fp32 row) + tiny: it is a near-tie when logits within e of the oracle's row
//     (max norm) make the sampler pick it — greedy: the oracle's top-1 minus the picked token's
//     logit <= 2e; seeded (the same uniform u, replayed from the seed as sampling.hpp specifies):
//     some rescaling of the weights before, at and after the picked token by factors within
//     exp(±e / temperature) puts u·Σw in the picked token's interval (with top-k, a token outside
//     the oracle's set must be within 2e of its k-th logit). Otherwise the divergence fails: no
//     rounding the rule allows explains it. (The reference strategy's own picks are its argmax or
//     draw on logits within err <= e of the oracle's, so for it the judgement only labels the
//     near-ties; a parallel strategy's are held to the reference's error.)
// Guarantees: run_generate throws std::invalid_argument for a shape the strategy refuses or input
//   the reference decoder refuses (before any rank starts), and RankFailure when a rank fails or
//   the ranks disagree; otherwise the result holds the verdict. The trace (c.trace_path) is
//   written only after a successful run, whole or not at all.
// Cost: the strategy's prefill and N - 1 decode steps; the check adds the reference decoder in
//   double (and in float for a parallel strategy) over the same tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "decode_session.hpp"
#include "tspemu/check/block_check.hpp"
#include "tspemu/runtime/counters.hpp"

namespace tspemu::app {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;  // seeded only
  int top_k = 0;             // seeded only; 0: every token
  std::uint64_t seed = 1;    // seeded only
};

struct GenerateConfig {
  const DecodeStrategy* strategy = nullptr;
  GenerateShape shape;  // batch = prompts.size()
  std::shared_ptr<const ref::ModelWeights<float>> weights;
  std::vector<std::vector<std::int32_t>> prompts;  // [B][P_b]
  int new_tokens = 1;                              // N >= 1
  SamplingOptions sampling;
  bool check = true;
  double k = 3.0;  // the rule's factor, as `run` uses
  bool pin = false;
  std::string trace_path;  // "": no trace
  // Progress: after each step of the run (rank 0's thread), then after each checked step.
  std::function<void()> on_step;
};

// The on_step calls of one run.
int generate_steps(const GenerateConfig& c);

struct Divergence {
  int step = 0, seq = 0;
  std::string who;                          // the decoder that picked `token`
  std::int32_t token = 0;                   // its pick
  std::int32_t oracle_token = 0;            // the oracle's pick under the same sampler state
  double oracle_top1 = 0, oracle_top2 = 0;  // the oracle row's two largest logits
  double margin = 0;                        // oracle logit of oracle_token minus that of token
  double bound = 0;  // e: the rule's bound on the row, k·err(reference fp32 row) + tiny
  bool near_tie = false;
};

struct GenerateResult {
  std::vector<std::vector<std::int32_t>> tokens;  // [B][N] generated
  double prefill_seconds = 0;
  std::vector<double> step_seconds;  // decode steps 1..N-1
  double seconds = 0;                // the whole run, prefill included
  double ttft() const { return prefill_seconds; }
  double tpot() const;          // median decode step; 0 when N = 1
  double tokens_per_s() const;  // B·N / seconds
  // Per rank.
  std::vector<std::uint64_t> kv_bytes, kv_model;
  std::vector<TrafficCounters> prefill_traffic, decode_traffic;  // decode: all steps
  bool kv_match = false;
  // The strategy's closed form of decode_traffic (DecodeStrategy::decode_traffic), per rank;
  // empty when it states none. traffic_match: every rank's measured == model (true without one).
  std::vector<TrafficCounters> decode_model;
  bool traffic_match = true;
  // The check.
  bool checked = false;
  std::vector<check::TensorResult> step_logits;  // one per step, "logits step s"
  double max_err_ratio = 0;
  bool numerics_ok = true;
  bool tokens_match_reference = true;  // parallel strategies: every pick equals the reference's
  std::vector<Divergence> divergences;
  std::uint64_t trace_events = 0, trace_dropped = 0;
  bool divergences_explained() const;
  bool pass() const { return kv_match && traffic_match && numerics_ok && divergences_explained(); }
};

GenerateResult run_generate(const GenerateConfig& c);

// The divergence rule above for one row: whether logits within e (max norm) of the oracle's row
// make sampler s (seeded: with the uniform u of this draw) pick `token` where the oracle's row
// gives `oracle_token`.
bool within_rounding(std::span<const double> oracle_row, std::int32_t token,
                     std::int32_t oracle_token, double e, const SamplingOptions& s, double u);

}  // namespace tspemu::app
