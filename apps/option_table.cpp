#include "option_table.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "problem_options.hpp"
#include "quantity.hpp"
#include "tspemu/core/sanitized.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::app {

namespace {

using K = OptionKind;

// The commands that share the problem flags (problem_options.hpp), and their strategy flags.
constexpr std::string_view kStack = "run compare scale train";
// The model flags, shared with generate (which drops the training step's size and layout).
constexpr std::string_view kModel = "run compare scale train generate";
constexpr std::string_view kDegree = "run compare train generate";  // compare: --ranks only
constexpr std::string_view kSim = "run compare";
constexpr std::string_view kCheckpoint = "run train";
constexpr std::string_view kDecode = "generate compare";  // compare --inference
constexpr std::string_view kAssume = "plan paper";
constexpr std::string_view kAll = "run compare scale train plan paper selfcheck generate";

constexpr double kRanks = kMaxRanks;
constexpr double kPlanCount = static_cast<double>(kMaxCount);  // 2^40, exact in a double
constexpr double kInt = 2147483647.0;
// The problem flags' bounds keep every int field and the products the runs form well inside
// 64 bits; whether a size fits in memory is the memory pre-check's (run_memory.hpp). 2^24 rows of
// the default h = 256 fill one rank's 16 GiB arena with the embedding alone.
constexpr double kMaxVocab = 16777216.0;

const std::vector<OptionRule> kRules = {
    // The problem (run, compare, scale, train).
    {kModel, "--layers", K::integer, 1, 1048576, false, false, "", "layers L"},
    {kModel, "--hidden", K::integer, 1, 65536, false, false, "", "hidden size h"},
    {kModel, "--heads", K::integer, 1, 65536, false, false, "", "query heads"},
    {kModel, "--kv-heads", K::integer, 1, 65536, false, false, "", "key/value heads"},
    {kModel, "--ffn", K::integer, 1, 1048576, false, false, "", "gated-MLP width"},
    {kModel, "--vocab", K::integer, 1, kMaxVocab, false, false, "", "vocabulary",
     "2^24 rows of the default h = 256 fill a rank's 16 GiB arena with the embedding alone"},
    {kStack, "--batch", K::integer, 1, 65536, false, false, "", "micro-batch B"},
    {kStack, "--seq", K::integer, 1, 16777216, false, false, "", "sequence length S"},
    {kModel, "--seed", K::seed, 0, 0, false, false, "", "weights and inputs seed"},
    {kStack, "--layout", K::text, 0, 0, false, false, "", "TSP sequence layout"},
    {kStack, "--head-buckets", K::integer, 1, 65536, false, false, "",
     "TSP K/V all-gathers per shard"},
    {"run scale train generate", "--strategy", K::text, 0, 0, false, false, "", "strategy name"},
    {"run compare scale train generate", "--precision", K::text, 0, 0, false, false, "",
     "fp32 or bf16"},
    {kStack, "--grad-reduce", K::text, 0, 0, false, false, "", "gradient type: fp32 or bf16"},
    {kDegree, "--ranks", K::integer, 1, kRanks, false, false, "", "ranks",
     "a world has 1 to 256 ranks"},
    {"run train", "--tp", K::integer, 1, kRanks, false, false, "", "tp-sp: tensor-parallel degree"},
    {"run train", "--sp", K::integer, 1, kRanks, false, false, "",
     "tp-sp: sequence-parallel degree"},
    {"scale", "--max-ranks", K::integer, 1, kRanks, false, false, "", "largest degree"},
    {"scale", "--mode", K::text, 0, 0, false, false, "", "strong, weak or both"},
    {"scale", "--repeat", K::integer, 1, 1000, false, false, "", "timed runs per point"},
    // Checkpoints (run, train): an empty path would silently run without weights or not save.
    {"run train generate compare", "--weights", K::text, 0, 0, false, false, "",
     "checkpoint directory to read"},
    {kCheckpoint, "--save", K::text, 0, 0, false, false, "", "checkpoint directory to write"},
    {kCheckpoint, "--save-shard-size", K::size, 0, kPlanCount, false, false, "bytes",
     "shard size of --save (0: one file)"},
    // The simulated clock (run, compare); the defaults (-1, 0) mean "the preset's".
    {kSim, "--sim-clock", K::text, 0, 0, false, false, "", "cluster model preset"},
    {kSim, "--peak", K::real, 0, 1e6, true, false, "TFLOP/s", "peak dense FLOP/s per device"},
    {kSim, "--mfu", K::real, 0, 1, true, false, "", "fraction of peak compute reaches"},
    {kSim, "--gpus-per-node", K::integer, 0, 1024, false, false, "", "devices per node (0: one)"},
    {kSim, "--intra-alpha-us", K::real, 0, 1e6, false, false, "us", "intra-node latency"},
    {kSim, "--intra-beta-gbs", K::real, 1e-3, 1e6, false, false, "GB/s", "intra-node bandwidth"},
    {kSim, "--inter-alpha-us", K::real, 0, 1e6, false, false, "us", "inter-node latency"},
    {kSim, "--inter-beta-gbs", K::real, 1e-3, 1e6, false, false, "GB/s", "inter-node bandwidth"},
    {"compare", "--nodes", K::integer, 1, kRanks, false, false, "", "nodes the ranks spread over"},
    // run: injection; --inject-delay-us is also bounded by a quarter of the hang timeout.
    {"run", "--inject-seed", K::seed, 0, 0, false, false, "", "injection seed"},
    {"run", "--inject-delay-us", K::integer, 0, kInt, false, false, "us", "longest injected delay"},
    {"run", "--inject-probability", K::real, 0, 1, false, false, "", "chance of a delay"},
    {"run", "--inject-failure-rank", K::integer, -1, kRanks - 1, false, false, "",
     "rank that throws (-1: none)"},
    {"run generate", "--trace", K::text, 0, 0, false, false, "", "Chrome trace file"},
    // train.
    {"train", "--steps", K::integer, 1, 1000000, false, false, "", "optimizer steps"},
    {"train", "--optimizer", K::text, 0, 0, false, false, "", "adamw or sgd"},
    {"train", "--lr", K::real, 0, 100, true, false, "", "learning rate"},
    {"train", "--beta1", K::real, 0, 1, false, true, "", "AdamW beta1"},
    {"train", "--beta2", K::real, 0, 1, false, true, "", "AdamW beta2"},
    {"train", "--eps", K::real, 0, 1, true, false, "", "AdamW eps"},
    {"train", "--weight-decay", K::real, 0, 100, false, false, "", "decoupled weight decay"},
    {"train", "--data", K::text, 0, 0, false, false, "", "corpus file"},
    {"train", "--pp", K::integer, 0, kRanks, false, false, "", "pipeline ranks (0: off)"},
    {"train", "--microbatches", K::integer, 1, 1048576, false, false, "",
     "--pp: microbatches per step"},
    {"train", "--schedule", K::text, 0, 0, false, false, "", "--pp: pipeline schedule"},
    {"train", "--virtual-stages", K::integer, 0, 64, false, false, "",
     "--pp: stages per rank (0: by schedule)"},
    // plan: int64 overrides of the preset, sizes with units.
    {"plan", "--preset", K::text, 0, 0, false, false, "", "model preset"},
    {"plan", "--layers", K::integer, 1, kPlanCount, false, false, "", "layers"},
    {"plan", "--hidden", K::integer, 1, kPlanCount, false, false, "", "hidden size"},
    {"plan", "--heads", K::integer, 1, kPlanCount, false, false, "", "query heads"},
    {"plan", "--kv-heads", K::integer, 1, kPlanCount, false, false, "", "key/value heads"},
    {"plan", "--ffn", K::integer, 1, kPlanCount, false, false, "", "gated-MLP width"},
    {"plan", "--vocab", K::integer, 1, kPlanCount, false, false, "", "vocabulary"},
    {"plan", "--devices", K::integer, 1, 4096, false, false, "", "devices N"},
    {"plan", "--total-devices", K::integer, 1, 1048576, false, false, "", "GPUs in all"},
    {"plan", "--device-mem", K::bytes, 1e6, 1e18, false, false, "bytes", "memory per device"},
    {"plan", "--seq", K::count, 1, kPlanCount, false, false, "", "sequence length"},
    {"plan", "--batch", K::integer, 1, kPlanCount, false, false, "", "micro-batch B"},
    {"plan", "--sweep", K::text, 0, 0, false, false, "", "sequence lengths"},
    {"plan", "--device", K::text, 0, 0, false, false, "", "time model's device"},
    {"plan", "--mfu", K::real, 0, 1, true, false, "", "fraction of peak FLOP/s"},
    {"plan", "--element-bytes", K::integer, 1, 4, false, false, "bytes",
     "--inference: bytes per weight and KV element"},
    {"plan", "--pp", K::integer, 1, 4096, false, false, "", "pipeline ranks P"},
    {"plan", "--microbatches", K::integer, 1, 1048576, false, false, "",
     "--pp: microbatches per step"},
    {"plan", "--schedule", K::text, 0, 0, false, false, "", "--pp: pipeline schedule"},
    {"plan", "--virtual-stages", K::integer, 1, 64, false, false, "", "--pp: stages per rank"},
    // generate and compare --inference: prompts, decoding, sampling. A sequence holds at most
    // --max-context positions,
    // bounded as --seq is.
    {kDecode, "--prompt-lengths", K::text, 0, 0, false, false, "", "prompt lengths"},
    {kDecode, "--prompt", K::text, 0, 0, false, false, "", "byte-level prompt"},
    {kDecode, "--new-tokens", K::integer, 1, 16777216, false, false, "", "new tokens"},
    {kDecode, "--interleave", K::integer, 1, 16777216, false, false, "tokens",
     "K/V round-robin block"},
    {kDecode, "--max-context", K::integer, 0, 16777216, false, false, "",
     "positions per sequence (0: the checkpoint's, else 2048)"},
    {kDecode, "--sampling", K::text, 0, 0, false, false, "", "greedy or seeded"},
    {kDecode, "--temperature", K::real, 0, 1e6, true, false, "", "sampling temperature"},
    {kDecode, "--top-k", K::integer, 0, kInt, false, false, "", "top-k (0: every token)"},
    // Memory assumptions (plan, paper).
    {kAssume, "--assume", K::text, 0, 0, false, false, "", "assumption bundle"},
    {kAssume, "--weight-bytes", K::real, 0, 64, false, false, "bytes", "per parameter: weights"},
    {kAssume, "--grad-bytes", K::real, 0, 64, false, false, "bytes", "per parameter: gradients"},
    {kAssume, "--master-bytes", K::real, 0, 64, false, false, "bytes",
     "per parameter: master copy"},
    {kAssume, "--moment-bytes", K::real, 0, 64, false, false, "bytes", "per parameter: moments"},
    {kAssume, "--activation-bytes", K::real, 0, 64, false, false, "bytes",
     "per activation element"},
    {kAssume, "--recompute", K::text, 0, 0, false, false, "", "full, selective or none"},
    {kAssume, "--attention", K::text, 0, 0, false, false, "", "flash or materialized"},
    {kAssume, "--logit-bytes", K::real, 0, 64, false, false, "bytes", "per logit element"},
    {kAssume, "--logits-in-place", K::boolean, 0, 0, false, false, "", "logit gradient in place"},
    {kAssume, "--logit-chunk", K::integer, 0, kPlanCount, false, false, "tokens", "logit chunk"},
    {kAssume, "--tsp-vocab", K::text, 0, 0, false, false, "", "sharded or replicated"},
    {kAssume, "--framework-overhead", K::bytes, 0, 1e18, false, false, "bytes", "per device"},
    {kAssume, "--units", K::text, 0, 0, false, false, "", "GB or GiB"},
    {"paper", "--out", K::text, 0, 0, false, false, "", "output directory"},
    // selfcheck: all_gather's output is --count x --ranks floats per rank: at 256 ranks, 2^24
    // fill the 16 GiB arena.
    {"selfcheck", "--ranks", K::integer, 1, kRanks, false, false, "", "ranks (threads)"},
    {"selfcheck", "--count", K::integer, 1, 16777216, false, false, "floats", "elements per rank",
     "all_gather's output at 256 ranks fills the 16 GiB arena"},
    {"selfcheck", "--iterations", K::integer, 1, 1000000, false, false, "", "timed calls"},
    // Output files, and --config itself (expanded before parsing, config_file.hpp).
    {"run compare scale train plan paper generate", "--json", K::text, 0, 0, false, false, "",
     "JSON output"},
    {"scale train plan", "--svg", K::text, 0, 0, false, false, "", "SVG chart"},
    {kAll, "--config", K::text, 0, 0, false, false, "", "JSON options file"},
};

bool lists(std::string_view commands, std::string_view command) {
  std::size_t at = 0;
  while (at < commands.size()) {
    const std::size_t end = std::min(commands.find(' ', at), commands.size());
    if (commands.substr(at, end - at) == command) return true;
    at = end + 1;
  }
  return false;
}

// A bound as people write it: whole numbers in full up to 2^53, others in %g.
std::string number(double v) {
  if (std::fabs(v) < 9007199254740992.0 && v == std::floor(v))
    return std::to_string(static_cast<long long>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string shown(const std::string& text) {
  return text.empty() ? "''" : sanitized(text, 64);
}

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// The whole of s as a decimal integer (an optional sign, digits), or false.
template <typename T>
bool whole_integer(const std::string& s, T& v) {
  const char* begin = s.data() + (s.size() > 1 && s[0] == '+' ? 1 : 0);
  const auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && begin != end;
}

// The whole of s as a number (strtod's syntax, which also reads nan and inf), or false.
bool whole_number(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// A number with an optional byte unit, as --save-shard-size takes it.
bool size_value(const std::string& s, double& v) {
  std::size_t split = s.size();
  while (split > 0 && std::isalpha(static_cast<unsigned char>(s[split - 1]))) --split;
  if (!whole_number(s.substr(0, split), v)) return false;
  std::string unit = s.substr(split);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::pair<const char*, double> units[] = {{"", 1},
                                                         {"b", 1},
                                                         {"kb", 1e3},
                                                         {"mb", 1e6},
                                                         {"gb", 1e9},
                                                         {"tb", 1e12},
                                                         {"kib", 1024.0},
                                                         {"mib", 1048576.0},
                                                         {"gib", 1073741824.0},
                                                         {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      v *= scale;
      return true;
    }
  return false;
}

// The side of the range v breaks, then the whole range; "" inside it.
std::string range_error(const OptionRule& r, const std::string& text, double v) {
  const std::string head = r.flag.data() + std::string(" ") + shown(text) + ": must be ";
  const std::string whole =
      " (" + describe_range(r) + (r.why.empty() ? "" : "; " + std::string(r.why)) + ")";
  if (!std::isfinite(v)) return head + "finite" + whole;
  if (r.min_open ? !(v > r.min) : !(v >= r.min))
    return head + (r.min_open ? "> " : ">= ") + number(r.min) + whole;
  if (r.max_open ? !(v < r.max) : !(v <= r.max))
    return head + (r.max_open ? "< " : "at most ") + number(r.max) + whole;
  return "";
}

}  // namespace

const std::vector<OptionRule>& option_rules() {
  return kRules;
}

const OptionRule* option_rule(std::string_view command, std::string_view flag) {
  for (const OptionRule& r : kRules)
    if (r.flag == flag && lists(r.commands, command)) return &r;
  return nullptr;
}

std::string describe_range(const OptionRule& r) {
  const std::string units = r.units.empty() ? "" : " " + std::string(r.units);
  const std::string closed = "[" + number(r.min) + ", " + number(r.max) + "]" + units;
  switch (r.kind) {
    case K::integer:
      return "an integer in " + closed;
    case K::seed:
      return "an integer in [0, 18446744073709551615]";
    case K::real:
      return "a finite number in " + std::string(r.min_open ? "(" : "[") + number(r.min) + ", " +
             number(r.max) + (r.max_open ? ")" : "]") + units;
    case K::size:
      return "a size in " + closed + ", e.g. 20kB, 2GB, 1GiB";
    case K::bytes:
      return "a size with a unit in " + closed + ", e.g. 80GB, 96GiB";
    case K::count:
      return "a count in [1, " + number(r.max) + "], K = 1024, M = 1024^2";
    case K::boolean:
      return "true or false";
    case K::text:
      return "a non-empty text";
  }
  return "";
}

std::string option_error(const OptionRule& r, const std::string& given, std::string* normalized) {
  const std::string text = trimmed(given);
  const std::string flag(r.flag);
  // Not const: returned by move.
  std::string kind_error = flag + " " + shown(given) + ": must be " + describe_range(r);
  switch (r.kind) {
    case K::integer: {
      long long v = 0;
      if (!whole_integer(text, v)) {
        double d = 0;  // a number that is no integer: say which bound, if any, it also breaks
        if (whole_number(text, d))
          if (std::string e = range_error(r, given, d); !e.empty()) return e;
        return kind_error;
      }
      return range_error(r, given, static_cast<double>(v));
    }
    case K::seed: {
      unsigned long long v = 0;
      if (!text.empty() && text[0] == '-')  // CLI11 would wrap it to 2^64 - 1 and over
        return flag + " " + shown(given) + ": must be a non-negative integer (" +
               describe_range(r) + ")";
      return whole_integer(text, v) ? "" : kind_error;
    }
    case K::real: {
      double v = 0;
      if (!whole_number(text, v)) return kind_error;
      return range_error(r, given, v);
    }
    case K::size: {
      double v = 0;
      if (!size_value(text, v)) return kind_error;
      if (std::string e = range_error(r, given, v); !e.empty()) return e;
      if (v != std::floor(v)) return flag + " " + shown(given) + ": must be whole bytes";
      if (normalized != nullptr) *normalized = std::to_string(static_cast<std::uint64_t>(v));
      return "";
    }
    case K::bytes: {
      if (r.min == 0 && text == "0") return "";
      try {
        return range_error(r, given, parse_bytes(flag, text));
      } catch (const ConfigError& e) {
        return e.what();
      }
    }
    case K::count:
      try {
        parse_count(flag, text);
        return "";
      } catch (const ConfigError& e) {
        return e.what();
      }
    case K::boolean:
      return text == "true" || text == "false" ? "" : kind_error;
    case K::text:
      return text.empty() ? flag + " '': must not be empty (" + std::string(r.what) + ")" : "";
  }
  return "";
}

bool json_needs_number(const OptionRule& r) {
  return r.kind == K::integer || r.kind == K::seed || r.kind == K::real;
}

std::vector<std::string> apply_option_table(CLI::App& app) {
  std::vector<std::string> missing;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (CLI::Option* opt : sub->get_options()) {
      if (opt->get_items_expected_max() == 0 || opt->get_lnames().empty()) continue;  // flags
      const std::string flag = "--" + opt->get_lnames().front();
      const OptionRule* rule = option_rule(sub->get_name(), flag);
      if (rule == nullptr) {
        missing.push_back(sub->get_name() + " " + flag);
        continue;
      }
      // transform: first in the validators' order, and free to replace a size by its bytes.
      opt->transform(CLI::Validator(
          [rule](std::string& text) -> std::string {
            std::string normalized;
            if (std::string e = option_error(*rule, text, &normalized); !e.empty())
              throw ConfigError(e);
            if (rule->kind == K::size) text = normalized;
            return "";
          },
          ""));
    }
  }
  return missing;
}

}  // namespace tspemu::app
