#include "tspemu/tsp/ulysses_attention.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
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

// positions: [n·Tl] the group's global positions in the exchange's (member-major) order.
struct UlyssesState : detail::CoreState {
  UlyssesState(Comm& c, Arena& a, const ref::AttentionDims& d, std::span<const std::int64_t> all,
               ref::AttentionCore<float> inner_)
      : CoreState(kWho, c, a, d, all), inner(std::move(inner_)) {
    ordered = a.allocate<std::int64_t>(all.size(), Category::other);
    if (dry_run()) return;
    std::copy(all.begin(), all.end(), ordered.begin());
    std::sort(ordered.begin(), ordered.end());
  }
  // Where gathered token i sits in position order: its position's rank among the group's.
  std::size_t slot(std::size_t i) const {
    const std::int64_t* o = ordered.data();
    return static_cast<std::size_t>(std::lower_bound(o, o + ordered.size(), positions[i]) - o);
  }
  Buffer<std::int64_t> ordered;     // [n·Tl] the group's positions, ascending (other)
  ref::AttentionCore<float> inner;  // empty: the local causal attention on the gathered heads
};

// [B, S, w] rows between the gathered (member-major) order and position order (S = n·Tl).
void to_position_order(const float* gathered, float* ordered, const UlyssesState& st, int B, int S,
                       std::size_t w) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      std::memcpy(ordered + (static_cast<std::size_t>(b) * S + st.slot(i)) * w,
                  gathered + (static_cast<std::size_t>(b) * S + i) * w, w * sizeof(float));
}
void to_gathered_order(const float* ordered, float* gathered, const UlyssesState& st, int B, int S,
                       std::size_t w) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      std::memcpy(gathered + (static_cast<std::size_t>(b) * S + i) * w,
                  ordered + (static_cast<std::size_t>(b) * S + st.slot(i)) * w, w * sizeof(float));
}

// The sequence side of a tensor with H heads: [B, Tl, H, hs].
SequenceHeadsShape side(const ref::AttentionDims& d, int H) {
  return {static_cast<std::size_t>(d.B), static_cast<std::size_t>(d.Tq),
          static_cast<std::size_t>(H), static_cast<std::size_t>(d.hs)};
}

// A [B, Tl, H, hs] tensor → heads [B, S, H/n, hs] in position order (with the inner core: every
// tensor it reads is in the order of its positions), through a gathered-order buffer.
Buffer<float> heads_in_position_order(UlyssesState& st, const float* in,
                                      const ref::AttentionDims& d, int H) {
  Arena& a = *st.arena;
  const int n = st.comm->size(), S = n * d.Tq;
  const std::size_t count = static_cast<std::size_t>(d.B) * d.Tq * H * d.hs;
  auto gathered = a.allocate<float>(count, Category::comm);
  auto ordered = a.allocate<float>(count, Category::workspace);
  all_to_all_sequence_to_heads<float>(*st.comm, {in, count}, gathered.span(), side(d, H));
  to_position_order(gathered.data(), ordered.data(), st, d.B, S,
                    static_cast<std::size_t>(H / n) * d.hs);
  return ordered;
}

// Heads [B, S, H/n, hs] in position order → the sequence side `out` [B, Tl, H, hs].
void sequence_from_position_order(UlyssesState& st, const float* ordered, float* out,
                                  const ref::AttentionDims& d, int H) {
  const int n = st.comm->size(), S = n * d.Tq;
  const std::size_t count = static_cast<std::size_t>(d.B) * d.Tq * H * d.hs;
  auto gathered = st.arena->allocate<float>(count, Category::comm);
  to_gathered_order(ordered, gathered.data(), st, d.B, S, static_cast<std::size_t>(H / n) * d.hs);
  all_to_all_heads_to_sequence<float>(*st.comm, gathered.span(), {out, count}, side(d, H));
}

// Q → heads (gathered order; position order with an inner core), K, V → heads in position order
// (via the exchange buffer).
struct HeadsQkv {
  Buffer<float> q, exchange, k, v;
};
HeadsQkv to_heads(UlyssesState& st, const float* q, const float* k, const float* v,
                  const ref::AttentionDims& d) {
  Arena& a = *st.arena;
  Comm& comm = *st.comm;
  const std::size_t nq = static_cast<std::size_t>(d.B) * d.Tq * d.NH * d.hs;
  const std::size_t nk = static_cast<std::size_t>(d.B) * d.Tq * d.NKV * d.hs;
  const int n = comm.size(), S = n * d.Tq;
  const std::size_t kw = static_cast<std::size_t>(d.NKV / n) * d.hs;  // one token's K row
  HeadsQkv h;
  if (st.inner.forward) {
    h.q = heads_in_position_order(st, q, d, d.NH);  // [B, S, NHn, hs], position order
  } else {
    h.q = a.allocate<float>(nq, Category::workspace);  // [B, S, NHn, hs], gathered order
    all_to_all_sequence_to_heads<float>(comm, {q, nq}, h.q.span(), side(d, d.NH));
  }
  h.exchange = a.allocate<float>(nk, Category::comm);  // [B, S, NKVn, hs], gathered order
  h.k = a.allocate<float>(nk, Category::kv);           // [B, S, NKVn, hs], position order
  h.v = a.allocate<float>(nk, Category::kv);
  all_to_all_sequence_to_heads<float>(comm, {k, nk}, h.exchange.span(), side(d, d.NKV));
  to_position_order(h.exchange.data(), h.k.data(), st, d.B, S, kw);
  all_to_all_sequence_to_heads<float>(comm, {v, nk}, h.exchange.span(), side(d, d.NKV));
  to_position_order(h.exchange.data(), h.v.data(), st, d.B, S, kw);
  return h;
}

ref::AttentionDims heads_dims(const ref::AttentionDims& d, int n) {
  return {d.B, n * d.Tq, n * d.Tq, d.NH / n, d.NKV / n, d.hs};
}

// Backward with an inner core: every heads tensor in position order, the output A exchanged
// again (the inner core's backward reads it: ring attention's row delta).
void inner_backward(UlyssesState& st, float* dq, float* dk, float* dv, const float* datt,
                    const float* q, const float* k, const float* v, const float* att,
                    const float* lse, const ref::AttentionDims& d) {
  Arena& a = *st.arena;
  const int n = st.comm->size();
  HeadsQkv h = to_heads(st, q, k, v, d);
  auto datt_h = heads_in_position_order(st, datt, d, d.NH);
  auto att_h = heads_in_position_order(st, att, d, d.NH);
  auto dq_h = a.allocate<float>(h.q.size(), Category::workspace);
  auto dk_h = a.allocate<float>(h.k.size(), Category::kv);
  auto dv_h = a.allocate<float>(h.v.size(), Category::kv);
  st.inner.backward(dq_h.data(), dk_h.data(), dv_h.data(), datt_h.data(), h.q.data(), h.k.data(),
                    h.v.data(), att_h.data(), lse, st.ordered.data(), heads_dims(d, n));
  sequence_from_position_order(st, dq_h.data(), dq, d, d.NH);
  sequence_from_position_order(st, dk_h.data(), dk, d, d.NKV);
  sequence_from_position_order(st, dv_h.data(), dv, d, d.NKV);
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
  detail::check_sequence_shape(kWho, rank.size(), shape);
  return ulysses_attention_core(rank.comm(), rank.arena(), detail::sequence_dims(shape),
                                detail::row_positions(shape));
}

ref::AttentionCore<float> ulysses_attention_core(Comm& group, Arena& arena,
                                                 const ref::AttentionDims& dims,
                                                 std::span<const std::int64_t> positions,
                                                 ref::AttentionCore<float> inner) {
  const int n = group.size();
  if (n < 1 || dims.NH % n != 0 || dims.NKV % n != 0)
    throw std::invalid_argument(std::string(kWho) + ": the group's n=" + std::to_string(n) +
                                " ranks must divide NH=" + std::to_string(dims.NH) +
                                " and NKV=" + std::to_string(dims.NKV) +
                                " (each rank attends whole query and KV heads)");
  if (static_cast<bool>(inner.forward) != static_cast<bool>(inner.backward))
    throw std::invalid_argument(std::string(kWho) + ": the inner core needs both functions");
  auto st = std::make_shared<UlyssesState>(group, arena, dims, positions, std::move(inner));

  ref::AttentionCore<float> core;
  core.forward = [st](float* att, float* lse, const float* q, const float* k, const float* v,
                      const std::int64_t*, const ref::AttentionDims& d) {
    st->check(d);
    Comm& comm = *st->comm;
    const int n = comm.size();
    HeadsQkv h = to_heads(*st, q, k, v, d);
    auto att_h = st->arena->allocate<float>(h.q.size(), Category::workspace);
    if (st->inner.forward) {  // every tensor in position order
      st->inner.forward(att_h.data(), lse, h.q.data(), h.k.data(), h.v.data(), st->ordered.data(),
                        heads_dims(d, n));
      sequence_from_position_order(*st, att_h.data(), att, d, d.NH);
      return;
    }
    // Whole sequence, this rank's heads: queries in gathered order, keys in position order.
    ref::causal_attention_forward(att_h.data(), lse, h.q.data(), h.k.data(), h.v.data(),
                                  st->positions.data(), st->ordered.data(), heads_dims(d, n));
    all_to_all_heads_to_sequence<float>(comm, att_h.span(), {att, att_h.size()}, side(d, d.NH));
  };
  core.backward = [st](float* dq, float* dk, float* dv, const float* datt, const float* q,
                       const float* k, const float* v, const float* att, const float* lse,
                       const std::int64_t*, const ref::AttentionDims& d) {
    st->check(d);
    if (st->inner.backward) {
      inner_backward(*st, dq, dk, dv, datt, q, k, v, att, lse, d);
      return;
    }
    Comm& comm = *st->comm;
    Arena& a = *st->arena;
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
    to_gathered_order(dk_h.data(), h.exchange.data(), *st, d.B, S, kw);
    all_to_all_heads_to_sequence<float>(comm, h.exchange.span(), {dk, dk_h.size()}, side(d, d.NKV));
    to_gathered_order(dv_h.data(), h.exchange.data(), *st, d.B, S, kw);
    all_to_all_heads_to_sequence<float>(comm, h.exchange.span(), {dv, dv_h.size()}, side(d, d.NKV));
  };
  return core;
}

}  // namespace tspemu::tsp
