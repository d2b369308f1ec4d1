#include "tspemu/tsp/helix_decoder.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "decode_parts.hpp"
#include "decoder_base_impl.hpp"
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
    : Base(rank, shape, kWho, "helix"), kvp_(kvp), w_(std::make_unique<Weights>()) {
  validate_helix(s_, kvp_);
  if (rank.size() != s_.D) reject("world has " + str(rank.size()) + " ranks but N=" + str(s_.D));
  const ref::ModelConfig& m = s_.model;
  detail::check_master(kWho, m, master);
  const auto C = static_cast<std::size_t>(m.hidden);
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
int BasicHelixDecoder<T>::first_kv_head() const {
  return w_->qkv.front().kv.first;
}

// Token shard k of KVP, the KV heads of head shard a.
template <class T>
CacheLayout BasicHelixDecoder<T>::cache_layout() const {
  return {w_->k, kvp_, s_.interleave, detail::kv_head_shard(s_.model, s_.D / kvp_, 0).count};
}

// One step's new tokens, its dimensions and buffers.
template <class T>
struct BasicHelixDecoder<T>::Pass : detail::StepBuffers<T> {
  detail::DecodeStep st;
  int NHa, NKVa, hs;
  std::size_t qn;  // att's width: NH/N heads
  Buffer<T> att;   // [N_t, qn] this rank's heads after the merge

  Pass(Arena& a, const DecodeShape& s, int kvp, detail::DecodeStep step)
      : detail::StepBuffers<T>(
            a, static_cast<std::size_t>(step.rows()), static_cast<std::size_t>(s.model.hidden),
            static_cast<std::size_t>(s.model.n_heads / (s.D / kvp)),
            static_cast<std::size_t>(detail::kv_head_shard(s.model, s.D / kvp, 0).count),
            static_cast<std::size_t>(s.model.head_size())),
        st(std::move(step)),
        NHa(s.model.n_heads / (s.D / kvp)),
        NKVa(detail::kv_head_shard(s.model, s.D / kvp, 0).count),
        hs(s.model.head_size()),
        qn(static_cast<std::size_t>(s.model.n_heads / s.D) * static_cast<std::size_t>(hs)),
        att(a.allocate<T>(static_cast<std::size_t>(st.rows()) * qn, Category::workspace)) {}
};

template <class T>
std::vector<T> BasicHelixDecoder<T>::forward(detail::DecodeStep&& step) {
  Pass p(rank_.arena(), s_, kvp_, std::move(step));
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
  detail::project_qkv(w.qkv[lz], m, st, p.x, p.xn, p.rstd, p.q, p.k, p.v);
  detail::append_and_attend(*cache_, l, st, p, p.NHa, p.NKVa, p.hs);
  detail::exchange_partials(rank_, kvp_comm_, st, p.out.data(), p.lse.data(), p.NHa, p.hs, p.att,
                            traffic_.partials);
  // o_proj, row-parallel over all N: this rank's head block's share of the sum
  detail::o_proj_all_reduce(rank_, st, m, p.att.data(), static_cast<int>(p.qn), w.wo[lz], p,
                            traffic_.o_proj);
}

template class DecoderBase<float, DecodeShape, HelixTraffic>;
template class DecoderBase<double, DecodeShape, HelixTraffic>;
template class BasicHelixDecoder<float>;
template class BasicHelixDecoder<double>;

}  // namespace tspemu::tsp
