#include "tspemu/tsp/megatron_sp_decoder.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "decode_parts.hpp"
#include "decoder_base_impl.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/tp_decoder.hpp"

namespace tspemu::tsp {

namespace {

constexpr const char* kWho = "Megatron-SP decode";

std::string str(std::int64_t v) {
  return std::to_string(v);
}

}  // namespace

void validate_megatron_sp(const DecodeShape& s) {
  try {
    validate_tp(s);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(kWho) + " (TP's rules): " + e.what());
  }
}

template <class T>
BasicMegatronSpDecoder<T>::BasicMegatronSpDecoder(Rank& rank, const DecodeShape& shape,
                                                  const ref::ModelWeights<T>& master)
    : Base(rank, shape, kWho, "megatron_sp") {
  validate_megatron_sp(s_);
  if (rank.size() != s_.D)
    throw std::invalid_argument(std::string(kWho) + ": world has " + str(rank.size()) +
                                " ranks but T=" + str(s_.D));
  w_ = std::make_unique<detail::TpShards<T>>(kWho, rank.arena(), master, s_.model, s_.D, rank.id());
}

template <class T>
BasicMegatronSpDecoder<T>::~BasicMegatronSpDecoder() = default;

template <class T>
int BasicMegatronSpDecoder<T>::first_kv_head() const {
  return w_->qkv.front().kv.first;
}

// TP's cache: every position on every rank (one token shard), the rank's KV heads (duplicated
// past NKV).
template <class T>
CacheLayout BasicMegatronSpDecoder<T>::cache_layout() const {
  return {0, 1, 1, tp_kv_heads_per_rank(s_.model, s_.D)};
}

// One step's new tokens and buffers. The StepBuffers have Np rows: x is the embedding rows before
// the reduce-scatter and the gathered hidden state before the LM head, xn the gathered normalized
// rows, partial the row-parallel outputs (rows >= N stay zero); q/k/v/out/lse as TP's. The
// residual stream of this rank is x_r, mid_r [Nl, C].
template <class T>
struct BasicMegatronSpDecoder<T>::Pass : detail::StepBuffers<T> {
  detail::DecodeStep st;
  int NHl, NKVl, hs;
  std::size_t Np, Nl, C;
  Buffer<T> x_r, mid_r, n_r, rstd_r, sum_r;  // [Nl, C] (rstd_r [Nl])

  Pass(Arena& a, const DecodeShape& s, detail::DecodeStep step)
      : Pass(a, s, std::move(step), padded_rows(s, step)) {}

 private:
  static std::size_t padded_rows(const DecodeShape& s, const detail::DecodeStep& step) {
    const auto n = static_cast<std::size_t>(step.rows()), t = static_cast<std::size_t>(s.D);
    return (n + t - 1) / t * t;
  }
  // step is moved from only in st's initializer, after the delegating call's arguments.
  Pass(Arena& a, const DecodeShape& s, detail::DecodeStep&& step, std::size_t rows)
      : detail::StepBuffers<T>(a, rows, static_cast<std::size_t>(s.model.hidden),
                               static_cast<std::size_t>(s.model.n_heads / s.D),
                               static_cast<std::size_t>(tp_kv_heads_per_rank(s.model, s.D)),
                               static_cast<std::size_t>(s.model.head_size())),
        st(std::move(step)),
        NHl(s.model.n_heads / s.D),
        NKVl(tp_kv_heads_per_rank(s.model, s.D)),
        hs(s.model.head_size()),
        Np(rows),
        Nl(rows / static_cast<std::size_t>(s.D)),
        C(static_cast<std::size_t>(s.model.hidden)),
        x_r(a.allocate<T>(Nl * C, Category::workspace)),
        mid_r(a.allocate<T>(Nl * C, Category::workspace)),
        n_r(a.allocate<T>(Nl * C, Category::comm)),
        rstd_r(a.allocate<T>(Nl, Category::workspace)),
        sum_r(a.allocate<T>(Nl * C, Category::comm)) {
    std::fill(this->partial.begin(), this->partial.end(), T(0));
  }
};

namespace {

// send [Np, C] summed over the ranks, this rank's rows [r·Nl, (r+1)·Nl) into recv; T = 1 a copy.
template <class T>
void scatter_rows(Rank& rank, const Buffer<T>& send, Buffer<T>& recv, TrafficCounters& traffic) {
  if (rank.size() == 1) {
    std::copy_n(send.data(), recv.size(), recv.data());
    return;
  }
  detail::measured(rank, traffic, [&] {
    reduce_scatter<T>(rank.comm(), std::span<const T>(send.data(), send.size()), recv.span());
  });
}

// Every rank's rows [Nl, C] into all [Np, C], in rank order; T = 1 a copy.
template <class T>
void gather_rows(Rank& rank, const Buffer<T>& mine, Buffer<T>& all, TrafficCounters& traffic) {
  if (rank.size() == 1) {
    std::copy_n(mine.data(), mine.size(), all.data());
    return;
  }
  detail::measured(rank, traffic, [&] {
    all_gather<T>(rank.comm(), std::span<const T>(mine.data(), mine.size()), all.span());
  });
}

}  // namespace

template <class T>
std::vector<T> BasicMegatronSpDecoder<T>::forward(detail::DecodeStep&& step) {
  Pass p(rank_.arena(), s_, std::move(step));
  // x_r = this rank's rows of embed_tokens(tokens): vocabulary-parallel rows, reduce-scattered
  detail::embed_rows(*w_->vocab, p.st, s_.model.hidden, p.x.data());
  scatter_rows(rank_, p.x, p.x_r, traffic_.embedding);
  for (int l = 0; l < s_.model.n_layers; ++l) {
    attention(l, p);
    mlp(l, p);
  }
  gather_rows(rank_, p.x_r, p.x, traffic_.head_gather);
  return detail::lm_head(rank_, rank_.comm(), *w_->vocab, p.st, s_.model, p.x, traffic_.lm_head);
}

// mid_r = x_r + reduce_scatter(o_proj(attention(all_gather(rmsnorm(x_r))))).
template <class T>
void BasicMegatronSpDecoder<T>::attention(int l, Pass& p) {
  const ref::ModelConfig& m = s_.model;
  const detail::TpShards<T>& w = *w_;
  const auto lz = static_cast<std::size_t>(l);
  const detail::DecodeStep& st = p.st;
  const detail::QkvShard<T>& qkv = w.qkv[lz];
  ref::rmsnorm_forward(p.n_r.data(), p.rstd_r.data(), p.x_r.data(), qkv.input_norm.data(),
                       static_cast<int>(p.Nl), m.hidden, m.norm_eps);
  gather_rows(rank_, p.n_r, p.xn, traffic_.qkv_gather);
  detail::qkv_from_normed(qkv, m, st, p.xn, p.q, p.k, p.v);
  detail::append_and_attend(*cache_, l, st, p, p.NHl, p.NKVl, p.hs);
  const int width = p.NHl * p.hs;
  const auto wz = static_cast<std::size_t>(width);
  for (std::size_t s = 0; s < st.count.size(); ++s) {  // row-parallel W_O, per sequence
    const std::size_t o = st.offset[s];
    ref::matmul_nt(p.partial.data() + o * p.C, p.out.data() + o * wz, w.wo[lz].data(), st.count[s],
                   m.hidden, width);
  }
  scatter_rows(rank_, p.partial, p.sum_r, traffic_.o_proj);
  for (std::size_t i = 0; i < p.Nl * p.C; ++i) p.mid_r[i] = p.x_r[i] + p.sum_r[i];
}

// x_r = mid_r + reduce_scatter(mlp(all_gather(rmsnorm(mid_r)))).
template <class T>
void BasicMegatronSpDecoder<T>::mlp(int l, Pass& p) {
  const ref::ModelConfig& m = s_.model;
  const detail::MlpShard<T>& w = w_->mlp[static_cast<std::size_t>(l)];
  ref::rmsnorm_forward(p.n_r.data(), p.rstd_r.data(), p.mid_r.data(), w.post_norm.data(),
                       static_cast<int>(p.Nl), m.hidden, m.norm_eps);
  gather_rows(rank_, p.n_r, p.xn, traffic_.mlp_gather);
  detail::mlp_partial(rank_.arena(), w, p.st, m, p.xn.data(), p.partial.data());
  scatter_rows(rank_, p.partial, p.sum_r, traffic_.mlp);
  for (std::size_t i = 0; i < p.Nl * p.C; ++i) p.x_r[i] = p.mid_r[i] + p.sum_r[i];
}

template class DecoderBase<float, DecodeShape, MegatronSpTraffic>;
template class DecoderBase<double, DecodeShape, MegatronSpTraffic>;
template class BasicMegatronSpDecoder<float>;
template class BasicMegatronSpDecoder<double>;

}  // namespace tspemu::tsp
