#include "decode_parts.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/reference/silu_mul.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/kv_ownership.hpp"

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
void embed_rows(const VocabShard<T>& v, const DecodeStep& st, int C, T* x) {
  const auto Cz = static_cast<std::size_t>(C);
  for (std::size_t i = 0; i < st.tokens.size(); ++i) {
    const int t = st.tokens[i];
    if (t / v.Vl == v.r)
      std::copy_n(v.embed.data() + static_cast<std::size_t>(t - v.r * v.Vl) * Cz, Cz, x + i * Cz);
  }
}

template <class T>
void embed(Rank& rank, Comm& comm, const VocabShard<T>& v, const DecodeStep& st, int C,
           Buffer<T>& x, TrafficCounters& traffic) {
  embed_rows(v, st, C, x.data());
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
void mlp_partial(Arena& a, const MlpShard<T>& w, const DecodeStep& st, const ref::ModelConfig& m,
                 const T* xn, T* partial) {
  const auto rows = static_cast<std::size_t>(st.rows()), C = static_cast<std::size_t>(m.hidden);
  const std::size_t NF = rows * static_cast<std::size_t>(w.Fl);
  auto gate = a.allocate<T>(NF, Category::workspace);
  auto up = a.allocate<T>(NF, Category::workspace);
  auto h = a.allocate<T>(NF, Category::workspace);
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    const int n = st.count[b];
    const std::size_t f = o * static_cast<std::size_t>(w.Fl);
    ref::matmul_nt(gate.data() + f, xn + o * C, w.gate.data(), n, w.Fl, m.hidden);
    ref::matmul_nt(up.data() + f, xn + o * C, w.up.data(), n, w.Fl, m.hidden);
    ref::silu_mul_forward(h.data() + f, gate.data() + f, up.data() + f,
                          static_cast<std::size_t>(n) * static_cast<std::size_t>(w.Fl));
    ref::matmul_nt(partial + o * C, h.data() + f, w.down.data(), n, m.hidden, w.Fl);
  }
}

template <class T>
void mlp_block(Rank& rank, Comm& comm, const MlpShard<T>& w, const DecodeStep& st,
               const ref::ModelConfig& m, const Buffer<T>& mid, Buffer<T>& x,
               TrafficCounters& traffic) {
  Arena& a = rank.arena();
  const auto rows = static_cast<std::size_t>(st.rows()), C = static_cast<std::size_t>(m.hidden);
  auto xn = a.allocate<T>(rows * C, Category::workspace);
  auto rstd = a.allocate<T>(rows, Category::workspace);
  auto partial = a.allocate<T>(rows * C, Category::workspace);
  ref::rmsnorm_forward(xn.data(), rstd.data(), mid.data(), w.post_norm.data(), st.rows(), m.hidden,
                       m.norm_eps);
  mlp_partial(a, w, st, m, xn.data(), partial.data());
  if (comm.size() > 1) measured(rank, traffic, [&] { all_reduce<T>(comm, partial.span()); });
  for (std::size_t i = 0; i < rows * C; ++i) x[i] = mid[i] + partial[i];
}

KvHeadShard kv_head_shard(const ref::ModelConfig& m, int n, int a) {
  if (n <= m.n_kv_heads) return {a * (m.n_kv_heads / n), m.n_kv_heads / n};
  return {a / (n / m.n_kv_heads), 1};
}

void require_kv_heads_fit(const std::string& who, const char* name, int n, int nkv) {
  if (nkv % n != 0 && n % nkv != 0)
    throw std::invalid_argument(
        who + ": " + name + "=" + str(n) + " neither divides NKV=" + str(nkv) +
        " nor is a multiple of it: a shard's query heads would span a KV head split between "
        "shards (" +
        name + " | NKV shards the KV heads, NKV | " + name + " duplicates each " + name +
        "/NKV times)");
}

template <class T>
QkvShard<T>::QkvShard(Arena& a, const ref::LayerWeights<T>& master, const ref::ModelConfig& m,
                      int n, int shard)
    : NHl(m.n_heads / n), kv(kv_head_shard(m, n, shard)) {
  const auto C = static_cast<std::size_t>(m.hidden), hs = static_cast<std::size_t>(m.head_size());
  const std::size_t q = static_cast<std::size_t>(NHl) * hs;
  const std::size_t k = static_cast<std::size_t>(kv.count) * hs;
  const std::size_t k0 = static_cast<std::size_t>(kv.first) * hs;
  wq = rows_of(a, master.wq, C, static_cast<std::size_t>(shard) * q, q);
  wk = rows_of(a, master.wk, C, k0, k);
  wv = rows_of(a, master.wv, C, k0, k);
  input_norm = rows_of(a, master.input_norm, C, 0, 1);
}

template <class T>
void project_qkv(const QkvShard<T>& w, const ref::ModelConfig& m, const DecodeStep& st,
                 const Buffer<T>& x, Buffer<T>& xn, Buffer<T>& rstd, Buffer<T>& q, Buffer<T>& k,
                 Buffer<T>& v) {
  ref::rmsnorm_forward(xn.data(), rstd.data(), x.data(), w.input_norm.data(), st.rows(), m.hidden,
                       m.norm_eps);
  qkv_from_normed(w, m, st, xn, q, k, v);
}

template <class T>
void qkv_from_normed(const QkvShard<T>& w, const ref::ModelConfig& m, const DecodeStep& st,
                     const Buffer<T>& xn, Buffer<T>& q, Buffer<T>& k, Buffer<T>& v) {
  const auto C = static_cast<std::size_t>(m.hidden), hs = static_cast<std::size_t>(m.head_size());
  const std::size_t qd = static_cast<std::size_t>(w.NHl) * hs;
  const std::size_t kd = static_cast<std::size_t>(w.kv.count) * hs;
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    const int n = st.count[b];
    const T* xb = xn.data() + o * C;
    ref::matmul_nt(q.data() + o * qd, xb, w.wq.data(), n, static_cast<int>(qd), m.hidden);
    ref::matmul_nt(k.data() + o * kd, xb, w.wk.data(), n, static_cast<int>(kd), m.hidden);
    ref::matmul_nt(v.data() + o * kd, xb, w.wv.data(), n, static_cast<int>(kd), m.hidden);
    const std::int64_t* pos = st.positions.data() + o;
    ref::rope_forward(q.data() + o * qd, pos, 1, n, w.NHl, m.head_size(), m.rope_base);
    ref::rope_forward(k.data() + o * kd, pos, 1, n, w.kv.count, m.head_size(), m.rope_base);
  }
}

template <class T>
void exchange_partials(Rank& rank, Comm& comm, const DecodeStep& st, const T* out, const T* lse,
                       int H, int hs, Buffer<T>& att, TrafficCounters& traffic) {
  const auto G = static_cast<std::size_t>(comm.size());
  const auto rows = static_cast<std::size_t>(st.rows());
  const std::size_t Hn = static_cast<std::size_t>(H) / G, Hz = static_cast<std::size_t>(H);
  const std::size_t qn = Hn * static_cast<std::size_t>(hs), qd = Hz * static_cast<std::size_t>(hs);
  const std::size_t block = rows * qn + rows * Hn;  // one member's: out rows, then lse
  Arena& a = rank.arena();
  auto send = a.allocate<T>(G * block, Category::comm);
  auto recv = a.allocate<T>(G * block, Category::comm);
  auto att_lse = a.allocate<T>(rows * Hn, Category::workspace);
  for (std::size_t p = 0; p < G; ++p) {
    T* blk = send.data() + p * block;
    for (std::size_t n = 0; n < rows; ++n) std::copy_n(out + n * qd + p * qn, qn, blk + n * qn);
    for (std::size_t b = 0; b < st.count.size(); ++b) {
      const std::size_t o = st.offset[b], nb = static_cast<std::size_t>(st.count[b]);
      std::copy_n(lse + Hz * o + p * Hn * nb, Hn * nb, blk + rows * qn + Hn * o);
    }
  }
  if (G > 1) {
    measured(rank, traffic, [&] {
      all_to_all<T>(comm, std::span<const T>(send.data(), send.size()), recv.span());
    });
  } else {
    std::copy(send.begin(), send.end(), recv.begin());
  }
  std::fill(att.begin(), att.end(), T(0));
  std::fill(att_lse.begin(), att_lse.end(), -std::numeric_limits<T>::infinity());
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    const ref::AttentionDims md{1, st.count[b], 0, static_cast<int>(Hn), static_cast<int>(Hn), hs};
    for (std::size_t p = 0; p < G; ++p) {  // member order: the same sums on every head owner
      const T* blk = recv.data() + p * block;
      ref::merge_attention_partials(att.data() + o * qn, att_lse.data() + Hn * o, blk + o * qn,
                                    blk + rows * qn + Hn * o, md);
    }
  }
}

template <class T>
void check_master(const std::string& who, const ref::ModelConfig& m,
                  const ref::ModelWeights<T>& master) {
  if (dry_run()) throw std::logic_error(who + ": a dry run is not supported");
  const auto C = static_cast<std::size_t>(m.hidden);
  const std::size_t VC = static_cast<std::size_t>(m.vocab) * C;
  if (master.embed.size() != VC || master.head().size() != VC || master.final_norm.size() != C ||
      master.layers.size() != static_cast<std::size_t>(m.n_layers))
    throw std::invalid_argument(who + ": master weights do not match the model " + m.to_string());
}

template <class T>
TpShards<T>::TpShards(const std::string& who, Arena& a, const ref::ModelWeights<T>& master,
                      const ref::ModelConfig& m, int n, int r) {
  check_master(who, m, master);
  const auto C = static_cast<std::size_t>(m.hidden);
  const std::size_t qdl =
      static_cast<std::size_t>(m.n_heads / n) * static_cast<std::size_t>(m.head_size());
  for (const auto& layer : master.layers) {
    qkv.emplace_back(a, layer, m, n, r);
    wo.push_back(cols_of(a, layer.wo, C, static_cast<std::size_t>(m.q_dim()),
                         static_cast<std::size_t>(r) * qdl, qdl));
    mlp.emplace_back(a, layer, m, n, r);
  }
  vocab = std::make_unique<VocabShard<T>>(a, master, n, r);
}

template <class T>
TspShards<T> load_tsp_shards(const std::string& who, Arena& a, const ref::ModelConfig& m, int D,
                             int r, const ref::ModelWeights<T>& master) {
  check_master(who, m, master);
  const auto C = static_cast<std::size_t>(m.hidden);
  TspShards<T> w;
  w.packing.model = m;
  w.packing.D = D;
  w.packing.S = 2 * D;
  for (const auto& layer : master.layers) {
    w.attention.push_back(a.allocate<T>(attention_shard_size(w.packing), Category::weights));
    pack_attention_shard(layer, w.packing, r, w.attention.back().data());
    w.mlp.push_back(a.allocate<T>(mlp_shard_size(w.packing), Category::weights));
    pack_mlp_shard(layer, w.packing, r, w.mlp.back().data());
    w.input_norm.push_back(a.allocate<T>(C, Category::weights));
    std::copy(layer.input_norm.begin(), layer.input_norm.end(), w.input_norm.back().data());
    w.post_norm.push_back(a.allocate<T>(C, Category::weights));
    std::copy(layer.post_norm.begin(), layer.post_norm.end(), w.post_norm.back().data());
  }
  const std::size_t shard = static_cast<std::size_t>(m.vocab) * C / static_cast<std::size_t>(D);
  const auto first = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * shard);
  w.embed = a.allocate<T>(shard, Category::weights);
  std::copy_n(master.embed.begin() + first, shard, w.embed.data());
  if (!m.tie_embeddings) {
    w.head = a.allocate<T>(shard, Category::weights);
    std::copy_n(master.lm_head.begin() + first, shard, w.head.data());
  }
  w.final_norm = a.allocate<T>(C, Category::weights);
  std::copy(master.final_norm.begin(), master.final_norm.end(), w.final_norm.data());
  return w;
}

template <class T>
const RankKvCache<T>& cache_or_throw(const std::string& who, const RankKvCache<T>* cache) {
  if (cache == nullptr) throw std::logic_error(who + ": no cache before prefill");
  return *cache;
}

std::int64_t length_or_throw(const std::string& who, const std::vector<std::int64_t>& lengths,
                             int seq) {
  if (seq < 0 || seq >= static_cast<int>(lengths.size()))
    throw std::out_of_range(who + ": sequence " + str(seq) + " outside [0, " +
                            str(static_cast<std::int64_t>(lengths.size())) + ")");
  return lengths[static_cast<std::size_t>(seq)];
}

template <class T>
StepBuffers<T>::StepBuffers(Arena& a, std::size_t rows, std::size_t C, std::size_t H,
                            std::size_t KVH, std::size_t hs)
    : x(a.allocate<T>(rows * C, Category::workspace, /*zero=*/true)),
      mid(a.allocate<T>(rows * C, Category::workspace)),
      xn(a.allocate<T>(rows * C, Category::workspace)),
      rstd(a.allocate<T>(rows, Category::workspace)),
      q(a.allocate<T>(rows * H * hs, Category::workspace)),
      k(a.allocate<T>(rows * KVH * hs, Category::workspace)),
      v(a.allocate<T>(rows * KVH * hs, Category::workspace)),
      out(a.allocate<T>(rows * H * hs, Category::workspace)),
      lse(a.allocate<T>(rows * H, Category::workspace)),
      partial(a.allocate<T>(rows * C, Category::workspace)) {}

template <class T>
void append_and_attend(RankKvCache<T>& cache, int layer, const DecodeStep& st, StepBuffers<T>& b,
                       int H, int KVH, int hs) {
  const KvOwnership& own = cache.ownership();
  const std::size_t qd = static_cast<std::size_t>(H) * static_cast<std::size_t>(hs);
  const std::size_t kd = static_cast<std::size_t>(KVH) * static_cast<std::size_t>(hs);
  for (std::size_t s = 0; s < st.count.size(); ++s) {
    const std::size_t o = st.offset[s];
    const int n = st.count[s], seq = static_cast<int>(s);
    for (int i = 0; i < n; ++i) {  // the owner of each new token keeps its K/V
      const std::size_t row = o + static_cast<std::size_t>(i);
      if (own.owner(seq, st.positions[row]) == cache.rank())
        cache.append(layer, seq, st.positions[row], b.k.data() + row * kd, b.v.data() + row * kd);
    }
    const auto keys = cache.positions(layer, seq);
    ref::causal_attention_forward(
        b.out.data() + o * qd, b.lse.data() + o * static_cast<std::size_t>(H), b.q.data() + o * qd,
        cache.keys(layer, seq), cache.values(layer, seq), st.positions.data() + o, keys.data(),
        ref::AttentionDims{1, n, static_cast<int>(keys.size()), H, KVH, hs});
  }
}

template <class T>
void o_proj_all_reduce(Rank& rank, const DecodeStep& st, const ref::ModelConfig& m, const T* att,
                       int width, const Buffer<T>& wo, StepBuffers<T>& b,
                       TrafficCounters& traffic) {
  const auto C = static_cast<std::size_t>(m.hidden), wz = static_cast<std::size_t>(width);
  for (std::size_t s = 0; s < st.count.size(); ++s) {
    const std::size_t o = st.offset[s];
    ref::matmul_nt(b.partial.data() + o * C, att + o * wz, wo.data(), st.count[s], m.hidden, width);
  }
  measured(rank, traffic, [&] { all_reduce<T>(rank.comm(), b.partial.span()); });
  for (std::size_t i = 0; i < b.partial.size(); ++i) b.mid[i] = b.x[i] + b.partial[i];
}

#define TSPEMU_DECODE_PARTS(T)                                                                     \
  template Buffer<T> rows_of(Arena&, const std::vector<T>&, std::size_t, std::size_t,              \
                             std::size_t);                                                         \
  template Buffer<T> cols_of(Arena&, const std::vector<T>&, std::size_t, std::size_t, std::size_t, \
                             std::size_t);                                                         \
  template struct VocabShard<T>;                                                                   \
  template void embed_rows(const VocabShard<T>&, const DecodeStep&, int, T*);                      \
  template void mlp_partial(Arena&, const MlpShard<T>&, const DecodeStep&,                         \
                            const ref::ModelConfig&, const T*, T*);                                \
  template void qkv_from_normed(const QkvShard<T>&, const ref::ModelConfig&, const DecodeStep&,    \
                                const Buffer<T>&, Buffer<T>&, Buffer<T>&, Buffer<T>&);             \
  template void embed(Rank&, Comm&, const VocabShard<T>&, const DecodeStep&, int, Buffer<T>&,      \
                      TrafficCounters&);                                                           \
  template std::vector<T> lm_head(Rank&, Comm&, const VocabShard<T>&, const DecodeStep&,           \
                                  const ref::ModelConfig&, const Buffer<T>&, TrafficCounters&);    \
  template struct MlpShard<T>;                                                                     \
  template void mlp_block(Rank&, Comm&, const MlpShard<T>&, const DecodeStep&,                     \
                          const ref::ModelConfig&, const Buffer<T>&, Buffer<T>&,                   \
                          TrafficCounters&);                                                       \
  template struct QkvShard<T>;                                                                     \
  template void project_qkv(const QkvShard<T>&, const ref::ModelConfig&, const DecodeStep&,        \
                            const Buffer<T>&, Buffer<T>&, Buffer<T>&, Buffer<T>&, Buffer<T>&,      \
                            Buffer<T>&);                                                           \
  template void exchange_partials(Rank&, Comm&, const DecodeStep&, const T*, const T*, int, int,   \
                                  Buffer<T>&, TrafficCounters&);                                   \
  template void check_master(const std::string&, const ref::ModelConfig&,                          \
                             const ref::ModelWeights<T>&);                                         \
  template struct TspShards<T>;                                                                    \
  template struct TpShards<T>;                                                                     \
  template TspShards<T> load_tsp_shards(const std::string&, Arena&, const ref::ModelConfig&, int,  \
                                        int, const ref::ModelWeights<T>&);                         \
  template const RankKvCache<T>& cache_or_throw(const std::string&, const RankKvCache<T>*);        \
  template struct StepBuffers<T>;                                                                  \
  template void append_and_attend(RankKvCache<T>&, int, const DecodeStep&, StepBuffers<T>&, int,   \
                                  int, int);                                                       \
  template void o_proj_all_reduce(Rank&, const DecodeStep&, const ref::ModelConfig&, const T*,     \
                                  int, const Buffer<T>&, StepBuffers<T>&, TrafficCounters&);
TSPEMU_DECODE_PARTS(float)
TSPEMU_DECODE_PARTS(double)
#undef TSPEMU_DECODE_PARTS

}  // namespace tspemu::tsp::detail
