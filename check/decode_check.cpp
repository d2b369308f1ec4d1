#include "tspemu/check/decode_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <numeric>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "tspemu/check/block_check.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/sampling.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::check {

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
}

std::string num(double v) {
  std::ostringstream s;
  s << std::setprecision(4) << v;
  return s.str();
}

[[noreturn]] void reject(const DecodeCheck& c, const std::string& why) {
  throw std::invalid_argument("check_decode " + c.name + ": " + why);
}

std::int64_t longest(const Prompts& p) {
  std::size_t n = 0;
  for (const auto& s : p) n = std::max(n, s.size());
  return static_cast<std::int64_t>(n);
}

// The positions a run needs per sequence: the prompt, every teacher-forced step's token, and
// free_run_steps - 1 fed tokens of the free run.
std::int64_t needed_context(const DecodeCheck& c) {
  return longest(c.prompts) + std::max(c.steps, c.free_run_steps - 1);
}

void validate(const DecodeCheck& c) {
  c.model.validate();
  if (c.ranks < 1) reject(c, "ranks=" + str(c.ranks) + " must be >= 1");
  if (c.prompts.empty()) reject(c, "no prompts (B=0)");
  if (c.steps < 0 || c.free_run_steps < 0)
    reject(c, "steps=" + str(c.steps) + " and free_run_steps=" + str(c.free_run_steps) +
                  " must be >= 0");
  if (!(c.k > 0)) reject(c, "k=" + num(c.k) + " must be positive");
  for (std::size_t b = 0; b < c.prompts.size(); ++b) {
    if (c.prompts[b].empty()) reject(c, "prompt of sequence " + str(std::int64_t(b)) + " is empty");
    for (std::size_t i = 0; i < c.prompts[b].size(); ++i)
      if (c.prompts[b][i] < 0 || c.prompts[b][i] >= c.model.vocab)
        reject(c, "sequence " + str(std::int64_t(b)) + " position " + str(std::int64_t(i)) +
                      " has token " + str(c.prompts[b][i]) + " outside [0, " + str(c.model.vocab) +
                      ")");
  }
  if (c.max_context != 0 && c.max_context < needed_context(c))
    reject(c, "max_context=" + str(c.max_context) + " is below the " + str(needed_context(c)) +
                  " positions the run needs (longest prompt + steps)");
  if (c.weights && c.weights->config.to_string() != c.model.to_string())
    reject(c, "the weights' config " + c.weights->config.to_string() +
                  " is not the check's model " + c.model.to_string());
}

// The reference's and the oracle's teacher-forced run: the oracle picks the tokens every side is
// fed; the reference's logits and cache (T: the schedule's scalar) are judged against it too. In
// double the reference is the oracle.
template <class T>
struct Truth {
  std::vector<std::vector<std::int32_t>> feed;  // [steps] of [B]
  std::vector<std::vector<T>> ref;              // [steps + 1] of [B, V]
  std::vector<std::vector<double>> oracle;      // [steps + 1] of [B, V]
  ref::KvCache<T> cache_ref;
  ref::KvCache<double> cache64;
};

template <class T>
Truth<T> teacher_forced_truth(const DecodeCheck& c, const ref::ModelWeights<T>& w,
                              const ref::ModelWeights<double>& w64, std::int64_t max_context) {
  Truth<T> t;
  const auto B = c.prompts.size();
  ref::Sampler greedy = ref::Sampler::greedy();
  auto oracle = ref::generate(w64, c.prompts, c.steps + 1, greedy, max_context);
  t.oracle = std::move(oracle.logits);
  t.cache64 = std::move(oracle.cache);
  t.feed.assign(static_cast<std::size_t>(c.steps), std::vector<std::int32_t>(B));
  for (std::size_t i = 0; i < t.feed.size(); ++i)
    for (std::size_t b = 0; b < B; ++b) t.feed[i][b] = oracle.tokens[b][i];
  if constexpr (std::is_same_v<T, double>) {
    t.ref = t.oracle;
    t.cache_ref = t.cache64;
  } else {
    auto pre = ref::prefill(w, c.prompts, max_context);
    t.ref.push_back(std::move(pre.logits));
    for (const auto& tokens : t.feed) t.ref.push_back(ref::decode_step(w, pre.cache, tokens));
    t.cache_ref = std::move(pre.cache);
  }
  return t;
}

// The judgement of a parallel tensor: float, the project's rule against the fp32 reference and
// the oracle (judge_tensor); double, max |parallel - oracle| <= rtol64 · max |oracle|
// (check_decode_double's header), the reference being the oracle.
TensorResult judge(const DecodeCheck& c, const std::string& name, std::span<const float> parallel,
                   std::span<const float> reference, std::span<const double> oracle) {
  return judge_tensor(name, parallel, reference, oracle, c.k);
}

TensorResult judge(const DecodeCheck& c, const std::string& name, std::span<const double> parallel,
                   std::span<const double> /*reference: the oracle*/,
                   std::span<const double> oracle) {
  TensorResult t;
  t.name = name;
  t.verdict = ref::check_close64(name, parallel, oracle, c.rtol64);
  const double err = t.verdict.candidate.finite ? t.verdict.candidate.max_abs : INFINITY;
  t.ratio = t.verdict.bound > 0 ? err / t.verdict.bound : (err > 0 ? INFINITY : 0.0);
  return t;
}

// Where each (sequence, position) of the cache sits in a flat [Σ_b S_b, NKV·hs] tensor.
struct CacheLayout {
  std::vector<std::int64_t> length, offset;  // [B]
  std::int64_t positions = 0;
  std::size_t row = 0;
  CacheLayout(const Prompts& prompts, int steps, std::size_t row_) : row(row_) {
    for (const auto& p : prompts) {
      offset.push_back(positions);
      length.push_back(static_cast<std::int64_t>(p.size()) + steps);
      positions += length.back();
    }
  }
  std::size_t at(int layer, int b, std::int64_t p) const {
    return (static_cast<std::size_t>(layer) * static_cast<std::size_t>(positions) +
            static_cast<std::size_t>(offset[static_cast<std::size_t>(b)] + p)) *
           row;
  }
};

// What one rank produced in the teacher-forced run.
template <class T>
struct RankRun {
  std::vector<std::vector<T>> logits;  // [steps + 1] of [B, V]
  std::vector<T> k, v;                 // [L, Σ_b S_b, NKV·hs]
  std::vector<char> held;              // [L, Σ_b S_b]
};

template <class T>
void check_logits_size(const std::vector<T>& logits, std::size_t want, int rank,
                       const std::string& phase) {
  if (logits.size() != want)
    throw std::invalid_argument("check_decode: rank " + str(rank) + "'s " + phase + " returned " +
                                str(std::int64_t(logits.size())) +
                                " logits, expected B·V = " + str(std::int64_t(want)));
}

template <class T>
void read_cache(const BasicRankDecoder<T>& dec, const CacheLayout& lay, int L, RankRun<T>& out) {
  const auto n = static_cast<std::size_t>(L) * static_cast<std::size_t>(lay.positions);
  out.k.assign(n * lay.row, T(0));
  out.v.assign(n * lay.row, T(0));
  out.held.assign(n, 0);
  for (int l = 0; l < L; ++l)
    for (int b = 0; b < static_cast<int>(lay.length.size()); ++b)
      for (std::int64_t p = 0; p < lay.length[static_cast<std::size_t>(b)]; ++p) {
        const std::size_t i = lay.at(l, b, p);
        out.held[i / lay.row] =
            dec.cache_entry(l, b, p, {out.k.data() + i, lay.row}, {out.v.data() + i, lay.row}) ? 1
                                                                                               : 0;
      }
}

// Runs fn on every rank of a fresh World; a failure becomes a "schedule" DecodeFailure naming the
// rank and the phase it was in (phase[r] is written by rank r's thread only; run() returning
// orders it before the read here).
bool run_ranks(const DecodeCheck& c, DecodeReport& report, const std::string& run_name,
               const std::function<void(Rank&, std::string& phase)>& fn) {
  WorldOptions opts;
  opts.ranks = c.ranks;
  opts.watchdog_timeout = c.watchdog_timeout;
  World world(opts);
  std::vector<std::string> phase(static_cast<std::size_t>(c.ranks));
  try {
    world.run([&](Rank& rank) { fn(rank, phase[static_cast<std::size_t>(rank.id())]); });
    return true;
  } catch (const RankFailure& e) {
    DecodeFailure f{"schedule", -1, -1, e.rank(), -1, -1, ""};
    f.detail = "the " + run_name + " run failed in " + phase[static_cast<std::size_t>(e.rank())] +
               ": " + e.diagnosis();
    report.failures.push_back(std::move(f));
  }
  return false;
}

template <class T>
std::string row_detail(const TensorResult& t, int V, std::span<const T> cand,
                       std::span<const T> ref, std::span<const double> oracle) {
  const std::size_t w = t.verdict.candidate.worst;
  std::ostringstream s;
  s << std::setprecision(4) << "parallel err " << t.verdict.candidate.max_abs << " > bound "
    << t.verdict.bound << " (reference err " << t.verdict.reference.max_abs << ", ratio " << t.ratio
    << ")";
  if (w < cand.size())
    s << std::setprecision(9) << "; worst at vocabulary id " << int(w) % V << ": parallel "
      << cand[w] << ", reference " << ref[w] << ", oracle " << oracle[w];
  return s.str();
}

// The rule on every (step, sequence, rank) row, and every rank's rows bitwise against rank 0's.
template <class T>
void judge_logits(const DecodeCheck& c, const Truth<T>& t, const std::vector<RankRun<T>>& runs,
                  DecodeReport& report) {
  const auto V = static_cast<std::size_t>(c.model.vocab);
  const int B = static_cast<int>(c.prompts.size());
  for (int i = 0; i <= c.steps; ++i)
    for (int b = 0; b < B; ++b) {
      const std::size_t o = static_cast<std::size_t>(b) * V;
      const auto si = static_cast<std::size_t>(i);
      const std::span<const T> ref(t.ref[si].data() + o, V);
      const std::span<const double> oracle(t.oracle[si].data() + o, V);
      for (int r = 0; r < c.ranks; ++r) {
        const std::span<const T> cand(runs[static_cast<std::size_t>(r)].logits[si].data() + o, V);
        const TensorResult tr = judge(c, "logits", cand, ref, oracle);
        ++report.rows_judged;
        const std::string where = DecodeFailure{"", i, b, r, -1, -1, ""}.where();
        if (tr.ratio > report.worst_logits_ratio || report.worst_logits_where.empty()) {
          report.worst_logits_ratio = tr.ratio;
          report.worst_logits_where = where;
        }
        if (!tr.ok())
          report.failures.push_back(
              {"logits", i, b, r, -1, -1, row_detail(tr, c.model.vocab, cand, ref, oracle)});
        if (r == 0) continue;
        const T* first = runs[0].logits[si].data() + o;
        for (std::size_t v = 0; v < V; ++v)
          if (std::memcmp(&cand[v], first + v, sizeof(T)) != 0) {
            std::ostringstream s;
            s << std::setprecision(17) << "differs from rank 0's at vocabulary id " << v << ": "
              << cand[v] << " vs " << first[v] << " (every rank must return bitwise-identical "
              << "logits, or the ranks sample different tokens)";
            report.failures.push_back({"logits", i, b, r, -1, -1, s.str()});
            break;
          }
      }
    }
}

// The cache of one layer, K or V, assembled from the ranks (the first holder of each position),
// judged by the rule; unheld positions and differing replicas fail first.
template <class T>
void judge_cache_tensor(const DecodeCheck& c, const CacheLayout& lay, const Truth<T>& t,
                        const std::vector<RankRun<T>>& runs, int l, bool is_k,
                        DecodeReport& report) {
  const std::string tensor = is_k ? "cache K" : "cache V";
  const std::string name = tensor + " layer " + str(l);
  const auto begin = lay.at(l, 0, 0), n = static_cast<std::size_t>(lay.positions) * lay.row;
  std::vector<T> got(n), ref(n);
  std::vector<double> oracle(n);
  std::vector<int> first(static_cast<std::size_t>(lay.positions), -1);
  int unheld = 0, replicas = 0;
  for (int b = 0; b < static_cast<int>(lay.length.size()); ++b)
    for (std::int64_t p = 0; p < lay.length[static_cast<std::size_t>(b)]; ++p) {
      const std::size_t i = lay.at(l, b, p), local = i - begin;
      const auto r32 = is_k ? t.cache_ref.k(l, b, p) : t.cache_ref.v(l, b, p);
      const auto r64 = is_k ? t.cache64.k(l, b, p) : t.cache64.v(l, b, p);
      std::copy(r32.begin(), r32.end(), ref.begin() + std::ptrdiff_t(local));
      std::copy(r64.begin(), r64.end(), oracle.begin() + std::ptrdiff_t(local));
      int& owner = first[local / lay.row];
      for (int r = 0; r < c.ranks; ++r) {
        const RankRun<T>& run = runs[static_cast<std::size_t>(r)];
        if (!run.held[i / lay.row]) continue;
        const T* row = (is_k ? run.k : run.v).data() + i;
        if (owner < 0) {
          owner = r;
          std::copy_n(row, lay.row, got.begin() + std::ptrdiff_t(local));
        } else if (std::memcmp(row, got.data() + local, lay.row * sizeof(T)) != 0 &&
                   replicas++ < 3) {
          report.failures.push_back({tensor, -1, b, r, l, p,
                                     "differs from rank " + str(owner) +
                                         "'s copy of the same position (replicas must be "
                                         "bitwise equal)"});
        }
      }
      if (owner < 0 && unheld++ < 3)
        report.failures.push_back({tensor, -1, b, -1, l, p, "held by no rank"});
    }
  if (unheld > 0) {
    report.cache.push_back("FAIL " + name + ": " + str(unheld) + " positions held by no rank");
    return;
  }
  const TensorResult tr = judge(c, name, std::span<const T>(got), std::span<const T>(ref), oracle);
  std::ostringstream line;
  line << (tr.ok() ? "ok   " : "FAIL ") << name << std::scientific << std::setprecision(3)
       << ": parallel err " << tr.verdict.candidate.max_abs << "  reference err "
       << tr.verdict.reference.max_abs << "  bound " << tr.verdict.bound << std::defaultfloat
       << "  ratio " << num(tr.ratio);
  report.cache.push_back(line.str());
  if (tr.ok()) return;
  const std::size_t w = tr.verdict.candidate.worst;
  const std::size_t pos = w / lay.row;
  std::size_t b = 0;
  while (b + 1 < lay.offset.size() && static_cast<std::int64_t>(pos) >= lay.offset[b + 1]) ++b;
  const std::int64_t p = static_cast<std::int64_t>(pos) - lay.offset[b];
  const std::size_t e = w % lay.row, hs = static_cast<std::size_t>(c.model.head_size());
  std::ostringstream s;
  s << std::setprecision(4) << "parallel err " << tr.verdict.candidate.max_abs << " > bound "
    << tr.verdict.bound << " (reference err " << tr.verdict.reference.max_abs
    << "); worst at KV head " << e / hs << " feature " << e % hs << std::setprecision(9)
    << ": parallel " << got[w] << ", reference " << ref[w] << ", oracle " << oracle[w];
  report.failures.push_back({tensor, -1, static_cast<int>(b), first[pos], l, p, s.str()});
}

template <class T>
using Factory = std::function<std::unique_ptr<BasicRankDecoder<T>>(BasicDecodeRank<T>&)>;

// The oracle's top-1 minus top-2 value of a row.
double top_margin(std::span<const double> oracle) {
  double top1 = -INFINITY, top2 = -INFINITY;
  for (const double x : oracle) {
    if (x > top1) {
      top2 = top1;
      top1 = x;
    } else if (x > top2) {
      top2 = x;
    }
  }
  return top1 - top2;
}

// The free greedy run: every rank's tokens against rank 0's and the reference's. Float: a token
// other than the reference's is a near-tie when near_tie() says so; double: always a failure.
template <class T>
void free_run(const DecodeCheck& c, const ref::ModelWeights<T>& w,
              const ref::ModelWeights<double>& w64, std::int64_t max_context,
              const Factory<T>& factory, DecodeReport& report) {
  const int n = c.free_run_steps, B = static_cast<int>(c.prompts.size()), V = c.model.vocab;
  const auto Vz = static_cast<std::size_t>(V);
  report.free_run_steps = n;
  std::vector<std::vector<std::vector<std::int32_t>>> tokens(static_cast<std::size_t>(c.ranks));
  const bool ran = run_ranks(c, report, "free-running", [&](Rank& rank, std::string& phase) {
    phase = "the factory";
    BasicDecodeRank<T> dr(rank, w, B, max_context);
    std::unique_ptr<BasicRankDecoder<T>> dec = factory(dr);
    ref::Sampler greedy = ref::Sampler::greedy();
    auto& mine = tokens[static_cast<std::size_t>(rank.id())];
    for (int i = 0; i < n; ++i) {
      phase = i == 0 ? "prefill" : "decode step " + str(i);
      const std::vector<T> logits =
          i == 0 ? dec->prefill(c.prompts) : dec->decode_step(mine.back());
      check_logits_size(logits, std::size_t(B) * Vz, rank.id(), phase);
      mine.push_back(greedy.sample(std::span<const T>(logits), B, V));
    }
  });
  if (!ran) return;
  ref::Sampler greedy = ref::Sampler::greedy();
  const auto want = ref::generate(w, c.prompts, n, greedy, max_context);
  // The oracle on the reference's context, for the margins of the divergences (in double, the
  // reference's own logits).
  std::vector<std::vector<double>> oracle;
  if constexpr (std::is_same_v<T, double>) {
    oracle = want.logits;
  } else {
    auto pre = ref::prefill(w64, c.prompts, max_context);
    oracle.push_back(std::move(pre.logits));
    for (int i = 0; i + 1 < n; ++i) {
      std::vector<std::int32_t> fed(static_cast<std::size_t>(B));
      for (int b = 0; b < B; ++b) fed[std::size_t(b)] = want.tokens[std::size_t(b)][std::size_t(i)];
      oracle.push_back(ref::decode_step(w64, pre.cache, fed));
    }
  }
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < n; ++i) {
      const auto si = std::size_t(i), sb = std::size_t(b);
      const std::int32_t t0 = tokens[0][si][sb], tr = want.tokens[sb][si];
      bool differ = false;
      for (int r = 1; r < c.ranks; ++r)
        if (const std::int32_t t = tokens[std::size_t(r)][si][sb]; t != t0) {
          report.failures.push_back({"tokens", i, b, r, -1, -1,
                                     "emitted token " + str(t) + " where rank 0 emitted " +
                                         str(t0) + " (every rank must emit the same token)"});
          differ = true;
        }
      if (t0 != tr) {
        const std::span<const double> o(oracle[si].data() + sb * Vz, Vz);
        double margin = top_margin(o);
        bool tie = false;
        if constexpr (!std::is_same_v<T, double>)
          tie = near_tie(o, std::span<const float>(want.logits[si].data() + sb * Vz, Vz), t0, tr,
                         c.k, &margin);
        const std::string what = "emitted token " + str(t0) + " where the reference emitted " +
                                 str(tr) + "; the oracle gives them " + num(o[std::size_t(t0)]) +
                                 " and " + num(o[std::size_t(tr)]) + ", its top-1/top-2 margin " +
                                 num(margin);
        if (tie)
          report.near_ties.push_back(DecodeFailure{"", i, b, 0, -1, -1, ""}.where() + ": " + what +
                                     " (a near-tie: within rounding)");
        else
          report.failures.push_back(
              {"tokens", i, b, 0, -1, -1,
               what + (std::is_same_v<T, double>
                           ? ": in double a schedule picks the reference's tokens"
                           : ": beyond 2·(k·err(reference) + tiny), not a tie")});
        differ = true;
      }
      if (differ) break;  // the contexts differ from here on
    }
}

std::string headline(const DecodeCheck& c, std::int64_t max_context, bool in_double) {
  std::ostringstream h;
  h << "check " << c.name << ": decode on " << c.ranks << " ranks, B=" << c.prompts.size()
    << " prompts of lengths";
  for (const auto& p : c.prompts) h << " " << p.size();
  h << ", " << c.steps << " steps teacher-forced on the fp64 oracle's greedy tokens";
  if (c.free_run_steps > 0) h << ", " << c.free_run_steps << " tokens free-running";
  const ref::ModelConfig& m = c.model;
  h << "; L=" << m.n_layers << " C=" << m.hidden << " NH=" << m.n_heads << " NKV=" << m.n_kv_heads
    << " F=" << m.ffn << " V=" << m.vocab << ", max_context=" << max_context
    << "; rule per (step, sequence, rank): ";
  if (in_double)
    h << "in double, |parallel - oracle| <= " << c.rtol64 << " * max |oracle|";
  else
    h << "err(parallel fp32) <= " << c.k
      << " * err(reference fp32) + tiny (4 fp32 ulps of the row's largest |oracle|)";
  return h.str();
}

}  // namespace

template <class T>
bool BasicRankDecoder<T>::cache_entry(int layer, int seq, std::int64_t pos, std::span<T> k,
                                      std::span<T> v) const {
  const tsp::RankKvCache<T>* cache = kv_cache();
  if (!cache)
    throw std::logic_error(
        "check_decode: check_cache is set but the schedule offers no cache (override "
        "RankDecoder::cache_entry or kv_cache, or set DecodeCheck::check_cache = false)");
  if (!cache->holds(layer, seq, pos)) return false;
  const auto kr = cache->k(layer, seq, pos), vr = cache->v(layer, seq, pos);
  if (kr.size() != k.size() || vr.size() != v.size())
    throw std::logic_error("check_decode: rank " + str(cache->rank()) + "'s cache rows hold " +
                           str(std::int64_t(kr.size())) +
                           " elements, the model NKV·hs = " + str(std::int64_t(k.size())));
  std::copy(kr.begin(), kr.end(), k.begin());
  std::copy(vr.begin(), vr.end(), v.begin());
  return true;
}

template class BasicRankDecoder<float>;
template class BasicRankDecoder<double>;

template <class T>
TensorShape BasicDecodeRank<T>::shape(std::string_view name) const {
  const ref::ModelConfig& m = config();
  if (name == "embed" || name == "lm_head") return {std::string(name), m.vocab, m.hidden, 0, 0};
  if (name == "final_norm") return {std::string(name), 1, m.hidden, 0, 0};
  const ref::LayerTensor* t = ref::find_layer_tensor(name);
  if (!t)
    throw std::invalid_argument("check_decode: no tensor named '" + std::string(name) +
                                "' (a layer tensor, or embed, lm_head, final_norm)");
  const ref::LayerTensorShape s = ref::layer_tensor_shape(m, *t);
  return {std::string(name), s.rows, s.cols, s.heads, s.head_axis};
}

template <class T>
Buffer<T> BasicDecodeRank<T>::weight(int layer, std::string_view name, const ShardMap& map) {
  const TensorShape t = shape(name);
  const std::vector<T>* src = nullptr;
  if (layer < 0) {
    src = name == "embed" ? &master_.embed
                          : (name == "lm_head" ? &master_.head() : &master_.final_norm);
    if (t.name != "embed" && t.name != "lm_head" && t.name != "final_norm")
      throw std::invalid_argument("check_decode: '" + t.name + "' is a layer tensor: give a layer");
  } else {
    if (layer >= static_cast<int>(master_.layers.size()) || !ref::find_layer_tensor(name))
      throw std::invalid_argument("check_decode: no tensor '" + t.name + "' of layer " +
                                  str(layer) + " (L=" + str(config().n_layers) + ")");
    for (const auto& [n, v] : master_.layers[static_cast<std::size_t>(layer)].named())
      if (name == n) src = v;
  }
  const std::vector<Rect> rects = map.resolve(t);
  auto buf = arena().template allocate<T>(static_cast<std::size_t>(element_count(rects)),
                                          Category::weights);
  cut(src->data(), t, rects, buf.data());
  return buf;
}

template <class T>
BasicTpLayer<T> BasicDecodeRank<T>::tp_layer(int layer) {
  const int D = rank_.size(), r = rank_.id();
  return {
      weight(layer, "input_norm", replicated()),      weight(layer, "wq", head_sharded(r, D)),
      weight(layer, "wk", head_sharded(r, D)),        weight(layer, "wv", head_sharded(r, D)),
      weight(layer, "wo", head_sharded(r, D)),        weight(layer, "post_norm", replicated()),
      weight(layer, "w_gate", column_parallel(r, D)), weight(layer, "w_up", column_parallel(r, D)),
      weight(layer, "w_down", row_parallel(r, D))};
}

template class BasicDecodeRank<float>;
template class BasicDecodeRank<double>;

std::string DecodeFailure::where() const {
  std::string s;
  auto add = [&s](const char* what, std::int64_t v) {
    if (v >= 0) s += (s.empty() ? "" : " ") + std::string(what) + " " + str(v);
  };
  add("step", step);
  add("layer", layer);
  add("sequence", sequence);
  add("position", position);
  add("rank", rank);
  return s;
}

std::vector<const DecodeFailure*> DecodeReport::find(std::string_view tensor) const {
  std::vector<const DecodeFailure*> out;
  for (const DecodeFailure& f : failures)
    if (f.tensor == tensor) out.push_back(&f);
  return out;
}

void DecodeReport::print(std::ostream& out, std::size_t max_per_tensor) const {
  out << headline << "\n";
  auto status = [this](const char* tensor) { return find(tensor).empty() ? "ok  " : "FAIL"; };
  if (rows_judged > 0)
    out << "  " << status("logits") << " logits: " << rows_judged
        << " (step, sequence, rank) rows judged, every rank's bitwise against rank 0's; worst "
        << "ratio " << num(worst_logits_ratio) << " at " << worst_logits_where << "\n";
  for (const std::string& line : cache) out << "  " << line << "\n";
  if (free_run_steps > 0)
    out << "  " << status("tokens") << " free run: " << free_run_steps
        << " greedy tokens per sequence against the reference's and rank 0's, " << near_ties.size()
        << " near-ties\n";
  for (const std::string& t : near_ties) out << "       near-tie: " << t << "\n";
  for (const char* tensor : {"schedule", "logits", "cache K", "cache V", "tokens"}) {
    const auto found = find(tensor);
    for (std::size_t i = 0; i < found.size() && i < max_per_tensor; ++i)
      out << "  FAIL " << tensor << " " << found[i]->where() << ": " << found[i]->detail << "\n";
    if (found.size() > max_per_tensor)
      out << "  ... and " << found.size() - max_per_tensor << " more " << tensor << " failures\n";
  }
  out << "verdict: " << (ok() ? "PASS" : "FAIL") << "\n";
}

bool near_tie(std::span<const double> oracle, std::span<const float> reference, int t_parallel,
              int t_reference, double k, double* margin) {
  const ref::ErrorStats err = ref::measure(reference, oracle);
  const double bound = k * err.max_abs + ref::default_tiny(oracle);
  if (margin) *margin = top_margin(oracle);
  const double gap = std::abs(oracle[static_cast<std::size_t>(t_parallel)] -
                              oracle[static_cast<std::size_t>(t_reference)]);
  return err.finite && gap <= 2 * bound;
}

Prompts seeded_prompts(int vocab, const std::vector<int>& lengths, std::uint64_t seed) {
  if (vocab < 1) throw std::invalid_argument("seeded_prompts: vocab=" + str(vocab) + " < 1");
  ref::SplitMix64 rng(seed ^ ref::fnv1a64("check prompts"));
  Prompts p;
  for (const int len : lengths) {
    if (len < 1)
      throw std::invalid_argument("seeded_prompts: a prompt length " + str(len) + " < 1");
    std::vector<std::int32_t> t(static_cast<std::size_t>(len));
    for (auto& x : t) x = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(vocab));
    p.push_back(std::move(t));
  }
  return p;
}

namespace {

// check_decode and check_decode_double on the schedule's weights w (T) and the oracle's w64.
template <class T>
DecodeReport run_check(const DecodeCheck& c, const ref::ModelWeights<T>& w,
                       const ref::ModelWeights<double>& w64, std::int64_t max_context,
                       const Factory<T>& factory) {
  const Truth<T> truth = teacher_forced_truth(c, w, w64, max_context);
  const int B = static_cast<int>(c.prompts.size()), L = c.model.n_layers;
  const CacheLayout lay(c.prompts, c.steps, static_cast<std::size_t>(c.model.kv_dim()));

  DecodeReport report;
  report.headline = headline(c, max_context, std::is_same_v<T, double>);
  std::vector<RankRun<T>> runs(static_cast<std::size_t>(c.ranks));
  const bool ran = run_ranks(c, report, "teacher-forced", [&](Rank& rank, std::string& phase) {
    RankRun<T>& out = runs[static_cast<std::size_t>(rank.id())];
    const std::size_t want = std::size_t(B) * std::size_t(c.model.vocab);
    phase = "the factory";
    BasicDecodeRank<T> dr(rank, w, B, max_context);
    std::unique_ptr<BasicRankDecoder<T>> dec = factory(dr);
    phase = "prefill";
    out.logits.push_back(dec->prefill(c.prompts));
    check_logits_size(out.logits.back(), want, rank.id(), phase);
    for (int i = 0; i < c.steps; ++i) {
      phase = "decode step " + str(i + 1);
      out.logits.push_back(dec->decode_step(truth.feed[static_cast<std::size_t>(i)]));
      check_logits_size(out.logits.back(), want, rank.id(), phase);
    }
    phase = "the cache read";
    if (c.check_cache) read_cache(*dec, lay, L, out);
  });
  if (ran) {
    judge_logits(c, truth, runs, report);
    if (c.check_cache)
      for (int l = 0; l < L; ++l)
        for (const bool is_k : {true, false})
          judge_cache_tensor(c, lay, truth, runs, l, is_k, report);
  }
  // A schedule that failed its teacher-forced run would fail the free run again: one report.
  if (ran && c.free_run_steps > 0) free_run(c, w, w64, max_context, factory, report);
  return report;
}

// The float weights the check decodes with: given, or ref::init_weights(model, seed) rounded.
ref::ModelWeights<float> check_weights(const DecodeCheck& c) {
  return c.weights ? *c.weights
                   : ref::convert_weights<float>(ref::init_weights<double>(c.model, c.seed));
}

std::int64_t context_of(const DecodeCheck& c) {
  return c.max_context != 0 ? c.max_context : needed_context(c);
}

}  // namespace

DecodeReport check_decode(const DecodeCheck& c, const DecoderFactory& factory) {
  validate(c);
  // The oracle sees exactly the float weights, so only the arithmetic differs.
  const ref::ModelWeights<float> w32 = check_weights(c);
  const auto w64 = ref::convert_weights<double>(w32);
  return run_check<float>(c, w32, w64, context_of(c), factory);
}

DecodeReport check_decode_double(const DecodeCheck& c, const DecoderFactory64& factory) {
  validate(c);
  if (!(c.rtol64 > 0)) reject(c, "rtol64=" + num(c.rtol64) + " must be positive");
  // The float weights widened: the schedule and the oracle decode with the same doubles.
  const auto w64 = ref::convert_weights<double>(check_weights(c));
  return run_check<double>(c, w64, w64, context_of(c), factory);
}

}  // namespace tspemu::check
