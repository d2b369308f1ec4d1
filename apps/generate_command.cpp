#include "generate_command.hpp"

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <ostream>
#include <sstream>

#include "corpus.hpp"
#include "output_files.hpp"
#include "progress_bar.hpp"
#include "stack_report.hpp"
#include "tspemu/core/regular_file.hpp"
#include "tspemu/core/sanitized.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::app {

namespace {

constexpr std::int64_t kDefaultContext = 2048;
constexpr std::size_t kTokensShown = 12;  // generated tokens printed per sequence

using Prompts = std::vector<std::vector<std::int32_t>>;

std::string join(const std::vector<std::int32_t>& v, std::size_t n, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < n; ++i)
    s += (i == 0 ? "" : sep) + std::to_string(v[i]);
  return s;
}

// The prompt lengths in `text` ("7,13,5"), each checked to be a count of tokens >= 1.
std::vector<std::int64_t> prompt_lengths(const std::string& text) {
  const std::string flag = "--prompt-lengths " + sanitized(text);
  std::vector<std::int64_t> lengths;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    long long n = 0;
    const auto [p, ec] = std::from_chars(text.data() + at, text.data() + end, n);
    if (ec != std::errc() || p != text.data() + end || n < 0 || n > (1LL << 30))
      throw ConfigError(flag + ": give comma-separated prompt lengths, e.g. 7,13,5");
    if (n == 0)
      throw ConfigError(flag + ": sequence " + std::to_string(lengths.size()) +
                        " has an empty prompt (every prompt needs at least one token)");
    lengths.push_back(n);
    at = end + 1;
  }
  return lengths;
}

// Prompts of these lengths, tokens from a stream seeded by `seed`. Made only once every length is
// known to fit the context, so a length far past it is refused without holding its tokens.
Prompts seeded_prompts(const std::vector<std::int64_t>& lengths, int vocab, std::uint64_t seed) {
  Prompts prompts;
  for (const std::int64_t n : lengths) prompts.emplace_back(static_cast<std::size_t>(n));
  ref::SplitMix64 rng(seed ^ ref::fnv1a64("generate prompts"));
  for (auto& p : prompts)
    for (auto& t : p) t = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(vocab));
  return prompts;
}

// --prompt TEXT: its bytes, each a token that the vocabulary must hold.
Prompts byte_prompt(const GenerateArgs& a, int vocab) {
  if (a.prompt.empty())
    throw ConfigError("--prompt '': an empty prompt (a prompt needs at least one token)");
  std::vector<std::int32_t> tokens;
  try {
    tokens = byte_tokens(a.prompt, "--prompt");
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab)
      throw ConfigError(
          "--prompt " + sanitized(a.prompt) + ": byte " + std::to_string(i) + " is token " +
          std::to_string(tokens[i]) + ", outside the vocabulary of " + std::to_string(vocab) +
          (a.checkpoint.weights.empty() ? " (--vocab)" : " of --weights " + a.checkpoint.weights) +
          "; a byte-level prompt needs a vocabulary of at least 256");
  return {tokens};
}

// The checkpoint's max_position_embeddings, or 0 when config.json has none.
std::int64_t checkpoint_context(const std::string& dir) {
  // Read after the checkpoint loaded, so config.json was a regular file of a sane size: read it
  // the same way again (it may have been swapped since).
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::string text;
  try {
    text = read_regular_file(path, std::uint64_t{1} << 20, "a config.json's bound");
  } catch (const FileReadError& e) {
    throw ConfigError("--weights " + dir + ": " + e.what());
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_object() && j.contains("max_position_embeddings") &&
      j["max_position_embeddings"].is_number_integer())
    return std::max<std::int64_t>(0, j["max_position_embeddings"].get<std::int64_t>());
  return 0;
}

SamplingOptions sampling_options(const GenerateArgs& a) {
  SamplingOptions s{.greedy = a.sampling == "greedy",
                    .temperature = a.temperature,
                    .top_k = a.top_k,
                    .seed = a.problem.seed};
  if (s.greedy) {
    for (const CLI::Option* f : {a.temperature_flag, a.top_k_flag})
      if (f != nullptr && f->count() > 0)
        throw ConfigError(f->get_name() + " needs --sampling seeded (greedy takes the argmax)");
    return s;
  }
  if (!std::isfinite(a.temperature) || a.temperature <= 0)
    throw ConfigError("--temperature " + fmt("%g", a.temperature) + ": must be finite and > 0");
  if (a.top_k < 0)
    throw ConfigError("--top-k " + std::to_string(a.top_k) + ": must be >= 0 (0: every token)");
  return s;
}

}  // namespace

GenerateConfig make_generate_config(const GenerateArgs& a, std::string& context_source) {
  ProblemOptions problem = a.problem;
  GenerateConfig c;
  c.weights = load_checkpoint_option(a.checkpoint, problem);  // sets problem.model
  if (const std::string why = why_invalid(problem, tsp::cost::Strategy::tsp(1), true); !why.empty())
    throw ConfigError(why);
  c.strategy = decode_strategy_named(a.strategy);
  if (c.strategy == nullptr)
    throw ConfigError("--strategy " + a.strategy + ": unknown (" + decode_strategy_names() + ")");
  if (a.ranks < 1 || a.ranks > kMaxRanks)
    throw ConfigError("--ranks " + std::to_string(a.ranks) + ": a world has 1 to " +
                      std::to_string(kMaxRanks) + " ranks");
  c.shape.model = problem.model;
  c.shape.ranks = a.ranks;
  if (a.interleave < 1)
    throw ConfigError("--interleave " + std::to_string(a.interleave) + ": must be >= 1");
  c.shape.interleave = a.interleave;
  context_source = "--max-context";
  c.shape.max_context = a.max_context;
  if (a.max_context < 0)
    throw ConfigError("--max-context " + std::to_string(a.max_context) + ": must be >= 1");
  if (a.max_context == 0 && !a.checkpoint.weights.empty()) {
    c.shape.max_context = checkpoint_context(a.checkpoint.weights);
    context_source = "max_position_embeddings of --weights " + a.checkpoint.weights;
  }
  if (c.shape.max_context == 0) {
    c.shape.max_context = kDefaultContext;
    context_source = "the default; --max-context";
  }
  const bool text = a.prompt_flag != nullptr && a.prompt_flag->count() > 0;
  std::vector<std::int64_t> lengths;
  if (text) {
    c.prompts = byte_prompt(a, problem.model.vocab);
    for (const auto& p : c.prompts) lengths.push_back(std::ssize(p));
  } else {
    lengths = prompt_lengths(a.prompt_lengths);
  }
  c.shape.batch = static_cast<int>(lengths.size());
  if (const std::string why = c.strategy->why_invalid(c.shape); !why.empty())
    throw ConfigError("--strategy " + a.strategy + " --ranks " + std::to_string(a.ranks) + ": " +
                      why);
  const std::string prompt_flag =
      text ? "--prompt" : "--prompt-lengths " + sanitized(a.prompt_lengths);
  if (a.new_tokens < 1)
    throw ConfigError("--new-tokens " + std::to_string(a.new_tokens) + ": must be >= 1");
  const std::string context =
      std::to_string(c.shape.max_context) + " positions (" + context_source + ")";
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] > c.shape.max_context)
      throw ConfigError(prompt_flag + ": the prompt of sequence " + std::to_string(b) + " has " +
                        std::to_string(lengths[b]) +
                        " tokens, longer than the model's context of " + context);
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] + a.new_tokens > c.shape.max_context)
      throw ConfigError("--new-tokens " + std::to_string(a.new_tokens) + ": sequence " +
                        std::to_string(b) + " would hold " + std::to_string(lengths[b]) + " + " +
                        std::to_string(a.new_tokens) + " tokens, beyond the model's context of " +
                        context);
  if (!text) c.prompts = seeded_prompts(lengths, problem.model.vocab, problem.seed);
  c.new_tokens = a.new_tokens;
  c.sampling = sampling_options(a);
  c.check = a.check;
  c.pin = a.problem.pin;
  c.trace_path = a.trace_path;
  if (!c.weights)  // seeded in double, rounded to float, as `run` makes them (initial_weights)
    c.weights = std::make_shared<const ref::ModelWeights<float>>(
        ref::convert_weights<float>(ref::init_weights<double>(problem.model, problem.seed)));
  return c;
}

namespace {

std::string sampling_text(const SamplingOptions& s) {
  if (s.greedy) return "greedy";
  return fmt("seeded (seed %llu, temperature %g, top-k %d)",
             static_cast<unsigned long long>(s.seed), s.temperature, s.top_k);
}

std::string lengths_text(const Prompts& prompts) {
  std::vector<std::int32_t> n;
  for (const auto& p : prompts) n.push_back(static_cast<std::int32_t>(p.size()));
  return join(n, n.size(), ",");
}

std::string divergence_text(const Divergence& d) {
  return fmt(
      "step %d seq %d: %s picked %d, oracle %d; oracle top-1 %.6g top-2 %.6g, margin %.3g "
      "%s 2e = %.3g: %s",
      d.step, d.seq, d.who.c_str(), d.token, d.oracle_token, d.oracle_top1, d.oracle_top2, d.margin,
      d.near_tie ? "<=" : ">", 2 * d.bound,
      d.near_tie ? "near-tie" : "FAIL (not explained by rounding)");
}

void print_check(std::ostream& out, const GenerateConfig& c, const GenerateResult& r) {
  out << "\ncheck, teacher-forced on the run's tokens: each step's logits against the fp64 oracle "
         "(rule: err(run) <= "
      << fmt("%g", c.k) << " * err(reference fp32) + tiny"
      << (c.strategy == &decode_strategies().front() ? "; the reference is its own fp32 reference"
                                                     : "")
      << "), every pick against the oracle's\n";
  const check::TensorResult* worst = nullptr;
  for (const check::TensorResult& t : r.step_logits)
    if (worst == nullptr || !(t.ratio <= worst->ratio)) worst = &t;
  if (worst != nullptr)
    out << fmt("  logits: %s over %zu steps; worst %s: err %.3g, bound %.3g (ratio %.3f)\n",
               r.numerics_ok ? "within the rule" : "OUTSIDE the rule", r.step_logits.size(),
               worst->name.c_str(), worst->verdict.candidate.max_abs, worst->verdict.bound,
               worst->ratio);
  if (c.strategy != &decode_strategies().front())
    out << "  tokens equal to the reference decoder's: "
        << (r.tokens_match_reference ? "yes" : "no") << "\n";
  if (r.divergences.empty()) out << "  tokens: every pick equals the oracle's\n";
  for (const Divergence& d : r.divergences) out << "  " << divergence_text(d) << "\n";
}

void print_generate(std::ostream& out, const GenerateArgs& a, const GenerateConfig& c,
                    const std::string& context_source, const GenerateResult& r) {
  const int B = c.shape.batch;
  out << fmt("tspemu generate: %s on %d rank%s, ", c.strategy->name.c_str(), c.shape.ranks,
             c.shape.ranks == 1 ? "" : "s")
      << generate_inputs_text(a, c, context_source) << "\n";
  out << fmt("time to first token (prefill of %d prompts): %.3f ms\n", B, r.ttft() * 1e3);
  if (!r.step_seconds.empty())
    out << fmt("time per output token (median of %zu decode steps, %d tokens each): %.3f ms\n",
               r.step_seconds.size(), B, r.tpot() * 1e3);
  out << fmt("tokens/s: %.0f (%d generated tokens in %.3f s, prefill included)\n\n",
             r.tokens_per_s(), B * c.new_tokens, r.seconds);
  out << "KV cache bytes per rank after the run, measured vs the closed form "
      << c.strategy->kv_formula << ":\n"
      << fmt("  %-6s %14s %14s  %s\n", "rank", "measured", "model", "match");
  for (std::size_t i = 0; i < r.kv_bytes.size(); ++i)
    out << fmt("  %-6zu %14llu %14llu  %s\n", i, static_cast<unsigned long long>(r.kv_bytes[i]),
               static_cast<unsigned long long>(r.kv_model[i]),
               r.kv_bytes[i] == r.kv_model[i] ? "yes" : "NO");
  if (c.shape.ranks > 1) {
    out << "bytes received per rank (measured): prefill, then per decode step\n";
    for (std::size_t i = 0; i < r.prefill_traffic.size(); ++i)
      out << fmt("  %-6zu %14llu %14.0f\n", i,
                 static_cast<unsigned long long>(r.prefill_traffic[i].total_received()),
                 r.step_seconds.empty()
                     ? 0.0
                     : static_cast<double>(r.decode_traffic[i].total_received()) /
                           static_cast<double>(r.step_seconds.size()));
  }
  if (!r.decode_model.empty() && !r.step_seconds.empty())
    out << "decode steps' calls and bytes per collective kind, every rank vs the strategy's "
           "closed form: "
        << (r.traffic_match ? "equal" : "DIFFERENT") << "\n";
  out << (static_cast<std::size_t>(c.new_tokens) > kTokensShown
              ? fmt("\ngenerated tokens (the first %zu of %d per sequence):\n", kTokensShown,
                    c.new_tokens)
              : fmt("\ngenerated tokens (%d per sequence):\n", c.new_tokens));
  for (int b = 0; b < B; ++b) {
    const auto& t = r.tokens[static_cast<std::size_t>(b)];
    out << fmt("  seq %d (prompt %zu): %s%s\n", b, c.prompts[static_cast<std::size_t>(b)].size(),
               join(t, kTokensShown, " ").c_str(), t.size() > kTokensShown ? " ..." : "");
    if (!a.prompt.empty()) {
      std::string bytes;
      for (const std::int32_t v : t) bytes += v < 256 ? static_cast<char>(v) : '?';
      out << "    as bytes: '" << sanitized(bytes, 256) << "'\n";
    }
  }
  if (r.checked) print_check(out, c, r);
  if (!c.trace_path.empty())
    out << fmt("\ntrace: %llu events written to %s (open in https://ui.perfetto.dev)%s\n",
               static_cast<unsigned long long>(r.trace_events), c.trace_path.c_str(),
               r.trace_dropped > 0 ? "; some events dropped" : "");
  out << "\nverdict: "
      << (r.pass()           ? (r.checked ? "PASS (KV cache bytes equal the closed form; every "
                                            "step within the rule; every pick the oracle's or a "
                                            "near-tie)"
                                          : "PASS (KV cache bytes equal the closed form; not "
                                            "checked: --no-check)")
          : !r.kv_match      ? "FAIL (KV cache bytes differ from the closed form)"
          : !r.traffic_match ? "FAIL (a decode step's traffic differs from the closed form)"
          : !r.numerics_ok   ? "FAIL (a step's logits are outside the rule)"
                             : "FAIL (a pick differs from the oracle's beyond its margin)")
      << "\n";
}

nlohmann::json generate_json(const GenerateArgs& a, const GenerateConfig& c,
                             const GenerateResult& r) {
  nlohmann::json j = document("generate");
  j["config"] = generate_inputs_json(a, c);
  j["config"]["strategy"] = c.strategy->name;
  j["config"]["ranks"] = c.shape.ranks;
  j["ttft_seconds"] = r.ttft();
  j["tpot_seconds"] = r.tpot();
  j["decode_step_seconds"] = r.step_seconds;
  j["seconds"] = r.seconds;
  j["tokens_per_s"] = r.tokens_per_s();
  j["kv_cache"] = {{"formula", c.strategy->kv_formula},
                   {"measured_bytes_per_rank", r.kv_bytes},
                   {"model_bytes_per_rank", r.kv_model},
                   {"match", r.kv_match}};
  j["decode_traffic_match"] =
      r.decode_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.traffic_match);
  for (std::size_t i = 0; i < r.prefill_traffic.size(); ++i)
    j["bytes_received_per_rank"].push_back(
        {{"prefill", r.prefill_traffic[i].total_received()},
         {"decode_total", r.decode_traffic[i].total_received()}});
  j["tokens"] = r.tokens;
  nlohmann::json check = {{"ran", r.checked}};
  if (r.checked) {
    check["k"] = c.k;
    check["numerics_ok"] = r.numerics_ok;
    check["max_err_ratio"] = r.max_err_ratio;
    check["tokens_match_reference"] = r.tokens_match_reference;
    check["divergences"] = nlohmann::json::array();
    for (const Divergence& d : r.divergences)
      check["divergences"].push_back({{"step", d.step},
                                      {"sequence", d.seq},
                                      {"who", d.who},
                                      {"token", d.token},
                                      {"oracle_token", d.oracle_token},
                                      {"oracle_top1", d.oracle_top1},
                                      {"oracle_top2", d.oracle_top2},
                                      {"margin", d.margin},
                                      {"bound", d.bound},
                                      {"near_tie", d.near_tie}});
  }
  j["check"] = check;
  if (!c.trace_path.empty())
    j["trace"] = {{"path", c.trace_path}, {"events", r.trace_events}, {"dropped", r.trace_dropped}};
  j["verdict"] = r.pass() ? "pass" : "fail";
  j["pass"] = r.pass();
  return j;
}

}  // namespace

std::string generate_inputs_text(const GenerateArgs& a, const GenerateConfig& c,
                                 const std::string& context_source) {
  const int B = c.shape.batch;
  return fmt(
      "%d prompt%s (lengths %s), %d new tokens each, %s\nmodel %s\nweights: %s\nblas: "
      "%s\nbf16 gemm: %s\ncontext: %lld positions (%s)\n",
      B, B == 1 ? "" : "s", lengths_text(c.prompts).c_str(), c.new_tokens,
      sampling_text(c.sampling).c_str(), c.shape.model.to_string().c_str(),
      a.checkpoint.weights.empty()
          ? fmt("seeded (--seed %llu)", static_cast<unsigned long long>(a.problem.seed)).c_str()
          : ("the checkpoint in " + a.checkpoint.weights).c_str(),
      ref::describe_blas().c_str(), ref::describe_bf16_gemm().c_str(),
      static_cast<long long>(c.shape.max_context), context_source.c_str());
}

nlohmann::json generate_inputs_json(const GenerateArgs& a, const GenerateConfig& c) {
  std::vector<std::size_t> lengths;
  for (const auto& p : c.prompts) lengths.push_back(p.size());
  return {{"batch", c.shape.batch},
          {"prompt_lengths", lengths},
          {"new_tokens", c.new_tokens},
          {"max_context", c.shape.max_context},
          {"interleave", c.shape.interleave},
          {"model", c.shape.model.to_string()},
          {"weights", a.checkpoint.weights.empty() ? nlohmann::json(nullptr)
                                                   : nlohmann::json(a.checkpoint.weights)},
          {"seed", a.problem.seed},
          {"sampling",
           {{"mode", c.sampling.greedy ? "greedy" : "seeded"},
            {"temperature", c.sampling.temperature},
            {"top_k", c.sampling.top_k}}}};
}

GenerateArgs::GenerateArgs()
    : strategy(generate_default().strategy), ranks(generate_default().ranks) {}

std::vector<const CLI::Option*> add_decode_options(CLI::App& cmd, GenerateArgs& a) {
  add_checkpoint_options(cmd, a.checkpoint);
  for (const char* unused : {"--save", "--save-shard-size"})  // decoding changes no weight
    cmd.remove_option(cmd.get_option(unused));
  std::vector<const CLI::Option*> added = {cmd.get_option("--weights")};
  auto* lengths = cmd.add_option("--prompt-lengths", a.prompt_lengths,
                                 "a batch of prompts of these lengths (comma-separated), tokens "
                                 "drawn from a stream seeded by --seed")
                      ->capture_default_str();
  a.prompt_flag = cmd.add_option("--prompt", a.prompt,
                                 "one prompt: this text's UTF-8 bytes as token ids (byte-level; "
                                 "the vocabulary must hold them, e.g. with --weights)")
                      ->excludes(lengths);
  added.insert(added.end(), {lengths, a.prompt_flag});
  added.push_back(cmd.add_option("--new-tokens,-N", a.new_tokens, "new tokens per sequence (>= 1)")
                      ->capture_default_str());
  added.push_back(cmd.add_option("--interleave", a.interleave,
                                 "generated tokens' K/V go to the ranks round-robin in blocks of I "
                                 "(a sharded cache; the reference keeps the whole cache)")
                      ->capture_default_str());
  added.push_back(cmd.add_option("--max-context", a.max_context,
                                 "positions a sequence may hold, prompt and new tokens (default: "
                                 "the checkpoint's max_position_embeddings, else 2048)"));
  added.push_back(cmd.add_option("--sampling", a.sampling,
                                 "greedy (argmax) or seeded (softmax of logits / --temperature "
                                 "over the --top-k largest, one random stream seeded by --seed)")
                      ->capture_default_str()
                      ->check(CLI::IsMember({"greedy", "seeded"})));
  a.temperature_flag =
      cmd.add_option("--temperature", a.temperature, "seeded sampling: temperature (> 0)")
          ->capture_default_str();
  a.top_k_flag = cmd.add_option("--top-k", a.top_k,
                                "seeded sampling: the k largest logits only (0: every token)")
                     ->capture_default_str();
  added.insert(added.end(), {a.temperature_flag, a.top_k_flag});
  return added;
}

CLI::App* add_generate_command(CLI::App& app, GenerateArgs& a) {
  auto* cmd = app.add_subcommand(
      "generate",
      "prefill a batch of prompts and decode new tokens with one decode strategy, checked token by "
      "token against the reference decoder and the fp64 oracle: time to first token, time per "
      "output token, tokens/s, KV cache bytes per rank vs the closed form (the default: " +
          std::string(generate_default().strategy) + " on " +
          std::to_string(generate_default().ranks) +
          " rank(s), 3 prompts of 7, 13 and 5 tokens, 32 new tokens each, greedy)");
  std::string help;
  std::vector<std::string> names;
  for (const DecodeStrategy& s : decode_strategies()) {
    help += (help.empty() ? "" : "\n") + s.name + ": " + s.description;
    names.push_back(s.name);
  }
  cmd->add_option("--strategy", a.strategy, help)
      ->capture_default_str()
      ->check(CLI::IsMember(names));
  cmd->add_option("--ranks,-D", a.ranks, "ranks D the strategy runs on")->capture_default_str();
  add_problem_options(*cmd, a.problem);
  // The training step's size and layout flags do not apply to decoding.
  for (const char* unused :
       {"--batch", "--seq", "--layout", "--head-buckets", "--serial-attention"})
    cmd->remove_option(cmd->get_option(unused));
  add_decode_options(*cmd, a);
  cmd->add_flag("--check,!--no-check", a.check,
                "check against the reference decoder and the fp64 oracle (default on)");
  cmd->add_flag("--quiet,-q", a.quiet, "no progress bar");
  cmd->add_option("--json", a.json_path, "also write the report as JSON to this file");
  cmd->add_option("--trace", a.trace_path,
                  "write every rank's events, the prefill and each decode step as spans, as "
                  "Chrome trace JSON to this file (open it in https://ui.perfetto.dev)");
  return cmd;
}

int generate_command(const GenerateArgs& a, std::ostream& out) {
  check_output_files({{"--json", a.json_path}, {"--trace", a.trace_path}});
  std::string context_source;
  GenerateConfig c = make_generate_config(a, context_source);
  GenerateResult r;
  {
    ProgressBar bar("generate " + c.strategy->name, generate_steps(c), !a.quiet);
    c.on_step = [&bar] { bar.step(); };
    r = run_generate(c);
  }
  print_generate(out, a, c, context_source, r);
  if (!a.json_path.empty()) write_json(a.json_path, generate_json(a, c, r));
  return r.pass() ? 0 : 1;
}

}  // namespace tspemu::app
