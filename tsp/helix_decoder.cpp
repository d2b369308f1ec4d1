#include "tspemu/tsp/helix_decoder.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "decode_parts.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/kv_ownership.hpp"

namespace tspemu::tsp {

namespace {

constexpr const char* kWho = "Helix decode";

[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument(std::string(kWho) + ": " + why);
}

std::string str(std::int64_t v) {
  return std::to_string(v);
}

void require_divides(const char* what, int d, int n, const char* name, const char* why) {
  if (n % d != 0)
    reject(std::string(what) + "=" + str(d) + " does not divide " + name + "=" + str(n) + " (" +
           why + ")");
}

}  // namespace

void validate_helix(const DecodeShape& s, int kvp) {
  s.model.validate();
  const int N = s.D;
  if (N < 1) reject("N=" + str(N) + " must be >= 1");
  if (kvp < 1 || N % kvp != 0)
    reject("KVP=" + str(kvp) + " must be >= 1 and divide N=" + str(N) + " (N = KVP x TP_A)");
  if (s.batch < 1) reject("batch B=" + str(s.batch) + " must be >= 1");
  if (s.max_context < 1) reject("max_context=" + str(s.max_context) + " must be > 0");
  if (s.interleave < 1) reject("interleave I=" + str(s.interleave) + " must be >= 1");
  const int tpa = N / kvp;
  require_divides("TP_A", tpa, s.model.n_heads, "NH", "each head shard owns NH/TP_A query heads");
  detail::require_kv_heads_fit(kWho, "TP_A", tpa, s.model.n_kv_heads);
  require_divides("N", N, s.model.n_heads, "NH",
                  "each rank owns NH/N heads of the attention output after the all-to-all");
  require_divides("N", N, s.model.ffn, "F", "each rank owns F/N MLP columns");
  require_divides("N", N, s.model.vocab, "V", "each rank owns V/N vocabulary rows");
}

template <class T>
struct BasicHelixDecoder<T>::Weights {
  int k = 0, a = 0;                      // token shard, head shard
  std::vector<detail::QkvShard<T>> qkv;  // [L] head shard a of TP_A
  std::vector<Buffer<T>> wo;             // [L] columns of head block a·KVP + k of N
  std::vector<detail::MlpShard<T>> mlp;  // [L] shard rank of N
  std::unique_ptr<detail::VocabShard<T>> vocab;
};

template <class T>
BasicHelixDecoder<T>::BasicHelixDecoder(Rank& rank, const DecodeShape& shape, int kvp,
                                        const ref::ModelWeights<T>& master, HelixFault fault)
    : rank_(rank), s_(shape), kvp_(kvp), w_(std::make_unique<Weights>()) {
  validate_helix(s_, kvp_);
  if (rank.size() != s_.D) reject("world has " + str(rank.size()) + " ranks but N=" + str(s_.D));
  if (dry_run()) throw std::logic_error("Helix decode: a dry run is not supported");
  const ref::ModelConfig& m = s_.model;
  const auto C = static_cast<std::size_t>(m.hidden);
  const std::size_t VC = static_cast<std::size_t>(m.vocab) * C;
  if (master.embed.size() != VC || master.head().size() != VC || master.final_norm.size() != C ||
      master.layers.size() != static_cast<std::size_t>(m.n_layers))
    reject("master weights do not match the model " + m.to_string());
  const int N = s_.D, tpa = N / kvp_, r = rank.id();
  Weights& w = *w_;
  w.k = r / tpa, w.a = r % tpa;
  // The KVP group of head shard a: ranks a, TP_A + a, ..., numbered by token shard k.
  kvp_comm_ = rank.comm().split(w.a, w.k, "helix.kvp" + std::to_string(w.a));
  const int block = fault == HelixFault::o_proj_by_rank ? r : w.a * kvp_ + w.k;
  const std::size_t qn =
      static_cast<std::size_t>(m.n_heads / N) * static_cast<std::size_t>(m.head_size());
  Arena& a = rank.arena();
  for (const auto& layer : master.layers) {
    w.qkv.emplace_back(a, layer, m, tpa, w.a);
    w.wo.push_back(detail::cols_of(a, layer.wo, C, static_cast<std::size_t>(m.q_dim()),
                                   static_cast<std::size_t>(block) * qn, qn));
    w.mlp.emplace_back(a, layer, m, N, r);
  }
  w.vocab = std::make_unique<detail::VocabShard<T>>(a, master, N, r);
}

template <class T>
BasicHelixDecoder<T>::~BasicHelixDecoder() = default;

template <class T>
const RankKvCache<T>& BasicHelixDecoder<T>::cache() const {
  if (!cache_) throw std::logic_error("Helix decode: no cache before prefill");
  return *cache_;
}

template <class T>
int BasicHelixDecoder<T>::first_kv_head() const {
  return w_->qkv.front().kv.first;
}

template <class T>
std::size_t BasicHelixDecoder<T>::kv_cache_bytes() const {
  return cache_ ? cache_->bytes() : 0;
}

template <class T>
std::int64_t BasicHelixDecoder<T>::length(int seq) const {
  if (seq < 0 || seq >= static_cast<int>(lengths_.size()))
    throw std::out_of_range("Helix decode: sequence " + str(seq) + " outside [0, " +
                            str(static_cast<std::int64_t>(lengths_.size())) + ")");
  return lengths_[static_cast<std::size_t>(seq)];
}

// One step's new tokens, its dimensions and buffers.
template <class T>
struct BasicHelixDecoder<T>::Pass {
  detail::DecodeStep st;
  int NHa = 0, NKVa = 0, hs = 0;
  std::size_t rows = 0, C = 0, qda = 0, kva = 0, qn = 0;
  Buffer<T> x, mid, xn, rstd, q, k, v, out, lse, att, partial;

  Pass(Arena& a, const DecodeShape& s, int kvp, detail::DecodeStep step) : st(std::move(step)) {
    const ref::ModelConfig& m = s.model;
    const int tpa = s.D / kvp;
    NHa = m.n_heads / tpa, NKVa = detail::kv_head_shard(m, tpa, 0).count, hs = m.head_size();
    rows = static_cast<std::size_t>(st.rows()), C = static_cast<std::size_t>(m.hidden);
    const auto hz = static_cast<std::size_t>(hs);
    qda = static_cast<std::size_t>(NHa) * hz, kva = static_cast<std::size_t>(NKVa) * hz;
    qn = static_cast<std::size_t>(m.n_heads / s.D) * hz;
    x = a.allocate<T>(rows * C, Category::workspace, /*zero=*/true);
    mid = a.allocate<T>(rows * C, Category::workspace);
    xn = a.allocate<T>(rows * C, Category::workspace);
    rstd = a.allocate<T>(rows, Category::workspace);
    q = a.allocate<T>(rows * qda, Category::workspace);
    k = a.allocate<T>(rows * kva, Category::workspace);
    v = a.allocate<T>(rows * kva, Category::workspace);
    out = a.allocate<T>(rows * qda, Category::workspace);
    lse = a.allocate<T>(rows * static_cast<std::size_t>(NHa), Category::workspace);
    att = a.allocate<T>(rows * qn, Category::workspace);
    partial = a.allocate<T>(rows * C, Category::workspace);
  }
};

template <class T>
std::vector<T> BasicHelixDecoder<T>::prefill(
    const std::vector<std::vector<std::int32_t>>& prompts) {
  Pass pass(rank_.arena(), s_, kvp_,
            detail::prefill_step(kWho, prompts, s_.batch, s_.model.vocab, s_.max_context));
  const std::vector<std::int64_t> lengths = detail::step_lengths(pass.st);
  ref::ModelConfig held = s_.model;  // the cache's view: this head shard's KV heads only
  held.n_kv_heads = pass.NKVa;
  cache_.reset();  // a new batch: the old reservation goes back to the arena first
  cache_ = std::make_unique<RankKvCache<T>>(
      rank_.arena(), w_->k, held, KvOwnership(kvp_, s_.interleave, lengths), s_.max_context);
  lengths_ = lengths;
  auto phase = rank_.arena().phase("helix.prefill");
  return run(pass);
}

template <class T>
std::vector<T> BasicHelixDecoder<T>::decode_step(std::span<const std::int32_t> tokens) {
  Pass pass(
      rank_.arena(), s_, kvp_,
      detail::next_step(kWho, tokens, lengths_, s_.model.vocab, s_.max_context, cache_ != nullptr));
  auto phase = rank_.arena().phase("helix.decode");
  std::vector<T> logits = run(pass);
  for (std::int64_t& n : lengths_) ++n;
  return logits;
}

template <class T>
std::vector<T> BasicHelixDecoder<T>::run(Pass& p) {
  traffic_ = {};
  Comm& world = rank_.comm();
  detail::embed(rank_, world, *w_->vocab, p.st, s_.model.hidden, p.x, traffic_.embedding);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, p);
    detail::mlp_block(rank_, world, w_->mlp[static_cast<std::size_t>(l)], p.st, s_.model, p.mid,
                      p.x, traffic_.mlp);
  }
  return detail::lm_head(rank_, world, *w_->vocab, p.st, s_.model, p.x, traffic_.lm_head);
}

// The attention block of layer l: mid = x + o_proj(attention), every stage of the header.
template <class T>
void BasicHelixDecoder<T>::attention(int l, Pass& p) {
  const ref::ModelConfig& m = s_.model;
  const Weights& w = *w_;
  const auto lz = static_cast<std::size_t>(l);
  const detail::DecodeStep& st = p.st;
  const KvOwnership& own = cache_->ownership();
  detail::project_qkv(w.qkv[lz], m, st, p.x, p.xn, p.rstd, p.q, p.k, p.v);
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    const int n = st.count[b], seq = static_cast<int>(b);
    for (int i = 0; i < n; ++i) {  // the owner of each new token keeps its K/V
      const std::size_t row = o + static_cast<std::size_t>(i);
      if (own.owner(seq, st.positions[row]) == w.k)
        cache_->append(l, seq, st.positions[row], p.k.data() + row * p.kva,
                       p.v.data() + row * p.kva);
    }
    // attend: the sequence's queries over this token shard's keys, masked by global position
    const auto keys = cache_->positions(l, seq);
    ref::causal_attention_forward(
        p.out.data() + o * p.qda, p.lse.data() + o * static_cast<std::size_t>(p.NHa),
        p.q.data() + o * p.qda, cache_->keys(l, seq), cache_->values(l, seq),
        st.positions.data() + o, keys.data(),
        ref::AttentionDims{1, n, static_cast<int>(keys.size()), p.NHa, p.NKVa, p.hs});
  }
  detail::exchange_partials(rank_, kvp_comm_, st, p.out.data(), p.lse.data(), p.NHa, p.hs, p.att,
                            traffic_.partials);
  // o_proj, row-parallel over all N: this rank's head block's share of the sum
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    ref::matmul_nt(p.partial.data() + o * p.C, p.att.data() + o * p.qn, w.wo[lz].data(),
                   st.count[b], m.hidden, static_cast<int>(p.qn));
  }
  detail::measured(rank_, traffic_.o_proj, [&] { all_reduce<T>(rank_.comm(), p.partial.span()); });
  for (std::size_t i = 0; i < p.rows * p.C; ++i) p.mid[i] = p.x[i] + p.partial[i];
}

template class BasicHelixDecoder<float>;
template class BasicHelixDecoder<double>;

}  // namespace tspemu::tsp
