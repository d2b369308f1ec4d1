#include "plan_pipeline.hpp"

#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "problem_options.hpp"
#include "quantity.hpp"
#include "stack_report.hpp"
#include "tspemu/plan/pipeline_check.hpp"
#include "tspemu/plan/pipeline_clock.hpp"
#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::app {

namespace cost = tsp::cost;
namespace pp = pipeline;

namespace {

constexpr std::int64_t kMaxActions = std::int64_t{1} << 20;

// Everything `plan --pp` reports: computed first, then printed.
struct PipelineReport {
  pp::ScheduleSpec spec;
  pp::Schedule schedule;
  pp::Costs costs;
  pp::Timeline clock;
  std::optional<pp::Fraction> closed_form;
  std::int64_t batch = 0, seq = 0, layers = 0, layers_per_stage = 0;
  double kept_per_layer = 0;  // bytes one layer keeps for one microbatch
  double unit = 1e9;
  std::string units, recompute;
};

void refuse_other_modes(const PlanArgs& a) {
  const std::string with = std::to_string(*a.pp);
  if (a.inference) throw ConfigError("--inference: not with --pp " + with);
  if (!a.sweep.empty()) throw ConfigError("--sweep " + a.sweep + ": not with --pp " + with);
  if (a.dry_run) throw ConfigError("--dry-run: not with --pp " + with);
  if (!a.json_path.empty()) throw ConfigError("--json " + a.json_path + ": not with --pp " + with);
}

pp::ScheduleSpec pipeline_spec(const PlanArgs& a, std::int64_t layers) {
  pp::ScheduleSpec spec;
  try {
    spec.kind = pp::parse_kind(a.schedule);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("--schedule " + a.schedule + ": " + e.what());
  }
  spec.ranks = *a.pp;
  spec.virtual_stages = a.virtual_stages.value_or(spec.kind == pp::Kind::interleaved_1f1b ? 2 : 1);
  const std::int64_t m = a.microbatches.value_or(a.batch);
  const std::string m_flag = a.microbatches ? "--microbatches " + std::to_string(m)
                                            : "--microbatches (--batch " + std::to_string(m) + ")";
  const std::int64_t actions = static_cast<std::int64_t>(spec.ranks) * spec.virtual_stages * m;
  if (m > kMaxActions || actions > kMaxActions)
    throw ConfigError(m_flag + " × --pp " + std::to_string(spec.ranks) + " × --virtual-stages " +
                      std::to_string(spec.virtual_stages) + ": at most " +
                      std::to_string(kMaxActions) +
                      " (stage, microbatch) pairs (the schedule is built and simulated action by "
                      "action)");
  spec.microbatches = static_cast<int>(m);
  if (const auto why = pp::refusal(spec))
    throw ConfigError("--schedule " + a.schedule + " --pp " + std::to_string(spec.ranks) +
                      " --microbatches " + std::to_string(spec.microbatches) + ": " + *why);
  const std::int64_t stages = static_cast<std::int64_t>(spec.ranks) * spec.virtual_stages;
  const std::string flags = "--pp " + std::to_string(spec.ranks) + " × --virtual-stages " +
                            std::to_string(spec.virtual_stages) + " = " + std::to_string(stages) +
                            " stages";
  if (stages > layers)
    throw ConfigError(flags + ": more than --layers " + std::to_string(layers) +
                      " (each stage needs at least one layer)");
  if (layers % stages != 0)
    throw ConfigError(flags + ": must divide --layers " + std::to_string(layers) +
                      " (stages of equal layers, the simulated clock's uniform stage cost)");
  if (a.batch % spec.microbatches != 0)
    throw ConfigError(m_flag + ": must divide --batch " + std::to_string(a.batch) +
                      " (each microbatch holds --batch / --microbatches sequences)");
  return spec;
}

double kept_bytes(const cost::LayerMemoryEstimate& l, cost::Recompute r) {
  switch (r) {
    case cost::Recompute::none:
      return l.kept;
    case cost::Recompute::selective:
      return l.selective;
    case cost::Recompute::full:
      return l.checkpoint;
  }
  return l.kept;
}

PipelineReport pipeline_report(const PlanArgs& a) {
  refuse_other_modes(a);
  PipelineReport r;
  r.batch = a.batch;
  r.seq = parse_count("--seq", a.seq);
  const cost::ModelShape whole = plan_shape(a, r.batch, r.seq);
  r.layers = whole.layers;
  r.spec = pipeline_spec(a, r.layers);
  r.layers_per_stage = r.layers / (static_cast<std::int64_t>(r.spec.ranks) * r.spec.virtual_stages);
  const cost::ModelShape micro = plan_shape(a, r.batch / r.spec.microbatches, r.seq);
  r.spec.shape = {micro.B, micro.S, micro.hidden};
  r.schedule = pp::make_schedule(r.spec);
  pp::require_valid(r.schedule);  // tspemu's mailbox: 4 messages in flight per pair
  r.costs = pp::Costs{1, 2, 1, 1, 0};
  r.clock = pp::simulate(r.schedule, r.costs);
  r.closed_form = pp::closed_form_bubble(r.spec.kind, r.spec.ranks, r.spec.microbatches,
                                         r.spec.virtual_stages, r.costs);
  const cost::MemoryAssumptions assume = memory_assumptions(a.assumptions);
  r.recompute = recompute_name(assume.recompute);
  r.kept_per_layer =
      kept_bytes(cost::layer_memory(micro, cost::Strategy::tp(1), assume), assume.recompute);
  r.unit = unit_bytes(a.assumptions.units);
  r.units = a.assumptions.units;
  return r;
}

std::string closed_form_text(pp::Kind k) {
  switch (k) {
    case pp::Kind::gpipe:
    case pp::Kind::one_f_one_b:
      return "(p-1)/(m+p-1)";
    case pp::Kind::interleaved_1f1b:
      return "(p-1)/(v·m+p-1)";
    case pp::Kind::zb_h1:
      return "(p-1)/(3m+p-1)";
  }
  return "";
}

void print_bubble(const PipelineReport& r, std::ostream& out) {
  const bool split = r.spec.kind == pp::Kind::zb_h1;
  out << "bubble (simulated clock, " << (split ? "F = I = W = 1" : "F = 1, B = 2")
      << " per stage; makespan " << r.clock.makespan << "):";
  const pp::Fraction first = r.clock.idle_fraction(0);
  bool uniform = true;
  for (int k = 1; k < r.spec.ranks; ++k) uniform = uniform && r.clock.idle_fraction(k) == first;
  const auto pct = [](const pp::Fraction& f) {
    return fmt("%.2f%%", 100.0 * static_cast<double>(f.num) / static_cast<double>(f.den));
  };
  if (uniform) {
    out << " every rank idles " << pp::to_string(first) << " = " << pct(first);
  } else {
    for (int k = 0; k < r.spec.ranks; ++k)
      out << (k ? ", " : " ") << "rank " << k << " " << pp::to_string(r.clock.idle_fraction(k));
  }
  if (r.closed_form)
    out << "; closed form " << closed_form_text(r.spec.kind) << " = "
        << pp::to_string(*r.closed_form) << "\n";
  else
    out << "; no closed form below m = p for this schedule\n";
}

void print_report(const PipelineReport& r, std::ostream& out) {
  const pp::ScheduleSpec& s = r.spec;
  const std::int64_t per_mb = r.batch / s.microbatches;
  std::size_t actions = 0;
  for (const auto& list : r.schedule.actions) actions += list.size();
  out << "pipeline " << pp::kind_name(s.kind) << ": p = " << s.ranks << " ranks, "
      << r.schedule.stages << " stages (v = " << s.virtual_stages << "), m = " << s.microbatches
      << " microbatches of " << per_mb << " sequence" << (per_mb == 1 ? "" : "s") << " × " << r.seq
      << " tokens, " << r.layers << " layers: " << r.layers_per_stage << " per stage\n";
  out << "schedule checked: " << actions
      << " actions, sends matched to receives in order with their shapes, no deadlock with "
         "4 messages in flight per pair\n";
  print_bubble(r, out);
  out << "activations kept for backward at the peak (recompute " << r.recompute << ": "
      << fmt("%.3f", r.kept_per_layer / r.unit) << " " << r.units
      << " per layer per microbatch; a peak counts (stage, microbatch) activations held at "
         "once):\n";
  out << fmt("  %-5s %-12s %-14s %-10s %-14s %s\n", "rank", "stages", "stage peaks", "rank peak",
             "layers held", r.units.c_str());
  for (int k = 0; k < s.ranks; ++k) {
    std::string stages, peaks;
    for (int st = k; st < r.schedule.stages; st += s.ranks) {
      stages += (stages.empty() ? "" : ",") + std::to_string(st);
      peaks += (peaks.empty() ? "" : ",") + std::to_string(r.clock.peak_in_flight[st]);
    }
    const int held = r.clock.rank_peak_in_flight[k];
    const double bytes = held * static_cast<double>(r.layers_per_stage) * r.kept_per_layer;
    const long long layers_held = r.layers_per_stage * s.virtual_stages;
    out << fmt("  %-5d %-12s %-14s %-10d %-14lld %.3f\n", k, stages.c_str(), peaks.c_str(), held,
               layers_held, bytes / r.unit);
  }
}

}  // namespace

int plan_pipeline_command(const PlanArgs& a, std::ostream& out) {
  const PipelineReport r = pipeline_report(a);
  print_report(r, out);
  return 0;
}

}  // namespace tspemu::app
