#include "tspemu/tsp/tp_decoder.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "decode_parts.hpp"
#include "decoder_base_impl.hpp"
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
  detail::require_kv_heads_fit(kWho, "T", T, nkv);
  require_divides(T, s.model.ffn, "F", "each rank owns F/T MLP columns");
  require_divides(T, s.model.vocab, "V", "each rank owns V/T vocabulary rows");
}

int tp_kv_heads_per_rank(const ref::ModelConfig& m, int T) {
  return detail::kv_head_shard(m, T, 0).count;
}

template <class T>
struct BasicTpDecoder<T>::Weights : detail::TpShards<T> {
  using detail::TpShards<T>::TpShards;
};

template <class T>
BasicTpDecoder<T>::BasicTpDecoder(Rank& rank, const DecodeShape& shape,
                                  const ref::ModelWeights<T>& master)
    : Base(rank, shape, kWho, "tp") {
  validate_tp(s_);
  if (rank.size() != s_.D) reject("world has " + str(rank.size()) + " ranks but T=" + str(s_.D));
  w_ = std::make_unique<Weights>(kWho, rank.arena(), master, s_.model, s_.D, rank.id());
}

template <class T>
BasicTpDecoder<T>::~BasicTpDecoder() = default;

template <class T>
int BasicTpDecoder<T>::first_kv_head() const {
  return w_->qkv.front().kv.first;
}

// Every position on every rank (one token shard), the rank's KV heads (duplicated past NKV).
template <class T>
CacheLayout BasicTpDecoder<T>::cache_layout() const {
  return {0, 1, 1, tp_kv_heads_per_rank(s_.model, s_.D)};
}

// One step's new tokens, its dimensions and buffers.
template <class T>
struct BasicTpDecoder<T>::Pass : detail::StepBuffers<T> {
  detail::DecodeStep st;
  int NHl, NKVl, hs;

  Pass(Arena& a, const DecodeShape& s, detail::DecodeStep step)
      : detail::StepBuffers<T>(a, static_cast<std::size_t>(step.rows()),
                               static_cast<std::size_t>(s.model.hidden),
                               static_cast<std::size_t>(s.model.n_heads / s.D),
                               static_cast<std::size_t>(tp_kv_heads_per_rank(s.model, s.D)),
                               static_cast<std::size_t>(s.model.head_size())),
        st(std::move(step)),
        NHl(s.model.n_heads / s.D),
        NKVl(tp_kv_heads_per_rank(s.model, s.D)),
        hs(s.model.head_size()) {}
};

template <class T>
std::vector<T> BasicTpDecoder<T>::forward(detail::DecodeStep&& step) {
  Pass p(rank_.arena(), s_, std::move(step));
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
  detail::project_qkv(w.qkv[lz], m, st, p.x, p.xn, p.rstd, p.q, p.k, p.v);
  detail::append_and_attend(*cache_, l, st, p, p.NHl, p.NKVl, p.hs);
  // o_proj, row-parallel: this rank's share of the sum over heads
  detail::o_proj_all_reduce(rank_, st, m, p.out.data(), p.NHl * p.hs, w.wo[lz], p, traffic_.o_proj);
}

template class DecoderBase<float, DecodeShape, TpTraffic>;
template class DecoderBase<double, DecodeShape, TpTraffic>;
template class BasicTpDecoder<float>;
template class BasicTpDecoder<double>;

}  // namespace tspemu::tsp
