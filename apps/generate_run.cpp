#include "generate_run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::app {

namespace {

using Clock = std::chrono::steady_clock;
using Prompts = std::vector<std::vector<std::int32_t>>;

ref::Sampler make_sampler(const SamplingOptions& s) {
  return s.greedy ? ref::Sampler::greedy() : ref::Sampler::seeded(s.seed, s.temperature, s.top_k);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string tokens_text(const std::vector<std::int32_t>& t) {
  std::string s;
  for (std::int32_t v : t) s += (s.empty() ? "" : ",") + std::to_string(v);
  return "[" + s + "]";
}

// Every rank's picks of `step` equal rank 0's, or the run fails naming the first rank that differs.
void require_agreement(const std::vector<std::vector<std::vector<std::int32_t>>>& picks, int step) {
  const auto s = static_cast<std::size_t>(step);
  for (std::size_t r = 1; r < picks.size(); ++r)
    if (picks[r][s] != picks[0][s])
      throw std::runtime_error("generate: the ranks disagree at step " + std::to_string(step) +
                               (step == 0 ? " (prefill)" : " (decode step)") + ": rank " +
                               std::to_string(r) + " picks " + tokens_text(picks[r][s]) +
                               ", rank 0 picks " + tokens_text(picks[0][s]));
}

// The strategy's run on every rank; returns rank 0's logits of every step ([N][B·V]).
std::vector<std::vector<float>> run_session(const GenerateConfig& c, GenerateResult& out) {
  const int D = c.shape.ranks, B = c.shape.batch, V = c.shape.model.vocab, N = c.new_tokens;
  const auto nd = static_cast<std::size_t>(D);
  std::vector<std::vector<std::vector<std::int32_t>>> picks(
      nd, std::vector<std::vector<std::int32_t>>(static_cast<std::size_t>(N)));
  std::vector<std::vector<float>> logits(static_cast<std::size_t>(N));
  out.kv_bytes.assign(nd, 0);
  out.prefill_traffic.assign(nd, {});
  out.decode_traffic.assign(nd, {});
  WorldOptions o;  // assigned, not designated: WorldOptions grows fields
  o.ranks = D;
  o.pin_threads = c.pin;
  o.trace = !c.trace_path.empty();
  o.trace_capacity = std::size_t{1} << 18;
  World world(o);
  world.run([&](Rank& rank) {
    const auto r = static_cast<std::size_t>(rank.id());
    const auto session = c.strategy->make(rank, c.shape, *c.weights);
    ref::Sampler sampler = make_sampler(c.sampling);
    std::vector<std::int32_t> fed;
    barrier(rank.comm());
    rank.counters().clear();
    const Clock::time_point start = Clock::now();
    Clock::time_point t = start;
    for (int step = 0; step < N; ++step) {
      const auto s = static_cast<std::size_t>(step);
      std::vector<float> l;
      {
        TraceSpan span(rank.comm(), step == 0 ? "prefill" : "decode step");
        l = step == 0 ? session->prefill(c.prompts) : session->decode_step(fed);
        picks[r][s] = sampler.sample<float>(l, B, V);
      }
      (step == 0 ? out.prefill_traffic[r] : out.decode_traffic[r]) += rank.counters();
      barrier(rank.comm());  // every rank's picks of this step are written
      rank.counters().clear();
      if (r == 0) {
        const double dt = seconds_since(t);
        t = Clock::now();
        if (step == 0)
          out.prefill_seconds = dt;
        else
          out.step_seconds.push_back(dt);
        if (c.check) logits[s] = std::move(l);
        if (c.on_step) c.on_step();
      }
      require_agreement(picks, step);
      fed = picks[0][s];
    }
    if (r == 0) out.seconds = seconds_since(start);
    out.kv_bytes[r] = session->kv_cache_bytes();
  });
  out.tokens.assign(static_cast<std::size_t>(B), {});
  for (int step = 0; step < N; ++step)
    for (int b = 0; b < B; ++b)
      out.tokens[static_cast<std::size_t>(b)].push_back(
          picks[0][static_cast<std::size_t>(step)][static_cast<std::size_t>(b)]);
  if (!c.trace_path.empty()) {
    const Trace trace = world.trace();
    for (int r = 0; r < D; ++r) {
      out.trace_events += trace.events(r).size();
      out.trace_dropped += trace.dropped(r);
    }
    trace.write_chrome_json(c.trace_path);
  }
  return logits;
}

std::vector<std::int64_t> prompt_lengths(const GenerateConfig& c) {
  std::vector<std::int64_t> lengths;
  for (const auto& p : c.prompts) lengths.push_back(static_cast<std::int64_t>(p.size()));
  return lengths;
}

void check_kv(const GenerateConfig& c, GenerateResult& out) {
  const std::vector<std::int64_t> lengths = prompt_lengths(c);
  out.kv_match = true;
  for (int r = 0; r < c.shape.ranks; ++r) {
    out.kv_model.push_back(c.strategy->kv_cache_bytes(c.shape, lengths, c.new_tokens, r));
    out.kv_match = out.kv_match && out.kv_model.back() == out.kv_bytes[static_cast<std::size_t>(r)];
  }
}

void check_traffic(const GenerateConfig& c, GenerateResult& out) {
  if (!c.strategy->decode_traffic) return;
  const std::vector<std::int64_t> lengths = prompt_lengths(c);
  for (int r = 0; r < c.shape.ranks; ++r) {
    out.decode_model.push_back(c.strategy->decode_traffic(c.shape, lengths, c.new_tokens, r));
    out.traffic_match = out.traffic_match &&
                        out.decode_model.back() == out.decode_traffic[static_cast<std::size_t>(r)];
  }
}

// Whether some logits within e of the oracle's row (max norm) make a seeded sampler with uniform u
// pick `token`. The weights before, at and after the token (a, w, d over the candidate set) scale
// by factors α, γ, δ in [1/g, g], g = exp(e / temperature); the token is picked iff α·a <= u·T and
// α·a + γ·w > u·T, T = α·a + γ·w + δ·d. γ = g helps both. For a given δ the feasible α are
// (L(δ), U(δ)], L = (u·δ·d/(1-u) - γ·w)/a, U = u·(γ·w + δ·d)/((1-u)·a), never empty (U > L), so
// some α in [1/g, g] fits iff L(δ) < g and U(δ) >= 1/g: a range of δ that must meet [1/g, g].
bool seeded_reach(double a, double w, double d, double u, double g) {
  const double lo = 1 / g, hi = g, gw = hi * w;
  if (d == 0) return lo * a * (1 - u) <= u * gw;
  const double delta_max = (a * hi + gw) * (1 - u) / (u * d);  // the interval's lower end < hi
  const double delta_min = (lo * a * (1 - u) / u - gw) / d;    // its upper end >= lo
  return std::max(lo, delta_min) <= std::min(hi, delta_max);
}

// One step of the check: the rule on the step's logits, then every pick against the oracle's.
struct StepJudge {
  const GenerateConfig& c;
  GenerateResult& out;
  ref::Sampler oracle_sampler, reference_sampler;
  ref::SplitMix64 uniforms;  // the seeded sampler's stream, replayed (sampling.hpp)

  void operator()(int step, std::span<const float> run, std::span<const float> reference,
                  std::span<const double> oracle, bool separate_reference) {
    const int B = c.shape.batch, V = c.shape.model.vocab;
    out.step_logits.push_back(
        check::judge_tensor("logits step " + std::to_string(step), run, reference, oracle, c.k));
    const check::TensorResult& t = out.step_logits.back();
    out.numerics_ok = out.numerics_ok && t.ok();
    out.max_err_ratio = std::max(out.max_err_ratio, std::isfinite(t.ratio) ? t.ratio : HUGE_VAL);
    const auto oracle_picks = oracle_sampler.sample<double>(oracle, B, V);
    const auto reference_picks = separate_reference
                                     ? reference_sampler.sample<float>(reference, B, V)
                                     : std::vector<std::int32_t>{};
    for (int b = 0; b < B; ++b) {
      const auto row = static_cast<std::size_t>(b) * static_cast<std::size_t>(V);
      const double u = c.sampling.greedy ? 0.5 : uniforms.uniform();
      const std::span<const double> orow = oracle.subspan(row, static_cast<std::size_t>(V));
      const std::int32_t want = oracle_picks[static_cast<std::size_t>(b)];
      const std::int32_t picked =
          out.tokens[static_cast<std::size_t>(b)][static_cast<std::size_t>(step)];
      // e: the rule's bound on this row, k·err(reference fp32 row) + tiny.
      const std::span<const float> rrow = reference.subspan(row, orow.size());
      double e = 0;
      for (std::size_t i = 0; i < orow.size(); ++i)
        e = std::max(e, std::abs(static_cast<double>(rrow[i]) - orow[i]));
      e = c.k * e + ref::default_tiny(orow);
      judge_pick(step, b, c.strategy->name, picked, want, orow, e, u);
      if (!separate_reference) continue;
      const std::int32_t ref_pick = reference_picks[static_cast<std::size_t>(b)];
      out.tokens_match_reference = out.tokens_match_reference && ref_pick == picked;
      judge_pick(step, b, "reference", ref_pick, want, orow, e, u);
    }
  }

  void judge_pick(int step, int b, const std::string& who, std::int32_t picked, std::int32_t want,
                  std::span<const double> orow, double e, double u) {
    if (picked == want) return;
    Divergence d{
        .step = step, .seq = b, .who = who, .token = picked, .oracle_token = want, .bound = e};
    d.oracle_top1 = d.oracle_top2 = -INFINITY;
    for (const double v : orow) {
      if (v > d.oracle_top1) {
        d.oracle_top2 = d.oracle_top1;
        d.oracle_top1 = v;
      } else if (v > d.oracle_top2) {
        d.oracle_top2 = v;
      }
    }
    d.margin = orow[static_cast<std::size_t>(want)] - orow[static_cast<std::size_t>(picked)];
    d.near_tie = std::isfinite(e) && within_rounding(orow, picked, want, e, c.sampling, u);
    out.divergences.push_back(std::move(d));
  }
};

// The oracle (and, for a parallel strategy, the fp32 reference) fed the run's tokens.
void check_run(const GenerateConfig& c, const std::vector<std::vector<float>>& run,
               GenerateResult& out) {
  out.checked = true;
  const bool separate = c.strategy != &decode_strategies().front();
  const ref::ModelWeights<float>& w32 = *c.weights;
  const auto w64 = ref::convert_weights<double>(w32);  // the oracle sees the float weights exactly
  StepJudge judge{c, out, make_sampler(c.sampling), make_sampler(c.sampling),
                  ref::SplitMix64(c.sampling.seed)};
  ref::Prefill<double> oracle = ref::prefill(w64, c.prompts, c.shape.max_context);
  ref::Prefill<float> reference;
  if (separate) reference = ref::prefill(w32, c.prompts, c.shape.max_context);
  std::vector<double> oracle_logits = std::move(oracle.logits);
  std::vector<float> reference_logits = std::move(reference.logits);
  std::vector<std::int32_t> fed(static_cast<std::size_t>(c.shape.batch));
  for (int step = 0; step < c.new_tokens; ++step) {
    if (step > 0) {
      for (std::size_t b = 0; b < fed.size(); ++b)
        fed[b] = out.tokens[b][static_cast<std::size_t>(step - 1)];
      oracle_logits = ref::decode_step(w64, oracle.cache, fed);
      if (separate) reference_logits = ref::decode_step(w32, reference.cache, fed);
    }
    const std::vector<float>& mine = run[static_cast<std::size_t>(step)];
    judge(step, mine, separate ? std::span<const float>(reference_logits) : mine, oracle_logits,
          separate);
    if (c.on_step) c.on_step();
  }
}

}  // namespace

bool within_rounding(std::span<const double> row, std::int32_t token, std::int32_t oracle_token,
                     double e, const SamplingOptions& s, double u) {
  const auto at = [&](std::int32_t i) { return row[static_cast<std::size_t>(i)]; };
  if (s.greedy) return at(oracle_token) - at(token) <= 2 * e;
  const int V = static_cast<int>(row.size());
  std::vector<int> set(static_cast<std::size_t>(V));
  for (int i = 0; i < V; ++i) set[static_cast<std::size_t>(i)] = i;
  if (s.top_k > 0 && s.top_k < V) {  // the sampler's set: (logit desc, index asc)
    std::partial_sort(set.begin(), set.begin() + s.top_k, set.end(),
                      [&](int x, int y) { return at(x) > at(y) || (at(x) == at(y) && x < y); });
    const double kth = at(set[static_cast<std::size_t>(s.top_k - 1)]);
    set.resize(static_cast<std::size_t>(s.top_k));
    if (std::find(set.begin(), set.end(), token) == set.end()) return kth - at(token) <= 2 * e;
  }
  double m = -INFINITY;
  for (const int i : set) m = std::max(m, at(i));
  double a = 0, w = 0, d = 0;
  for (const int i : set) {
    const double wi = std::exp((at(i) - m) / s.temperature);
    (i < token ? a : i == token ? w : d) += wi;
  }
  return seeded_reach(a, w, d, u, std::exp(e / s.temperature));
}

int generate_steps(const GenerateConfig& c) {
  return c.new_tokens * (c.check ? 2 : 1);
}

double GenerateResult::tpot() const {
  if (step_seconds.empty()) return 0;
  std::vector<double> s = step_seconds;
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

double GenerateResult::tokens_per_s() const {
  if (seconds <= 0 || tokens.empty()) return 0;
  return static_cast<double>(tokens.size() * tokens.front().size()) / seconds;
}

bool GenerateResult::divergences_explained() const {
  return std::all_of(divergences.begin(), divergences.end(),
                     [](const Divergence& d) { return d.near_tie; });
}

GenerateResult run_generate(const GenerateConfig& c) {
  if (c.strategy == nullptr || !c.weights) throw std::invalid_argument("generate: no strategy");
  if (const std::string why = c.strategy->why_invalid(c.shape); !why.empty())
    throw std::invalid_argument(c.strategy->name + ": " + why);
  if (c.new_tokens < 1)
    throw std::invalid_argument("generate: new_tokens=" + std::to_string(c.new_tokens) +
                                " must be >= 1");
  if (static_cast<std::size_t>(c.shape.batch) != c.prompts.size())
    throw std::invalid_argument("generate: batch=" + std::to_string(c.shape.batch) + " but " +
                                std::to_string(c.prompts.size()) + " prompts");
  for (std::size_t b = 0; b < c.prompts.size(); ++b) {
    const std::string seq = "generate: sequence " + std::to_string(b);
    const auto& p = c.prompts[b];
    if (p.empty()) throw std::invalid_argument(seq + " has an empty prompt");
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p[i] < 0 || p[i] >= c.shape.model.vocab)
        throw std::invalid_argument(seq + " position " + std::to_string(i) + " has token " +
                                    std::to_string(p[i]) + " outside [0, " +
                                    std::to_string(c.shape.model.vocab) + ")");
    const auto total = static_cast<std::int64_t>(p.size()) + c.new_tokens;
    if (c.shape.max_context > 0 && total > c.shape.max_context)
      throw std::invalid_argument(
          seq + " would hold " + std::to_string(total) +
          " tokens, beyond max_context=" + std::to_string(c.shape.max_context));
  }
  GenerateResult out;
  const std::vector<std::vector<float>> logits = run_session(c, out);
  check_kv(c, out);
  check_traffic(c, out);
  if (c.check) check_run(c, logits, out);
  return out;
}

}  // namespace tspemu::app
