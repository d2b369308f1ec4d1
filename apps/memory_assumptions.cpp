#include "memory_assumptions.hpp"

#include <CLI/CLI.hpp>

#include <cmath>

#include "plan_command.hpp"
#include "problem_options.hpp"
#include "stack_report.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

const char* recompute_name(cost::Recompute r) {
  switch (r) {
    case cost::Recompute::none:
      return "none";
    case cost::Recompute::selective:
      return "selective";
    case cost::Recompute::full:
      return "full";
  }
  return "?";
}

cost::MemoryAssumptions assumption_bundle(const std::string& name) {
  cost::MemoryAssumptions m;
  if (name == "default") return m;
  if (name == "megatron-mi300x") {
    m.precision = cost::PrecisionModel::megatron_bf16();
    m.logit_gradient_in_place = true;
    return m;
  }
  if (name == "emulator") {
    m.precision = cost::PrecisionModel::fp32_emulator();
    m.recompute = cost::Recompute::none;
    return m;
  }
  throw ConfigError("--assume " + name + ": unknown (default, megatron-mi300x, emulator)");
}

double unit_bytes(const std::string& units) {
  if (units == "GB") return 1e9;
  if (units == "GiB") return 1073741824.0;
  throw ConfigError("--units " + units + ": GB or GiB");
}

void add_assumption_options(CLI::App& cmd, AssumptionArgs& a) {
  cmd.add_option("--assume", a.assume,
                 "memory assumptions: default (bf16 + fp32 Adam, 16 B/param), megatron-mi300x "
                 "(18 B/param, fp32 main grads, in-place logit gradient) or emulator (tspemu's "
                 "fp32 run, no recompute); the flags below override single fields")
      ->capture_default_str();
  cmd.add_option("--weight-bytes", a.weight_bytes, "bytes per parameter: weights (default 2)");
  cmd.add_option("--grad-bytes", a.grad_bytes, "bytes per parameter: gradients (default 2)");
  cmd.add_option("--master-bytes", a.master_bytes,
                 "bytes per parameter: master copy (default 4, fp32)");
  cmd.add_option("--moment-bytes", a.moment_bytes,
                 "bytes per parameter: optimizer moments (default 8, Adam m and v in fp32)");
  cmd.add_option("--activation-bytes", a.activation_bytes,
                 "bytes per activation element (default 2)");
  cmd.add_option("--recompute", a.recompute,
                 "activations kept: full (default: layer inputs, each layer re-run in backward), "
                 "selective (Korthikanti et al.: recompute the attention core) or none")
      ->check(CLI::IsMember({"full", "selective", "none"}));
  cmd.add_option("--attention", a.attention,
                 "flash (default: no S x S softmax kept) or materialized (the softmax kept per "
                 "head)")
      ->check(CLI::IsMember({"flash", "materialized"}));
  cmd.add_option("--logit-bytes", a.logit_bytes, "bytes per logit element (default 4, fp32)");
  cmd.add_option("--logits-in-place", a.logits_in_place,
                 "true: the logits' gradient overwrites them (default false: a second buffer)");
  cmd.add_option("--logit-chunk", a.logit_chunk,
                 "tokens whose logits exist at once (default 0: all of them)");
  cmd.add_option("--tsp-vocab", a.tsp_vocab,
                 "sharded (default: TSP splits the embedding and LM head over D) or replicated")
      ->check(CLI::IsMember({"sharded", "replicated"}));
  cmd.add_option("--framework-overhead", a.framework_overhead,
                 "bytes per device for the GPU context, collective buffers and allocator reserve, "
                 "e.g. 3GiB (default 0, shown apart)");
  cmd.add_option("--units", a.units, "table units: GB (1e9) or GiB (2^30)")
      ->capture_default_str()
      ->check(CLI::IsMember({"GB", "GiB"}));
}

cost::MemoryAssumptions memory_assumptions(const AssumptionArgs& a) {
  cost::MemoryAssumptions m = assumption_bundle(a.assume);
  auto bytes = [](const std::optional<double>& v, double& field, const char* flag) {
    if (!v) return;
    if (!(*v >= 0) || !std::isfinite(*v) || *v > 64)
      throw ConfigError(std::string(flag) + " " + fmt("%g", *v) + ": must be between 0 and 64");
    field = *v;
  };
  bytes(a.weight_bytes, m.precision.weight, "--weight-bytes");
  bytes(a.grad_bytes, m.precision.gradient, "--grad-bytes");
  bytes(a.master_bytes, m.precision.master, "--master-bytes");
  bytes(a.moment_bytes, m.precision.moments, "--moment-bytes");
  bytes(a.activation_bytes, m.precision.activation, "--activation-bytes");
  bytes(a.logit_bytes, m.logit_bytes, "--logit-bytes");
  if (a.recompute)
    m.recompute = *a.recompute == "none"        ? cost::Recompute::none
                  : *a.recompute == "selective" ? cost::Recompute::selective
                                                : cost::Recompute::full;
  if (a.attention) m.materialized_attention = *a.attention == "materialized";
  if (a.logits_in_place) m.logit_gradient_in_place = *a.logits_in_place;
  if (a.logit_chunk) {
    if (*a.logit_chunk < 0 || *a.logit_chunk > kMaxCount)
      throw ConfigError("--logit-chunk " + std::to_string(*a.logit_chunk) +
                        ": must be between 0 and " + std::to_string(kMaxCount));
    m.logit_chunk_tokens = *a.logit_chunk;
  }
  if (a.tsp_vocab) m.tsp_shards_vocab = *a.tsp_vocab == "sharded";
  if (a.framework_overhead)
    m.framework_overhead = *a.framework_overhead == "0"
                               ? 0.0
                               : parse_bytes("--framework-overhead", *a.framework_overhead);
  return m;
}

std::vector<std::string> describe(const cost::MemoryAssumptions& m) {
  const cost::PrecisionModel& p = m.precision;
  std::vector<std::string> v;
  v.push_back(
      fmt("model states: %g B/param = weights %g + gradients %g + master copy %g + "
          "optimizer moments %g (16 = bf16 mixed precision with fp32 Adam, ZeRO §3.1 and "
          "TSP-NOTES.md; 18 = Megatron-LM's fp32 main gradients); no ZeRO sharding",
          p.per_param(), p.weight, p.gradient, p.master, p.moments));
  v.push_back(fmt("activations: %g B per element; %s recompute (%s); %s attention", p.activation,
                  recompute_name(m.recompute),
                  m.recompute == cost::Recompute::full
                      ? "each layer's input kept, one layer's whole set while it is re-run"
                  : m.recompute == cost::Recompute::selective
                      ? "Korthikanti et al. 2022 §5: every activation but the attention softmax"
                      : "every activation of every layer kept",
                  m.materialized_attention ? "materialized (S x S softmax per head kept)"
                                           : "flash-style (no S x S tensor kept)"));
  v.push_back(
      "kept per token per layer (Korthikanti et al. 2022, adapted to RMSNorm, GQA, no dropout, "
      "gated MLP): layer input, attention-norm output, Q, K, V, attention output, lse, MLP "
      "input, MLP-norm output, gate, up, silu(gate)*up, two rstd; the norm region is replicated "
      "over TP without sequence parallelism");
  v.push_back(
      fmt("logits: %g B per element, gradient %s, %s; counted live at the layers' "
          "peak (an upper bound)",
          m.logit_bytes, m.logit_gradient_in_place ? "in place" : "a second buffer",
          m.logit_chunk_tokens > 0
              ? fmt("chunks of %lld tokens", static_cast<long long>(m.logit_chunk_tokens)).c_str()
              : "not chunked"));
  v.push_back(
      std::string("embedding and LM head: split over T by TP, Megatron-SP and TP+SP "
                  "(vocab-parallel), replicated by SP; TSP: ") +
      (m.tsp_shards_vocab ? "split over D, one head shard's logits at a time" : "replicated"));
  v.push_back(
      fmt("framework overhead (context, collective buffers, allocator reserve): %.2f GB "
          "per device%s",
          m.framework_overhead / 1e9, m.framework_overhead == 0 ? " (off)" : ""));
  return v;
}

}  // namespace tspemu::app
