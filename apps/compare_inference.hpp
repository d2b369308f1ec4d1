// `tspemu compare --inference`: every registered decode strategy (decode_session.hpp's table) on
// the same prompts, side by side — the reference decoder on 1 rank, every other entry on --ranks
// D — each run and checked as `tspemu generate` runs and checks it (generate_run.hpp).
//
// What: generate's decoding flags (add_decode_options: --prompt-lengths or --prompt, --new-tokens,
//   --interleave, --max-context, --sampling, --weights ...) with compare's --ranks, model flags,
//   --seed, --no-check, --quiet and --json. Per strategy: time to first token, time per output
//   token, tokens/s, the KV cache bytes per rank measured vs the strategy's closed form (max over
//   ranks), the calls and bytes per collective kind per decode step measured vs its closed form
//   where the strategy states one (max over ranks; the match compares every rank, kind by kind,
//   with ==), whether its tokens equal the reference decoder's (free-running, the same sampler),
//   the worst err/bound of its checked logits and its verdict (GenerateResult::pass()).
// Requirements: `a` parsed with --inference.
// Guarantees: a bad configuration is a ConfigError (exit 2) naming the flag before any rank
//   starts: generate's checks of the decoding flags, a flag of the training comparison beside
//   --inference (compare_command.cpp refuses those), a run under mpirun spanning processes. A
//   strategy whose why_invalid refuses the shape is a row with the reason; a strategy that throws
//   while running is a failed row with the message, and the others still run. --json is written
//   whole, after every row ran. Returns 0 when every strategy that ran passed, else 1.
// Cost: every runnable strategy's generate run, each with its check unless --no-check.
#pragma once

#include <iosfwd>

#include "compare_command.hpp"

namespace tspemu::app {

int compare_inference(const CompareArgs& a, std::ostream& out);

}  // namespace tspemu::app
