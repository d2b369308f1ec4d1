// `tspemu generate`: prefill a batch of prompts and decode N new tokens per sequence with one
// decode strategy (decode_session.hpp) on D ranks, checked against the reference decoder and the
// fp64 oracle (generate_run.hpp), with time to first token, time per output token, tokens/s, the
// KV cache bytes per rank measured vs the closed form, the generated tokens and a verdict; JSON,
// a Perfetto trace with the prefill and every decode step as spans, a progress bar.
//
// Prompts: --prompt-lengths "7,13,5" (a batch of prompts of those lengths, tokens from a stream
//   seeded by --seed) or --prompt TEXT (one prompt, its UTF-8 bytes as token ids, corpus.hpp).
// Context: --max-context, else the checkpoint's max_position_embeddings (--weights), else 2048.
// Guarantees: every bad input is a ConfigError (exit 2) naming the flag and the value before any
//   rank starts: a prompt longer than the context, --new-tokens < 1 or a prompt + new tokens
//   beyond the context, an empty prompt, a prompt token outside the vocabulary (a checkpoint
//   whose vocabulary does not cover the prompt's bytes), --ranks the strategy cannot run, bad
//   sampling parameters. --json and --trace are written whole, and only by a run that completes.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "checkpoint_options.hpp"
#include "generate_run.hpp"
#include "problem_options.hpp"

namespace tspemu::app {

struct GenerateArgs {
  ProblemOptions problem;     // the model flags, --seed and --pin
  CheckpointArgs checkpoint;  // --weights
  std::string strategy;       // generate_default() unless given
  int ranks = 1;
  int interleave = 1;
  std::string prompt_lengths = "7,13,5";
  std::string prompt;  // non-empty: one byte-level prompt instead of --prompt-lengths
  int new_tokens = 32;
  std::int64_t max_context = 0;  // 0: the checkpoint's, else 2048
  std::string sampling = "greedy";
  double temperature = 1.0;
  int top_k = 0;
  bool check = true;
  bool quiet = false;
  std::string json_path, trace_path;
  // Set by add_generate_command: whether these were given (refused with greedy sampling).
  const CLI::Option* temperature_flag = nullptr;
  const CLI::Option* top_k_flag = nullptr;
  const CLI::Option* prompt_flag = nullptr;
  GenerateArgs();
};

CLI::App* add_generate_command(CLI::App& app, GenerateArgs& a);
// 0: PASS; 1: FAIL. Throws ConfigError for a bad configuration before anything runs.
int generate_command(const GenerateArgs& a, std::ostream& out);

// The decoding flags `generate` and `compare --inference` share, bound to `a`, on a subcommand
// that has the problem flags (add_problem_options): --weights (no --save), --prompt-lengths,
// --prompt, --new-tokens/-N, --interleave, --max-context, --sampling, --temperature, --top-k.
// Returns them (compare refuses them without --inference).
std::vector<const CLI::Option*> add_decode_options(CLI::App& cmd, GenerateArgs& a);

// Every check of the Guarantees above, before anything runs, and the run they configure:
// a.strategy on a.ranks ranks (the seeded weights unless --weights). context_source receives
// where the context bound comes from, for the report.
GenerateConfig make_generate_config(const GenerateArgs& a, std::string& context_source);

// The run's inputs as the reports state them: "3 prompts (lengths 7,13,5), 32 new tokens each,
// greedy", then the model, weights, BLAS kernel and context lines, each ending in a newline.
std::string generate_inputs_text(const GenerateArgs& a, const GenerateConfig& c,
                                 const std::string& context_source);
// The same inputs as the JSON documents' "config" keys (batch, prompt_lengths, new_tokens, ...).
nlohmann::json generate_inputs_json(const GenerateArgs& a, const GenerateConfig& c);

}  // namespace tspemu::app
