#include "plan_inference.hpp"

#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "output_files.hpp"
#include "problem_options.hpp"
#include "stack_report.hpp"
#include "tspemu/plan/decode_cost.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;

namespace {

struct InferenceRow {
  cost::DecodeStrategy st;
  std::string skipped;
  cost::DecodeCost cost;
  std::int64_t max_context = 0;
  double prefill_bytes = 0;  // per layer per device, ring convention
};

// Everything `plan --inference` reports: computed first, then rendered as text and JSON.
struct InferenceReport {
  const PlanArgs* args = nullptr;
  cost::ModelShape m;
  std::uint64_t beta = 2;
  std::uint64_t budget = 0;  // bytes per device
  double unit = 1e9;         // bytes per table unit
  std::vector<InferenceRow> rows;
};

InferenceRow inference_row(const InferenceReport& r, const cost::DecodeStrategy& st) {
  InferenceRow row;
  row.st = st;
  try {
    const std::vector<std::int64_t> lengths(static_cast<std::size_t>(r.m.B), r.m.S);
    row.cost = cost::decode_cost(r.m, st, lengths, r.beta);
    row.max_context = cost::decode_max_context(r.m, st, r.budget, r.beta);
    row.prefill_bytes = cost::prefill_elements(r.m, st) * static_cast<double>(r.beta);
  } catch (const std::invalid_argument& e) {
    row.skipped = e.what();
  }
  return row;
}

InferenceReport inference_report(const PlanArgs& a) {
  if (!a.sweep.empty())
    throw ConfigError("--sweep " + a.sweep + ": not with --inference (one sequence length)");
  if (a.dry_run) throw ConfigError("--dry-run: not with --inference (no decode blocks run dry)");
  if (a.devices < 1 || a.devices > 4096)
    throw ConfigError("--devices " + std::to_string(a.devices) + ": must be 1 to 4096");
  if (a.element_bytes != 1 && a.element_bytes != 2 && a.element_bytes != 4)
    throw ConfigError("--element-bytes " + std::to_string(a.element_bytes) +
                      ": must be 1, 2 or 4 (fp8, bf16, fp32)");
  InferenceReport r;
  r.args = &a;
  r.beta = static_cast<std::uint64_t>(a.element_bytes);
  const double capacity = parse_bytes("--device-mem", a.device_mem);
  if (!(capacity < 1e18))
    throw ConfigError("--device-mem " + a.device_mem + ": must be below 1 EB");
  r.budget = static_cast<std::uint64_t>(capacity);
  r.unit = unit_bytes(a.assumptions.units);
  r.m = plan_shape(a, a.batch, parse_count("--seq", a.seq));
  for (const cost::DecodeStrategy& st : cost::decode_strategies_at(a.devices))
    r.rows.push_back(inference_row(r, st));
  return r;
}

// ---- Text ---------------------------------------------------------------------------------------

void print_collectives(const InferenceRow& row, std::ostream& out) {
  for (const cost::DecodeCollective& c : row.cost.comm)
    out << fmt("    %-38s %-11s n=%-4d %6llu × %12llu B  %12.0f B/device%s%s\n", c.what.c_str(),
               collective_name(c.kind), c.group, static_cast<unsigned long long>(c.calls),
               static_cast<unsigned long long>(c.payload),
               static_cast<double>(c.calls) * c.per_device,
               c.per_layer ? " per layer" : " per step", c.packed ? " (in the call above)" : "");
}

void print_inference(const InferenceReport& r, std::ostream& out) {
  const PlanArgs& a = *r.args;
  const cost::ModelShape& m = r.m;
  const std::string& u = a.assumptions.units;
  out << fmt(
      "tspemu plan --inference: %s (h=%lld, L=%lld, heads %lld/%lld kv, ffn %lld, vocab %lld), "
      "%d devices of %.2f %s, B=%lld sequences of S=%lld cached tokens, %llu-byte elements "
      "(LSE fp32)\n",
      a.preset.c_str(), static_cast<long long>(m.hidden), static_cast<long long>(m.layers),
      static_cast<long long>(m.n_heads), static_cast<long long>(m.n_kv_heads),
      static_cast<long long>(m.ffn), static_cast<long long>(m.vocab), a.devices,
      static_cast<double>(r.budget) / r.unit, u.c_str(), static_cast<long long>(m.B),
      static_cast<long long>(m.S), static_cast<unsigned long long>(r.beta));
  out << "per rank: weights (layers + vocabulary shard), KV cache of the batch, max context of "
         "one sequence in the device's memory (weights and TSP-M's in-flight shards taken "
         "first, no activations); per decode step, bytes per device in the ring convention: the "
         "layers' collectives without the LSE, the fp32 LSE apart, the embedding and LM head "
         "apart; prefill: the training forward per layer (plan/decode_cost.hpp)\n\n";
  out << padded("schedule", 22)
      << fmt(" %9s %9s %5s %12s %11s %9s %10s %6s %10s %12s\n", ("weights " + u).c_str(),
             ("KV " + u).c_str(), "dup", "max context", "comm MB", "LSE KB", "vocab MB", "colls",
             ("HBM " + u).c_str(), "prefill MB/L");
  for (const InferenceRow& row : r.rows) {
    if (!row.skipped.empty()) {
      out << padded(row.st.name(), 22) << "  skipped: " << row.skipped << "\n";
      continue;
    }
    const cost::DecodeCost& c = row.cost;
    out << padded(row.st.name(), 22)
        << fmt(" %9.2f %9.2f %5.2f %12lld %11.2f %9.2f %10.2f %6llu %10.2f %12.1f\n",
               static_cast<double>(c.weight_bytes) / r.unit,
               static_cast<double>(c.kv_bytes) / r.unit, c.kv_duplication,
               static_cast<long long>(row.max_context), c.comm_per_step() / 1e6,
               c.lse_per_step() / 1e3, c.vocab_per_step() / 1e6,
               static_cast<unsigned long long>(c.layer_collectives()),
               static_cast<double>(c.hbm_read_bytes) / r.unit, row.prefill_bytes / 1e6);
  }
  out << "\ncollectives of one decode step (per call: payload; per device: all calls, ring "
         "convention):\n";
  for (const InferenceRow& row : r.rows) {
    if (!row.skipped.empty()) continue;
    out << "  " << row.st.name() << (row.cost.comm.empty() ? ": none\n" : ":\n");
    print_collectives(row, out);
  }
}

// ---- JSON ---------------------------------------------------------------------------------------

nlohmann::json row_json(const InferenceRow& row) {
  nlohmann::json j = {{"schedule", row.st.name()},
                      {"scheme", cost::decode_scheme_name(row.st.scheme)},
                      {"ranks", row.st.ranks()}};
  if (!row.skipped.empty()) {
    j["skipped"] = row.skipped;
    return j;
  }
  const cost::DecodeCost& c = row.cost;
  nlohmann::json colls = nlohmann::json::array();
  for (const cost::DecodeCollective& e : c.comm)
    colls.push_back({{"what", e.what},
                     {"collective", collective_name(e.kind)},
                     {"group", e.group},
                     {"calls", e.calls},
                     {"payload_bytes", e.payload},
                     {"element_bytes", e.element_bytes},
                     {"per_device_bytes_per_call", e.per_device},
                     {"lse", e.lse},
                     {"packed_with_previous", e.packed},
                     {"per_layer", e.per_layer}});
  j.update({{"skipped", nullptr},
            {"weight_bytes", c.weight_bytes},
            {"layer_params", c.layer_params},
            {"vocab_params", c.vocab_params},
            {"buffer_bytes", c.buffer_bytes},
            {"kv_bytes", c.kv_bytes},
            {"kv_heads_held", c.kv_heads_held},
            {"kv_duplication", c.kv_duplication},
            {"kv_tokens", c.kv_tokens},
            {"max_context", row.max_context},
            {"comm_bytes_per_step", c.comm_per_step()},
            {"lse_bytes_per_step", c.lse_per_step()},
            {"vocab_bytes_per_step", c.vocab_per_step()},
            {"collectives_per_layer", c.layer_collectives()},
            {"hbm_read_bytes_per_step", c.hbm_read_bytes},
            {"prefill_bytes_per_layer", row.prefill_bytes},
            {"collectives", colls}});
  return j;
}

nlohmann::json inference_json(const InferenceReport& r) {
  const PlanArgs& a = *r.args;
  const cost::ModelShape& m = r.m;
  nlohmann::json j = document("plan");
  j["config"] = plan_model_json(a, m);
  j["config"].update({{"inference", true},
                      {"devices", a.devices},
                      {"device_bytes", r.budget},
                      {"batch", m.B},
                      {"seq", m.S},
                      {"element_bytes", r.beta},
                      {"lse_element_bytes", 4}});
  j["schedules"] = nlohmann::json::array();
  for (const InferenceRow& row : r.rows) j["schedules"].push_back(row_json(row));
  return j;
}

}  // namespace

int plan_inference_command(const PlanArgs& a, std::ostream& out) {
  check_output_files({{"--json", a.json_path}});
  const InferenceReport r = inference_report(a);
  print_inference(r, out);
  if (!a.json_path.empty()) write_json(a.json_path, inference_json(r));
  return 0;
}

}  // namespace tspemu::app
