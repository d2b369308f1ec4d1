// `tspemu plan`: the analytic cost model (plan/cost_model.hpp) at real sizes, no ranks run. For a
// preset model (the paper's 7B-class, Llama 2/3) or flags, on --devices N of --device-mem each:
// per strategy (TSP D=N, TP, Megatron-SP, SP, every TP+SP factorization) memory per device by
// category, whether it fits, bytes per layer (ring convention), and the TSP/TP forward-volume
// ratio; --sweep seq=16K..128K repeats the table per sequence length and draws an SVG (memory and
// communication vs S, with the device-capacity line). --dry-run adds, per length, one layer of each
// strategy's real blocks run dry (tsp/layer_measure.hpp: accounting-only arenas, no arithmetic):
// per-rank peak memory by category and bytes per collective measured from the schedule code, next
// to the closed-form traffic, with the time each took and the process's max RSS. --inference
// reports the inference schedules' decode costs instead (plan_inference.hpp); --pp a pipeline
// schedule's bubble and activation memory (plan_pipeline.hpp).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cli_fwd.hpp"
#include "memory_assumptions.hpp"
#include "quantity.hpp"
#include "tspemu/plan/cost_model.hpp"

namespace tspemu::app {

struct PlanArgs {
  std::string preset = "paper-7b";
  // Overrides of the preset's shape (absent: the preset's value; given: >= 1).
  std::optional<std::int64_t> layers, hidden, heads, kv_heads, ffn, vocab;
  int devices = 8;
  std::string device_mem = "80GB";
  std::string seq = "128K";
  std::int64_t batch = 1;
  std::string sweep;  // "seq=16K..128K" (doubling), "seq=16K,48K" or "seq=16K..128K:4" (4 steps)
  std::string svg_path = "plan.svg";
  AssumptionArgs assumptions;
  std::string json_path;
  bool dry_run = false;
  // Time model (cost::step_time).
  std::string device = "mi300x";  // mi300x | h100
  std::optional<double> mfu;      // the device preset's 0.4 otherwise
  int total_devices = 0;          // 0: --devices (one replica)
  // --inference: the decode cost model's report instead (plan_inference.hpp).
  bool inference = false;
  int element_bytes = 2;  // β of weights, activations and the KV cache (bf16)
  // --pp: a pipeline schedule's report instead (plan_pipeline.hpp).
  std::optional<int> pp;
  std::optional<std::int64_t> microbatches;  // default: --batch (one sequence each)
  std::string schedule = "1f1b";
  std::optional<int> virtual_stages;  // default: 2 for interleaved-1f1b, else 1
};

CLI::App* add_plan_command(CLI::App& app, PlanArgs& a);
int plan_command(const PlanArgs& a, std::ostream& out);

// A sweep has at most kMaxSweepPoints points (counts and sizes: quantity.hpp).
inline constexpr std::int64_t kMaxSweepPoints = 256;
// The sequence lengths of --sweep.
std::vector<std::int64_t> parse_sweep(const std::string& text);
// Preset names in table order, and the shape of one (ConfigError for an unknown name).
std::vector<std::string> plan_presets();
tsp::cost::ModelShape preset_shape(const std::string& name);
// The preset with the overrides of `a` applied, every value checked: each >= 1, heads | hidden,
// kv heads | heads, and every product the cost model forms of B, S, h, ffn, vocab and L inside
// int64 (ConfigError naming the flags and values otherwise).
tsp::cost::ModelShape plan_shape(const PlanArgs& a, std::int64_t B, std::int64_t S);
// The model's part of the report's "config": the preset's name and m's shape.
nlohmann::json plan_model_json(const PlanArgs& a, const tsp::cost::ModelShape& m);

}  // namespace tspemu::app
