#include "decode_parts.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/collectives.hpp"

namespace tspemu::tsp::detail {

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
}

// after - before, kind by kind (the counters only grow within a run).
TrafficCounters difference(const TrafficCounters& after, const TrafficCounters& before) {
  TrafficCounters d;
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    d.by_kind[k] = {after.by_kind[k].calls - before.by_kind[k].calls,
                    after.by_kind[k].bytes_sent - before.by_kind[k].bytes_sent,
                    after.by_kind[k].bytes_received - before.by_kind[k].bytes_received};
  }
  return d;
}

}  // namespace

DecodeStep prefill_step(const std::string& who, const Prompts& prompts, int B, int V,
                        std::int64_t max_context) {
  auto reject = [&who](const std::string& why) { throw std::invalid_argument(who + ": " + why); };
  if (prompts.size() != static_cast<std::size_t>(B))
    reject("prefill: " + str(static_cast<std::int64_t>(prompts.size())) +
           " prompts for batch B=" + str(B));
  DecodeStep step;
  step.prefill = true;
  for (int b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<std::size_t>(b)];
    if (p.empty()) reject("prefill: prompt of sequence " + str(b) + " is empty");
    if (static_cast<std::int64_t>(p.size()) > max_context)
      throw std::length_error(who + ": prefill: sequence " + str(b) + "'s prompt of " +
                              str(static_cast<std::int64_t>(p.size())) +
                              " positions exceeds max_context=" + str(max_context));
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p[i] < 0 || p[i] >= V)
        reject("prefill: sequence " + str(b) + " position " + str(static_cast<std::int64_t>(i)) +
               " has token " + str(p[i]) + " outside [0, " + str(V) + ")");
    step.offset.push_back(step.tokens.size());
    step.count.push_back(static_cast<int>(p.size()));
    step.tokens.insert(step.tokens.end(), p.begin(), p.end());
    for (std::size_t i = 0; i < p.size(); ++i)
      step.positions.push_back(static_cast<std::int64_t>(i));
  }
  return step;
}

DecodeStep next_step(const std::string& who, std::span<const std::int32_t> tokens,
                     const std::vector<std::int64_t>& lengths, int V, std::int64_t max_context,
                     bool prefilled) {
  auto reject = [&who](const std::string& why) { throw std::invalid_argument(who + ": " + why); };
  const int B = static_cast<int>(lengths.size());
  if (!prefilled) reject("decode_step before prefill");
  if (tokens.size() != lengths.size())
    reject("decode_step: " + str(static_cast<std::int64_t>(tokens.size())) +
           " tokens for batch B=" + str(B) + " (one per sequence)");
  DecodeStep step;
  for (int b = 0; b < B; ++b) {
    const std::int64_t pos = lengths[static_cast<std::size_t>(b)];
    const std::int32_t t = tokens[static_cast<std::size_t>(b)];
    if (t < 0 || t >= V)
      reject("decode_step: sequence " + str(b) + " position " + str(pos) + " has token " + str(t) +
             " outside [0, " + str(V) + ")");
    if (pos >= max_context)
      throw std::length_error(who + ": decode_step: sequence " + str(b) + " would hold position " +
                              str(pos) + ", beyond max_context=" + str(max_context));
    step.offset.push_back(static_cast<std::size_t>(b));
    step.count.push_back(1);
    step.tokens.push_back(t);
    step.positions.push_back(pos);
  }
  return step;
}

std::vector<std::int64_t> step_lengths(const DecodeStep& step) {
  return {step.count.begin(), step.count.end()};
}

void measured(Rank& rank, TrafficCounters& into, const std::function<void()>& collective) {
  const TrafficCounters before = rank.counters();
  collective();
  into += difference(rank.counters(), before);
}

template <class T>
Buffer<T> rows_of(Arena& a, const std::vector<T>& master, std::size_t cols, std::size_t first,
                  std::size_t n) {
  Buffer<T> out = a.allocate<T>(n * cols, Category::weights);
  std::copy_n(master.begin() + static_cast<std::ptrdiff_t>(first * cols), n * cols, out.data());
  return out;
}

template <class T>
Buffer<T> cols_of(Arena& a, const std::vector<T>& master, std::size_t rows, std::size_t ld,
                  std::size_t first, std::size_t n) {
  Buffer<T> out = a.allocate<T>(rows * n, Category::weights);
  for (std::size_t i = 0; i < rows; ++i)
    std::copy_n(master.begin() + static_cast<std::ptrdiff_t>(i * ld + first), n,
                out.data() + i * n);
  return out;
}

template <class T>
VocabShard<T>::VocabShard(Arena& a, const ref::ModelWeights<T>& master, int n_, int r_)
    : n(n_), r(r_), Vl(master.config.vocab / n_) {
  const auto C = static_cast<std::size_t>(master.config.hidden);
  const auto first = static_cast<std::size_t>(r) * static_cast<std::size_t>(Vl);
  embed = rows_of(a, master.embed, C, first, static_cast<std::size_t>(Vl));
  if (!master.config.tie_embeddings)
    head = rows_of(a, master.lm_head, C, first, static_cast<std::size_t>(Vl));
  final_norm = rows_of(a, master.final_norm, C, 0, 1);
}

template <class T>
void embed(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st, int C,
           Buffer<T>& x, TrafficCounters& traffic) {
  const auto Cz = static_cast<std::size_t>(C);
  for (std::size_t i = 0; i < st.tokens.size(); ++i) {
    const int t = st.tokens[i];
    if (t / v.Vl == v.r)
      std::copy_n(v.embed.data() + static_cast<std::size_t>(t - v.r * v.Vl) * Cz, Cz,
                  x.data() + i * Cz);
  }
  if (comm.size() > 1) measured(rank, traffic, [&] { all_reduce<T>(comm, x.span()); });
}

template <class T>
std::vector<T> lm_head(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st,
                       const ref::ModelConfig& m, const Buffer<T>& x, TrafficCounters& traffic) {
  Arena& a = rank.arena();
  const auto Vz = static_cast<std::size_t>(v.Vl), Bz = st.count.size();
  const auto V = static_cast<std::size_t>(m.vocab), C = static_cast<std::size_t>(m.hidden);
  const auto n = static_cast<std::size_t>(v.n);
  auto xn = a.allocate<T>(C, Category::workspace);
  auto rstd = a.allocate<T>(1, Category::workspace);
  auto mine = a.allocate<T>(Bz * Vz, Category::workspace);
  auto all = a.allocate<T>(n * Bz * Vz, Category::comm);
  for (std::size_t b = 0; b < Bz; ++b) {
    const std::size_t last = st.offset[b] + static_cast<std::size_t>(st.count[b]) - 1;
    ref::rmsnorm_forward(xn.data(), rstd.data(), x.data() + last * C, v.final_norm.data(), 1,
                         m.hidden, m.norm_eps);
    ref::matmul_nt(mine.data() + b * Vz, xn.data(), v.head_rows(), 1, v.Vl, m.hidden);
  }
  if (n > 1)
    measured(rank, traffic, [&] {
      all_gather<T>(comm, std::span<const T>(mine.data(), mine.size()), all.span());
    });
  else
    std::copy(mine.begin(), mine.end(), all.begin());
  std::vector<T> logits(Bz * V);
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t b = 0; b < Bz; ++b)
      std::copy_n(all.data() + (p * Bz + b) * Vz, Vz, logits.data() + b * V + p * Vz);
  return logits;
}

template <class T>
MlpShard<T>::MlpShard(Arena& a, const ref::LayerWeights<T>& master, const ref::ModelConfig& m,
                      int n, int r)
    : Fl(m.ffn / n) {
  const auto C = static_cast<std::size_t>(m.hidden), F = static_cast<std::size_t>(m.ffn);
  const auto f = static_cast<std::size_t>(Fl), first = static_cast<std::size_t>(r) * f;
  gate = rows_of(a, master.w_gate, C, first, f);
  up = rows_of(a, master.w_up, C, first, f);
  down = cols_of(a, master.w_down, C, F, first, f);
  post_norm = rows_of(a, master.post_norm, C, 0, 1);
}

template <class T>
void mlp_block(Rank& rank, Comm& comm, const MlpShard<T>& w, const DecodeStep& st,
               const ref::ModelConfig& m, const Buffer<T>& mid, Buffer<T>& x,
               TrafficCounters& traffic) {
  Arena& a = rank.arena();
  const auto rows = static_cast<std::size_t>(st.rows()), C = static_cast<std::size_t>(m.hidden);
  const std::size_t NF = rows * static_cast<std::size_t>(w.Fl);
  auto xn = a.allocate<T>(rows * C, Category::workspace);
  auto rstd = a.allocate<T>(rows, Category::workspace);
  auto gate = a.allocate<T>(NF, Category::workspace);
  auto up = a.allocate<T>(NF, Category::workspace);
  auto h = a.allocate<T>(NF, Category::workspace);
  auto partial = a.allocate<T>(rows * C, Category::workspace);
  ref::rmsnorm_forward(xn.data(), rstd.data(), mid.data(), w.post_norm.data(), st.rows(), m.hidden,
                       m.norm_eps);
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    const int n = st.count[b];
    const std::size_t f = o * static_cast<std::size_t>(w.Fl);
    ref::matmul_nt(gate.data() + f, xn.data() + o * C, w.gate.data(), n, w.Fl, m.hidden);
    ref::matmul_nt(up.data() + f, xn.data() + o * C, w.up.data(), n, w.Fl, m.hidden);
    ref::silu_mul_forward(h.data() + f, gate.data() + f, up.data() + f,
                          static_cast<std::size_t>(n) * static_cast<std::size_t>(w.Fl));
    ref::matmul_nt(partial.data() + o * C, h.data() + f, w.down.data(), n, m.hidden, w.Fl);
  }
  if (comm.size() > 1) measured(rank, traffic, [&] { all_reduce<T>(comm, partial.span()); });
  for (std::size_t i = 0; i < rows * C; ++i) x[i] = mid[i] + partial[i];
}

#define TSPEMU_DECODE_PARTS(T)                                                                     \
  template Buffer<T> rows_of(Arena&, const std::vector<T>&, std::size_t, std::size_t,              \
                             std::size_t);                                                         \
  template Buffer<T> cols_of(Arena&, const std::vector<T>&, std::size_t, std::size_t, std::size_t, \
                             std::size_t);                                                         \
  template struct VocabShard<T>;                                                                   \
  template void embed(Rank&, Comm&, const VocabShard<T>&, const DecodeStep&, int, Buffer<T>&,      \
                      TrafficCounters&);                                                           \
  template std::vector<T> lm_head(Rank&, Comm&, const VocabShard<T>&, const DecodeStep&,           \
                                  const ref::ModelConfig&, const Buffer<T>&, TrafficCounters&);    \
  template struct MlpShard<T>;                                                                     \
  template void mlp_block(Rank&, Comm&, const MlpShard<T>&, const DecodeStep&,                     \
                          const ref::ModelConfig&, const Buffer<T>&, Buffer<T>&,                   \
                          TrafficCounters&);
TSPEMU_DECODE_PARTS(float)
TSPEMU_DECODE_PARTS(double)
#undef TSPEMU_DECODE_PARTS

}  // namespace tspemu::tsp::detail
