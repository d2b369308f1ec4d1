#include "tspemu/tsp/ulysses_attention.hpp"

#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "sequence_core.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/sequence_heads_exchange.hpp"

namespace tspemu::tsp {

namespace {

constexpr const char* kWho = "Ulysses attention";

// positions: [S] global positions in the exchange's (rank-major) order.
struct UlyssesState : detail::CoreState {
  UlyssesState(Rank& r, const BaselineShape& s) : CoreState(kWho, r, s) {
    ordered = r.arena().allocate<std::int64_t>(static_cast<std::size_t>(s.S), Category::other);
    if (!dry_run()) std::iota(ordered.begin(), ordered.end(), 0);
  }
  Buffer<std::int64_t> ordered;  // [S] 0..S-1: K/V after to_position_order
};

// [B, S, w] rows between the gathered (rank-major) order and position order.
void to_position_order(const float* gathered, float* ordered, const std::int64_t* pos, int B, int S,
                       std::size_t w) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      std::memcpy(ordered + (static_cast<std::size_t>(b) * S + pos[i]) * w,
                  gathered + (static_cast<std::size_t>(b) * S + i) * w, w * sizeof(float));
}
void to_gathered_order(const float* ordered, float* gathered, const std::int64_t* pos, int B, int S,
                       std::size_t w) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      std::memcpy(gathered + (static_cast<std::size_t>(b) * S + i) * w,
                  ordered + (static_cast<std::size_t>(b) * S + pos[i]) * w, w * sizeof(float));
}

// The sequence side of a tensor with H heads: [B, Tl, H, hs].
SequenceHeadsShape side(const ref::AttentionDims& d, int H) {
  return {static_cast<std::size_t>(d.B), static_cast<std::size_t>(d.Tq),
          static_cast<std::size_t>(H), static_cast<std::size_t>(d.hs)};
}

// Q → heads (gathered order), K, V → heads in position order (via the exchange buffer).
struct HeadsQkv {
  Buffer<float> q, exchange, k, v;
};
HeadsQkv to_heads(UlyssesState& st, const float* q, const float* k, const float* v,
                  const ref::AttentionDims& d) {
  Arena& a = st.rank->arena();
  Comm& comm = st.rank->comm();
  const std::size_t nq = static_cast<std::size_t>(d.B) * d.Tq * d.NH * d.hs;
  const std::size_t nk = static_cast<std::size_t>(d.B) * d.Tq * d.NKV * d.hs;
  const int n = comm.size(), S = n * d.Tq;
  const std::size_t kw = static_cast<std::size_t>(d.NKV / n) * d.hs;  // one token's K row
  HeadsQkv h;
  h.q = a.allocate<float>(nq, Category::workspace);    // [B, S, NHn, hs], gathered order
  h.exchange = a.allocate<float>(nk, Category::comm);  // [B, S, NKVn, hs], gathered order
  h.k = a.allocate<float>(nk, Category::kv);           // [B, S, NKVn, hs], position order
  h.v = a.allocate<float>(nk, Category::kv);
  all_to_all_sequence_to_heads<float>(comm, {q, nq}, h.q.span(), side(d, d.NH));
  all_to_all_sequence_to_heads<float>(comm, {k, nk}, h.exchange.span(), side(d, d.NKV));
  to_position_order(h.exchange.data(), h.k.data(), st.positions.data(), d.B, S, kw);
  all_to_all_sequence_to_heads<float>(comm, {v, nk}, h.exchange.span(), side(d, d.NKV));
  to_position_order(h.exchange.data(), h.v.data(), st.positions.data(), d.B, S, kw);
  return h;
}

ref::AttentionDims heads_dims(const ref::AttentionDims& d, int n) {
  return {d.B, n * d.Tq, n * d.Tq, d.NH / n, d.NKV / n, d.hs};
}

}  // namespace

void check_ulysses_shape(const BaselineShape& s) {
  s.validate();
  if (s.T != 1 || s.sequence_parallel)
    throw std::invalid_argument(
        std::string(kWho) + ": needs T=1 and no Megatron-SP (got T=" + std::to_string(s.T) + ")");
  if (const auto v =
          violation(cost::ModelShape::from(s.model, s.B, s.S), cost::Strategy::ulysses(s.Sp)))
    throw std::invalid_argument(std::string(kWho) + ": " + v->message);
}

ref::AttentionCore<float> ulysses_attention_core(Rank& rank, const BaselineShape& shape) {
  check_ulysses_shape(shape);
  auto st = std::make_shared<UlyssesState>(rank, shape);

  ref::AttentionCore<float> core;
  core.forward = [st](float* att, float* lse, const float* q, const float* k, const float* v,
                      const std::int64_t*, const ref::AttentionDims& d) {
    st->check(d);
    Comm& comm = st->rank->comm();
    const int n = comm.size();
    HeadsQkv h = to_heads(*st, q, k, v, d);
    auto att_h = st->rank->arena().allocate<float>(h.q.size(), Category::workspace);
    // Whole sequence, this rank's heads: queries in gathered order, keys in position order.
    ref::causal_attention_forward(att_h.data(), lse, h.q.data(), h.k.data(), h.v.data(),
                                  st->positions.data(), st->ordered.data(), heads_dims(d, n));
    all_to_all_heads_to_sequence<float>(comm, att_h.span(), {att, att_h.size()}, side(d, d.NH));
  };
  core.backward = [st](float* dq, float* dk, float* dv, const float* datt, const float* q,
                       const float* k, const float* v, const float*, const float* lse,
                       const std::int64_t*, const ref::AttentionDims& d) {
    st->check(d);
    Comm& comm = st->rank->comm();
    Arena& a = st->rank->arena();
    const int n = comm.size(), S = n * d.Tq;
    const std::size_t kw = static_cast<std::size_t>(d.NKV / n) * d.hs;
    HeadsQkv h = to_heads(*st, q, k, v, d);
    auto datt_h = a.allocate<float>(h.q.size(), Category::workspace);
    all_to_all_sequence_to_heads<float>(comm, {datt, h.q.size()}, datt_h.span(), side(d, d.NH));
    auto dq_h = a.allocate<float>(h.q.size(), Category::workspace);
    auto dk_h = a.allocate<float>(h.k.size(), Category::kv);
    auto dv_h = a.allocate<float>(h.v.size(), Category::kv);
    // Every key of the sequence is here: the one-shot backward, with the forward's lse.
    ref::causal_attention_backward(dq_h.data(), dk_h.data(), dv_h.data(), datt_h.data(), h.q.data(),
                                   h.k.data(), h.v.data(), lse, st->positions.data(),
                                   st->ordered.data(), heads_dims(d, n));
    all_to_all_heads_to_sequence<float>(comm, dq_h.span(), {dq, dq_h.size()}, side(d, d.NH));
    to_gathered_order(dk_h.data(), h.exchange.data(), st->positions.data(), d.B, S, kw);
    all_to_all_heads_to_sequence<float>(comm, h.exchange.span(), {dk, dk_h.size()}, side(d, d.NKV));
    to_gathered_order(dv_h.data(), h.exchange.data(), st->positions.data(), d.B, S, kw);
    all_to_all_heads_to_sequence<float>(comm, h.exchange.span(), {dv, dv_h.size()}, side(d, d.NKV));
  };
  return core;
}

}  // namespace tspemu::tsp
