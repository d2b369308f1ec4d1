#include "tsp_run.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <random>
#include <stdexcept>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/tsp_model.hpp"

namespace tspemu::app {

RunOptions::RunOptions() {
  shape.model.vocab = 1024;
  shape.model.hidden = 256;
  shape.model.n_layers = 2;
  shape.model.n_heads = 8;
  shape.model.n_kv_heads = 4;
  shape.model.ffn = 704;
  shape.D = 4;
  shape.B = 1;
  shape.S = 2048;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_tsp_step(const RunOptions& opts, std::ostream& out) {
  const tsp::TspShape& s = opts.shape;
  s.validate();
  if (s.model.vocab % s.D != 0)
    throw std::invalid_argument("TSP config: D=" + std::to_string(s.D) +
                                " does not divide vocab=" + std::to_string(s.model.vocab));
  const int D = s.D, B = s.B, S = s.S;
  char line[512];
  std::snprintf(line, sizeof line, "tspemu run: TSP, D=%d, %s layout, B=%d, S=%d, model %s\n", D,
                tsp::layout_name(s.options.layout), B, S, s.model.to_string().c_str());
  out << line;

  auto w64 = ref::init_weights<double>(s.model, opts.seed);
  auto w32 = ref::convert_weights<float>(w64);
  auto wo = ref::convert_weights<double>(w32);  // the oracle sees the float weights exactly
  const std::size_t n = static_cast<std::size_t>(B) * S;
  std::vector<std::int32_t> tokens(n), targets(n);
  std::mt19937_64 gen(opts.seed + 1);
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = static_cast<std::int32_t>(gen() % static_cast<unsigned>(s.model.vocab));
  for (std::size_t i = 0; i + 1 < n; ++i) targets[i] = tokens[i + 1];
  targets[n - 1] = tokens[0];
  ref::Batch batch{B, S, tokens, targets, {}};

  // Single-thread reference (fp32) and oracle (fp64).
  auto t0 = std::chrono::steady_clock::now();
  ref::ModelCache<float> c32;
  ref::ModelWeights<float> g32;
  const double loss32 = ref::model_forward(w32, batch, c32);
  ref::model_backward(w32, batch, c32, g32);
  const double ref_seconds = seconds_since(t0);
  ref::ModelCache<double> c64;
  ref::ModelWeights<double> g64;
  const double loss64 = ref::model_forward(wo, batch, c64);
  ref::model_backward(wo, batch, c64, g64);

  // TSP on D ranks.
  auto gt = ref::ModelWeights<float>::zeros(s.model);
  double loss_tsp = 0, tsp_seconds = 0;
  const tsp::SequenceLayout layout = s.layout();
  World world({.ranks = D});
  world.run([&](Rank& rank) {
    const int p = rank.id();
    std::vector<std::int32_t> tl(static_cast<std::size_t>(B) * s.Tl()), yl(tl.size());
    layout.scatter(tokens.data(), tl.data(), p, B, 1);
    layout.scatter(targets.data(), yl.data(), p, B, 1);
    tsp::TspModel model(rank, s, w32);
    rank.arena().reset_peaks();
    auto start = std::chrono::steady_clock::now();
    const double loss = model.forward(tl.data(), yl.data());
    model.backward();
    if (p == 0) {
      tsp_seconds = seconds_since(start);
      loss_tsp = loss;
    }
    model.write_gradients(gt);
  });

  nlohmann::json report;
  report["config"] = {{"strategy", "tsp"},
                      {"D", D},
                      {"B", B},
                      {"S", S},
                      {"layout", tsp::layout_name(s.options.layout)},
                      {"model", s.model.to_string()},
                      {"seed", opts.seed}};
  const double tokens_per_s = static_cast<double>(n) / tsp_seconds;
  std::snprintf(line, sizeof line,
                "\ntime, forward+backward: TSP %.3f s (%.0f tokens/s) on %d ranks; reference %.3f "
                "s (%.0f tokens/s); ratio %.2f\n",
                tsp_seconds, tokens_per_s, D, ref_seconds, static_cast<double>(n) / ref_seconds,
                tsp_seconds / ref_seconds);
  out << line;
  report["time"] = {{"tsp_seconds", tsp_seconds},
                    {"reference_seconds", ref_seconds},
                    {"tsp_tokens_per_s", tokens_per_s}};

  out << "\npeak memory per rank by category (forward+backward):\n";
  std::snprintf(line, sizeof line, "%-5s %12s", "rank", "total");
  out << line;
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    std::snprintf(line, sizeof line, " %12s", category_name(static_cast<Category>(c)));
    out << line;
  }
  out << "\n";
  for (int r = 0; r < D; ++r) {
    const ArenaStats& a = world.arena(r).stats();
    std::snprintf(line, sizeof line, "%-5d %12s", r, format_bytes(a.peak).c_str());
    out << line;
    nlohmann::json cats;
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      std::snprintf(line, sizeof line, " %12s", format_bytes(a.category_peak[c]).c_str());
      out << line;
      cats[category_name(static_cast<Category>(c))] = a.category_peak[c];
    }
    out << "\n";
    report["memory"].push_back({{"rank", r},
                                {"peak_bytes", a.peak},
                                {"category_peak_bytes", cats},
                                {"phase_peak_bytes", world.arena(r).phase_peaks()}});
  }

  out << "\nbytes moved by rank 0, per collective kind:\n";
  std::snprintf(line, sizeof line, "%-16s %8s %14s %14s\n", "collective", "calls", "sent",
                "received");
  out << line;
  const TrafficCounters& tc = world.counters(0);
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const auto& e = tc.by_kind[k];
    if (e.calls == 0) continue;
    const char* name = collective_name(static_cast<CollectiveKind>(k));
    std::snprintf(line, sizeof line, "%-16s %8llu %14s %14s\n", name,
                  static_cast<unsigned long long>(e.calls), format_bytes(e.bytes_sent).c_str(),
                  format_bytes(e.bytes_received).c_str());
    out << line;
    report["traffic_rank0"][name] = {
        {"calls", e.calls}, {"bytes_sent", e.bytes_sent}, {"bytes_received", e.bytes_received}};
  }

  std::snprintf(
      line, sizeof line,
      "\naccuracy vs the fp64 oracle (rule: err(TSP fp32) <= %.1f * err(reference fp32) + tiny):\n",
      opts.k);
  out << line;
  bool all_ok = true;
  auto judge = [&](const std::string& name, std::span<const float> cand, std::span<const float> r32,
                   std::span<const double> o) {
    auto v = ref::check_close(name, cand, r32, o, opts.k);
    all_ok = all_ok && v.ok;
    std::snprintf(line, sizeof line, "  %-4s %-44s tsp err %.3e  ref err %.3e  max ulp %lld\n",
                  v.ok ? "ok" : "FAIL", name.c_str(), v.candidate.max_abs, v.reference.max_abs,
                  static_cast<long long>(v.candidate.max_ulp));
    out << line;
    report["accuracy"].push_back({{"tensor", name},
                                  {"ok", v.ok},
                                  {"tsp_max_abs", v.candidate.max_abs},
                                  {"reference_max_abs", v.reference.max_abs},
                                  {"max_ulp", v.candidate.max_ulp}});
  };
  const std::vector<float> lt{static_cast<float>(loss_tsp)}, lr{static_cast<float>(loss32)};
  const std::vector<double> lo{loss64};
  judge("loss", lt, lr, lo);
  const auto pc = ref::parameters(static_cast<const ref::ModelWeights<float>&>(gt));
  const auto pr = ref::parameters(static_cast<const ref::ModelWeights<float>&>(g32));
  const auto po = ref::parameters(static_cast<const ref::ModelWeights<double>&>(g64));
  for (std::size_t i = 0; i < pc.size(); ++i)
    judge("grad " + pc[i].name, *pc[i].data, *pr[i].data, *po[i].data);
  out << (all_ok ? "\nverdict: PASS (every tensor within the oracle rule)\n" : "\nverdict: FAIL\n");
  report["verdict"] = all_ok ? "pass" : "fail";
  report["loss"] = {{"tsp", loss_tsp}, {"reference", loss32}, {"oracle", loss64}};
  if (!opts.json_path.empty()) {
    std::ofstream f(opts.json_path);
    if (!f) throw std::runtime_error("cannot write " + opts.json_path);
    f << report.dump(2) << "\n";
  }
  return all_ok ? 0 : 1;
}

}  // namespace tspemu::app
