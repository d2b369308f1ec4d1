#include "stack_report.hpp"

#include "mpi_job.hpp"

#include "tspemu/core/atomic_file.hpp"
#include "tspemu/reference/bf16_gemm.hpp"
#include "tspemu/reference/blas_kernel.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <stdexcept>

namespace tspemu::app {

namespace {

unsigned long long ull(std::uint64_t v) {
  return static_cast<unsigned long long>(v);
}

nlohmann::json categories(const std::array<std::size_t, kCategoryCount>& v) {
  nlohmann::json j;
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    j[category_name(static_cast<Category>(c))] = v[c];
  return j;
}

nlohmann::json traffic_json(const TrafficCounters& got, const TrafficCounters& want) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& e = got.by_kind[k];
    const auto& w = want.by_kind[k];
    if (e.calls == 0 && w.calls == 0) continue;
    j[collective_name(static_cast<CollectiveKind>(k))] = {
        {"calls", e.calls},
        {"bytes_sent", e.bytes_sent},
        {"bytes_received", e.bytes_received},
        {"model_calls", w.calls},
        {"model_bytes_sent", w.bytes_sent},
        {"model_bytes_received", w.bytes_received}};
  }
  return j;
}

void print_traffic(std::ostream& out, const char* pass, const TrafficCounters& got,
                   const TrafficCounters& want) {
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& e = got.by_kind[k];
    const auto& w = want.by_kind[k];
    if (e.calls == 0 && w.calls == 0) continue;
    out << fmt("  %-9s %-15s %6llu %6llu %14llu %14llu %14llu %14llu  %s\n", pass,
               collective_name(static_cast<CollectiveKind>(k)), ull(e.calls), ull(w.calls),
               ull(e.bytes_received), ull(w.bytes_received), ull(e.bytes_sent), ull(w.bytes_sent),
               e == w ? "yes" : "NO");
  }
}

}  // namespace

std::string mib(double bytes) {
  return fmt("%.2f", bytes / (1024.0 * 1024.0));
}

std::string padded(const std::string& s, std::size_t width) {
  std::size_t shown = 0;
  for (unsigned char c : s) shown += (c & 0xC0) != 0x80;  // count lead bytes, not continuations
  return shown >= width ? s : s + std::string(width - shown, ' ');
}

nlohmann::json document(const char* command) {
  return {{"command", command},
          {"schema_version", 1},
          {"blas", ref::describe_blas()},
          {"bf16_gemm", ref::describe_bf16_gemm()}};
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (!mpi_job().prints()) return;  // under mpirun, process 0 writes the files
  // Invalid UTF-8 in a string (a path given by the user) is replaced, not thrown half-way.
  write_file_atomically(path,
                        j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

Summary summarize(const StackResult& r) {
  Summary s;
  for (const RankMeasure& m : r.ranks) {
    s.peak_bytes = std::max(s.peak_bytes, static_cast<double>(m.arena.peak));
    s.forward_bytes = std::max(s.forward_bytes, static_cast<double>(m.forward.total_received()));
    s.backward_bytes = std::max(s.backward_bytes, static_cast<double>(m.backward.total_received()));
  }
  return s;
}

nlohmann::json config_json(const StackConfig& c) {
  const auto& m = c.model;
  return {{"strategy", c.strategy.name()},
          {"ranks", c.strategy.ranks()},
          {"D", c.strategy.D},
          {"T", c.strategy.T},
          {"Sp", c.strategy.Sp},
          {"B", c.B},
          {"S", c.S},
          {"layout", tsp::layout_name(c.layout)},
          {"head_buckets", c.head_buckets},
          {"seed", c.seed},
          {"oracle_k", c.k},
          {"model",
           {{"layers", m.n_layers},
            {"hidden", m.hidden},
            {"heads", m.n_heads},
            {"kv_heads", m.n_kv_heads},
            {"ffn", m.ffn},
            {"vocab", m.vocab},
            {"tied", m.tie_embeddings}}}};
}

namespace {

void print_debugging(std::ostream& out, const StackConfig& c, const StackResult& r) {
  if (!c.trace_path.empty()) {
    out << fmt("\ntrace: %llu events written to %s (open in https://ui.perfetto.dev)",
               static_cast<unsigned long long>(r.trace_events), c.trace_path.c_str());
    if (r.trace_dropped > 0)
      out << fmt("; %llu events dropped (the buffers hold 2^18 per rank)",
                 static_cast<unsigned long long>(r.trace_dropped));
    out << "\n";
  }
  if (c.sim_clock)
    out << fmt(
        "\nsimulated step: %.3f ms per step (%.0f tokens/s): %s; compute is charged only where the "
        "blocks mark GEMM and attention spans; a blocking collective is exposed, a non-blocking "
        "one overlaps the compute charged before its wait; contention and launches are not "
        "modelled\n",
        r.simulated_seconds * 1e3, static_cast<double>(c.B) * c.S / r.simulated_seconds,
        c.sim_clock->describe().c_str());
  if (c.sim_clock) {
    out << "rank   compute ms  exposed comm ms  overlapped comm ms\n";
    for (std::size_t k = 0; k < r.simulated_time.size(); ++k) {
      const World::SimulatedTime& t = r.simulated_time[k];
      out << fmt("%-4zu %12.3f %16.3f %19.3f\n", k, t.compute * 1e3, t.exposed_comm * 1e3,
                 t.overlapped_comm * 1e3);
    }
  }
  if (c.inject)
    out << "\nran under " << c.inject->describe() << ": rerun with --inject-seed " << c.inject->seed
        << " to reproduce the event order\n";
}

}  // namespace

void print_report(std::ostream& out, const StackConfig& c, const StackResult& r) {
  const int n = c.strategy.ranks();
  out << "tspemu run: " << c.strategy.name() << ", B=" << c.B << ", S=" << c.S << ", model "
      << c.model.to_string() << "\nran: " << r.scope << "\nblas: " << ref::describe_blas()
      << "\nbf16 gemm: " << ref::describe_bf16_gemm() << "\n";
  out << fmt("\ntime, forward+backward: %.3f s (%.0f tokens/s) on %d ranks", r.seconds,
             r.tokens_per_s, n);
  if (r.reference_seconds > 0)
    out << fmt("; single-thread reference %.3f s (%.0f tokens/s)", r.reference_seconds,
               static_cast<double>(c.B) * c.S / r.reference_seconds);
  out << "\n\npeak memory per rank by category (from after construction, forward+backward):\n";
  out << fmt("%-5s %12s", "rank", "total");
  for (std::size_t k = 0; k < kCategoryCount; ++k)
    out << fmt(" %12s", category_name(static_cast<Category>(k)));
  out << "\n";
  for (int i = 0; i < n; ++i) {
    const ArenaStats& a = r.ranks[static_cast<std::size_t>(i)].arena;
    out << fmt("%-5d %12s", i, format_bytes(a.peak).c_str());
    for (std::size_t k = 0; k < kCategoryCount; ++k)
      out << fmt(" %12s", format_bytes(a.category_peak[k]).c_str());
    out << "\n";
  }
  const auto& lm = r.layer_model;
  const auto w = lm.resident[static_cast<std::size_t>(Category::weights)];
  const auto g = lm.backward.category_current[static_cast<std::size_t>(Category::gradients)];
  out << fmt(
      "dry run, one layer on rank 0 (fp32, with its input, output and gradient buffers): weights "
      "%s, gradients %s, forward peak %s, backward peak %s\n",
      format_bytes(w).c_str(), format_bytes(g).c_str(), format_bytes(lm.forward.peak).c_str(),
      format_bytes(lm.backward.peak).c_str());

  out << fmt(
      "weights and gradients per rank, measured vs model: %s / %s vs %s / %s: %s\n",
      format_bytes(r.ranks[0].arena.category_peak[static_cast<std::size_t>(Category::weights)])
          .c_str(),
      format_bytes(r.ranks[0].arena.category_peak[static_cast<std::size_t>(Category::gradients)])
          .c_str(),
      format_bytes(r.model_weights).c_str(), format_bytes(r.model_gradients).c_str(),
      r.memory_match ? "equal on every rank" : "DIFFER (reported, not part of the verdict)");
  out << "\nbytes per collective, rank 0, measured vs cost model ("
      << (r.scope.rfind("whole", 0) == 0 ? "L x layer + embedding/LM head/loss" : "L x layer")
      << "):\n";
  out << fmt("  %-9s %-15s %6s %6s %14s %14s %14s %14s  %s\n", "pass", "collective", "calls",
             "model", "received", "model", "sent", "model", "match");
  print_traffic(out, "forward", r.ranks[0].forward, r.ranks[0].model_forward);
  print_traffic(out, "backward", r.ranks[0].backward, r.ranks[0].model_backward);
  int mismatched = 0;
  for (const RankMeasure& m : r.ranks) mismatched += m.traffic_match ? 0 : 1;
  out << (mismatched == 0 ? fmt("traffic: every rank (%d) matches the cost model exactly\n", n)
                          : fmt("traffic: %d of %d ranks DIFFER from the cost model (see --json)\n",
                                mismatched, n));

  if (!r.tensors.empty()) {
    out << fmt(
        "\naccuracy vs the fp64 oracle (rule: err(parallel fp32) <= %.1f * err(reference fp32) + "
        "tiny):\n",
        c.k);
    for (const check::TensorResult& t : r.tensors)
      out << fmt("  %-4s %-50s parallel err %.3e  reference err %.3e  bound %.3e\n",
                 t.ok() ? "ok" : "FAIL", t.name.c_str(), t.verdict.candidate.max_abs,
                 t.verdict.reference.max_abs, t.verdict.bound);
    out << fmt("max error ratio (parallel err / bound): %.3f\n", r.max_err_ratio);
  } else {
    out << "\naccuracy: not checked (--no-check)\n";
  }
  print_debugging(out, c, r);
  out << (r.pass() ? "\nverdict: PASS (traffic equals the model; every tensor within the rule)\n"
                   : "\nverdict: FAIL\n");
}

nlohmann::json sim_clock_json(const SimClockModel& m) {
  return {{"estimate", m.describe()},
          {"peak_flops", m.peak_flops},
          {"mfu", m.mfu},
          {"alpha_s", m.alpha_s},
          {"beta_bytes_s", m.beta_bytes_s},
          {"gpus_per_node", m.gpus_per_node},
          {"inter_alpha_s", m.inter_alpha_s},
          {"inter_beta_bytes_s", m.inter_beta_bytes_s}};
}

nlohmann::json simulated_time_json(const StackResult& r) {
  nlohmann::json a = nlohmann::json::array();
  for (const World::SimulatedTime& t : r.simulated_time)
    a.push_back({{"compute_seconds", t.compute},
                 {"exposed_comm_seconds", t.exposed_comm},
                 {"overlapped_comm_seconds", t.overlapped_comm}});
  return a;
}

nlohmann::json report_json(const StackConfig& c, const StackResult& r) {
  nlohmann::json j = document("run");
  j["config"] = config_json(c);
  j["scope"] = r.scope;
  j["time"] = {{"seconds", r.seconds},
               {"tokens_per_s", r.tokens_per_s},
               {"reference_seconds", r.reference_seconds}};
  if (c.sim_clock) {
    j["simulated"] = sim_clock_json(*c.sim_clock);
    j["simulated"]["seconds"] = r.simulated_seconds;
    j["simulated"]["per_rank"] = simulated_time_json(r);
  }
  if (!c.trace_path.empty())
    j["trace"] = {{"path", c.trace_path}, {"events", r.trace_events}, {"dropped", r.trace_dropped}};
  if (c.inject)
    j["injection"] = {{"seed", c.inject->seed},
                      {"probability", c.inject->probability},
                      {"max_delay_us", c.inject->max_delay.count()}};
  j["memory"] = nlohmann::json::array();
  j["traffic"] = nlohmann::json::array();
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    const RankMeasure& m = r.ranks[i];
    j["memory"].push_back({{"rank", i},
                           {"peak_bytes", m.arena.peak},
                           {"category_peak_bytes", categories(m.arena.category_peak)}});
    j["traffic"].push_back({{"rank", i},
                            {"match", m.traffic_match},
                            {"forward", traffic_json(m.forward, m.model_forward)},
                            {"backward", traffic_json(m.backward, m.model_backward)}});
  }
  const auto& lm = r.layer_model;
  j["memory_model_layer"] = {{"resident_bytes", categories(lm.resident)},
                             {"forward_peak_bytes", lm.forward.peak},
                             {"backward_peak_bytes", lm.backward.peak}};
  j["memory_model"] = {{"weights_bytes", r.model_weights},
                       {"gradients_bytes", r.model_gradients},
                       {"match", r.memory_match}};
  j["traffic_match"] = r.traffic_match;
  j["accuracy"] = nlohmann::json::array();
  for (const check::TensorResult& t : r.tensors)
    j["accuracy"].push_back({{"tensor", t.name},
                             {"ok", t.ok()},
                             {"parallel_err", t.verdict.candidate.max_abs},
                             {"reference_err", t.verdict.reference.max_abs},
                             {"bound", t.verdict.bound}});
  j["checked"] = !r.tensors.empty();
  j["max_err_ratio"] = r.max_err_ratio;
  j["verdict"] = r.pass() ? "pass" : "fail";
  return j;
}

}  // namespace tspemu::app
