#include "tspemu/tsp/tp_decoder.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "decode_parts.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/kv_ownership.hpp"

namespace tspemu::tsp {

namespace {

constexpr const char* kWho = "TP decode";

[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument(std::string(kWho) + ": " + why);
}

std::string str(std::int64_t v) {
  return std::to_string(v);
}

void require_divides(int T, int n, const char* name, const char* why) {
  if (n % T != 0)
    reject("T=" + str(T) + " does not divide " + name + "=" + str(n) + " (" + why + ")");
}

}  // namespace

void validate_tp(const DecodeShape& s) {
  s.model.validate();
  const int T = s.D, nkv = s.model.n_kv_heads;
  if (T < 1) reject("T=" + str(T) + " must be >= 1");
  if (s.batch < 1) reject("batch B=" + str(s.batch) + " must be >= 1");
  if (s.max_context < 1) reject("max_context=" + str(s.max_context) + " must be > 0");
  if (s.interleave < 1) reject("interleave I=" + str(s.interleave) + " must be >= 1");
  require_divides(T, s.model.n_heads, "NH", "each rank owns NH/T query heads");
  if (nkv % T != 0 && T % nkv != 0)
    reject("T=" + str(T) + " neither divides NKV=" + str(nkv) + " nor is a multiple of it: " +
           "a rank's query heads would span a KV head split between ranks (T | NKV shards the "
           "KV heads, NKV | T duplicates each T/NKV times)");
  require_divides(T, s.model.ffn, "F", "each rank owns F/T MLP columns");
  require_divides(T, s.model.vocab, "V", "each rank owns V/T vocabulary rows");
}

int tp_kv_heads_per_rank(const ref::ModelConfig& m, int T) {
  return T <= m.n_kv_heads ? m.n_kv_heads / T : 1;
}

template <class T>
struct BasicTpDecoder<T>::Weights {
  int kv0 = 0;                                        // the model's KV head of this rank's first
  std::vector<Buffer<T>> wq, wk, wv, wo, input_norm;  // [L] each
  std::vector<detail::MlpShard<T>> mlp;               // [L]
  std::unique_ptr<detail::VocabShard<T>> vocab;
};

template <class T>
BasicTpDecoder<T>::BasicTpDecoder(Rank& rank, const DecodeShape& shape,
                                  const ref::ModelWeights<T>& master)
    : rank_(rank), s_(shape), w_(std::make_unique<Weights>()) {
  validate_tp(s_);
  if (rank.size() != s_.D) reject("world has " + str(rank.size()) + " ranks but T=" + str(s_.D));
  if (dry_run()) throw std::logic_error("TP decode: a dry run is not supported");
  const ref::ModelConfig& m = s_.model;
  const auto C = static_cast<std::size_t>(m.hidden);
  const std::size_t VC = static_cast<std::size_t>(m.vocab) * C;
  if (master.embed.size() != VC || master.head().size() != VC || master.final_norm.size() != C ||
      master.layers.size() != static_cast<std::size_t>(m.n_layers))
    reject("master weights do not match the model " + m.to_string());
  const int Tn = s_.D, r = rank.id(), hs = m.head_size();
  const int NHl = m.n_heads / Tn, NKVl = tp_kv_heads_per_rank(m, Tn);
  Weights& w = *w_;
  w.kv0 = Tn <= m.n_kv_heads ? r * NKVl : r / (Tn / m.n_kv_heads);
  const auto hz = static_cast<std::size_t>(hs);
  const std::size_t qdl = static_cast<std::size_t>(NHl) * hz,
                    kvl = static_cast<std::size_t>(NKVl) * hz;
  const std::size_t q0 = static_cast<std::size_t>(r) * qdl,
                    k0 = static_cast<std::size_t>(w.kv0) * hz;
  Arena& a = rank.arena();
  for (const auto& layer : master.layers) {
    w.wq.push_back(detail::rows_of(a, layer.wq, C, q0, qdl));
    w.wk.push_back(detail::rows_of(a, layer.wk, C, k0, kvl));
    w.wv.push_back(detail::rows_of(a, layer.wv, C, k0, kvl));
    w.wo.push_back(
        detail::cols_of(a, layer.wo, C, static_cast<std::size_t>(m.n_heads) * hz, q0, qdl));
    w.input_norm.push_back(detail::rows_of(a, layer.input_norm, C, 0, 1));
    w.mlp.emplace_back(a, layer, m, Tn, r);
  }
  w.vocab = std::make_unique<detail::VocabShard<T>>(a, master, Tn, r);
}

template <class T>
BasicTpDecoder<T>::~BasicTpDecoder() = default;

template <class T>
const RankKvCache<T>& BasicTpDecoder<T>::cache() const {
  if (!cache_) throw std::logic_error("TP decode: no cache before prefill");
  return *cache_;
}

template <class T>
int BasicTpDecoder<T>::first_kv_head() const {
  return w_->kv0;
}

template <class T>
std::size_t BasicTpDecoder<T>::kv_cache_bytes() const {
  return cache_ ? cache_->bytes() : 0;
}

template <class T>
std::int64_t BasicTpDecoder<T>::length(int seq) const {
  if (seq < 0 || seq >= static_cast<int>(lengths_.size()))
    throw std::out_of_range("TP decode: sequence " + str(seq) + " outside [0, " +
                            str(static_cast<std::int64_t>(lengths_.size())) + ")");
  return lengths_[static_cast<std::size_t>(seq)];
}

// One step's new tokens, its dimensions and buffers.
template <class T>
struct BasicTpDecoder<T>::Pass {
  detail::DecodeStep st;
  int NHl = 0, NKVl = 0, hs = 0;
  std::size_t rows = 0, C = 0, qdl = 0, kvl = 0;
  Buffer<T> x, mid, xn, rstd, q, k, v, out, lse, partial;

  Pass(Arena& a, const DecodeShape& s, detail::DecodeStep step) : st(std::move(step)) {
    const ref::ModelConfig& m = s.model;
    NHl = m.n_heads / s.D, NKVl = tp_kv_heads_per_rank(m, s.D), hs = m.head_size();
    rows = static_cast<std::size_t>(st.rows()), C = static_cast<std::size_t>(m.hidden);
    qdl = static_cast<std::size_t>(NHl) * static_cast<std::size_t>(hs);
    kvl = static_cast<std::size_t>(NKVl) * static_cast<std::size_t>(hs);
    x = a.allocate<T>(rows * C, Category::workspace, /*zero=*/true);
    mid = a.allocate<T>(rows * C, Category::workspace);
    xn = a.allocate<T>(rows * C, Category::workspace);
    rstd = a.allocate<T>(rows, Category::workspace);
    q = a.allocate<T>(rows * qdl, Category::workspace);
    k = a.allocate<T>(rows * kvl, Category::workspace);
    v = a.allocate<T>(rows * kvl, Category::workspace);
    out = a.allocate<T>(rows * qdl, Category::workspace);
    lse = a.allocate<T>(rows * static_cast<std::size_t>(NHl), Category::workspace);
    partial = a.allocate<T>(rows * C, Category::workspace);
  }
};

template <class T>
std::vector<T> BasicTpDecoder<T>::prefill(const std::vector<std::vector<std::int32_t>>& prompts) {
  Pass pass(rank_.arena(), s_,
            detail::prefill_step(kWho, prompts, s_.batch, s_.model.vocab, s_.max_context));
  const std::vector<std::int64_t> lengths = detail::step_lengths(pass.st);
  ref::ModelConfig held = s_.model;  // the cache's view: this rank's KV heads only
  held.n_kv_heads = tp_kv_heads_per_rank(s_.model, s_.D);
  cache_.reset();  // a new batch: the old reservation goes back to the arena first
  cache_ = std::make_unique<RankKvCache<T>>(rank_.arena(), 0, held, KvOwnership(1, 1, lengths),
                                            s_.max_context);
  lengths_ = lengths;
  auto phase = rank_.arena().phase("tp.prefill");
  return run(pass);
}

template <class T>
std::vector<T> BasicTpDecoder<T>::decode_step(std::span<const std::int32_t> tokens) {
  Pass pass(
      rank_.arena(), s_,
      detail::next_step(kWho, tokens, lengths_, s_.model.vocab, s_.max_context, cache_ != nullptr));
  auto phase = rank_.arena().phase("tp.decode");
  std::vector<T> logits = run(pass);
  for (std::int64_t& n : lengths_) ++n;
  return logits;
}

template <class T>
std::vector<T> BasicTpDecoder<T>::run(Pass& p) {
  traffic_ = {};
  Comm& comm = rank_.comm();
  detail::embed(rank_, comm, *w_->vocab, p.st, s_.model.hidden, p.x, traffic_.embedding);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, p);
    detail::mlp_block(rank_, comm, w_->mlp[static_cast<std::size_t>(l)], p.st, s_.model, p.mid, p.x,
                      traffic_.mlp);
  }
  return detail::lm_head(rank_, comm, *w_->vocab, p.st, s_.model, p.x, traffic_.lm_head);
}

// The attention block of layer l: mid = x + o_proj(attention), every stage of the header.
template <class T>
void BasicTpDecoder<T>::attention(int l, Pass& p) {
  const ref::ModelConfig& m = s_.model;
  const Weights& w = *w_;
  const auto lz = static_cast<std::size_t>(l);
  const detail::DecodeStep& st = p.st;
  const std::size_t C = p.C, qdl = p.qdl, kvl = p.kvl;
  ref::rmsnorm_forward(p.xn.data(), p.rstd.data(), p.x.data(), w.input_norm[lz].data(), st.rows(),
                       m.hidden, m.norm_eps);
  for (std::size_t b = 0; b < st.count.size(); ++b) {
    const std::size_t o = st.offset[b];
    const int n = st.count[b];
    const T* xn = p.xn.data() + o * C;
    ref::matmul_nt(p.q.data() + o * qdl, xn, w.wq[lz].data(), n, static_cast<int>(qdl), m.hidden);
    ref::matmul_nt(p.k.data() + o * kvl, xn, w.wk[lz].data(), n, static_cast<int>(kvl), m.hidden);
    ref::matmul_nt(p.v.data() + o * kvl, xn, w.wv[lz].data(), n, static_cast<int>(kvl), m.hidden);
    const std::int64_t* pos = st.positions.data() + o;
    ref::rope_forward(p.q.data() + o * qdl, pos, 1, n, p.NHl, p.hs, m.rope_base);
    ref::rope_forward(p.k.data() + o * kvl, pos, 1, n, p.NKVl, p.hs, m.rope_base);
    const int seq = static_cast<int>(b);
    for (int i = 0; i < n; ++i) {
      const std::size_t row = o + static_cast<std::size_t>(i);
      cache_->append(l, seq, st.positions[row], p.k.data() + row * kvl, p.v.data() + row * kvl);
    }
    // attend: the sequence's queries over all its cached keys, masked by global position
    const auto keys = cache_->positions(l, seq);
    ref::causal_attention_forward(
        p.out.data() + o * qdl, p.lse.data() + o * static_cast<std::size_t>(p.NHl),
        p.q.data() + o * qdl, cache_->keys(l, seq), cache_->values(l, seq), pos, keys.data(),
        ref::AttentionDims{1, n, static_cast<int>(keys.size()), p.NHl, p.NKVl, p.hs});
    // o_proj, row-parallel: this rank's share of the sum over heads
    ref::matmul_nt(p.partial.data() + o * C, p.out.data() + o * qdl, w.wo[lz].data(), n, m.hidden,
                   static_cast<int>(qdl));
  }
  detail::measured(rank_, traffic_.o_proj, [&] { all_reduce<T>(rank_.comm(), p.partial.span()); });
  for (std::size_t i = 0; i < p.rows * C; ++i) p.mid[i] = p.x[i] + p.partial[i];
}

template class BasicTpDecoder<float>;
template class BasicTpDecoder<double>;

}  // namespace tspemu::tsp
