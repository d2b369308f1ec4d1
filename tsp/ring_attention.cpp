#include "tspemu/tsp/ring_attention.hpp"

#include <cstring>
#include <memory>
#include <optional>
#include <span>

#include "ring_hop.hpp"
#include "sequence_core.hpp"
#include "tspemu/core/dry_run.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/send_recv.hpp"

namespace tspemu::tsp {

namespace {

// One hop of the ring, posted before the step's compute and completed after it.
using Hop = detail::RingHop<float>;

// Step j's block and step j+1's arriving one: two buffers of `count` floats (kv), used in turn.
struct DoubleBuffer {
  Buffer<float> buf[2];
  DoubleBuffer(Arena& a, std::size_t count) {
    for (auto& b : buf) b = a.allocate<float>(count, Category::kv);
  }
  std::span<float> at(int j) { return buf[j % 2].span(); }
};

}  // namespace

ref::AttentionCore<float> ring_attention_core(Rank& rank, const BaselineShape& shape) {
  detail::check_sequence_shape("ring attention", rank.size(), shape);
  return ring_attention_core(rank.comm(), rank.arena(), detail::sequence_dims(shape),
                             detail::row_positions(shape));
}

ref::AttentionCore<float> ring_attention_core(Comm& group, Arena& arena,
                                              const ref::AttentionDims& dims,
                                              std::span<const std::int64_t> positions) {
  auto st = std::make_shared<detail::CoreState>("ring attention", group, arena, dims, positions);

  ref::AttentionCore<float> core;
  core.forward = [st](float* att, float* lse, const float* q, const float* k, const float* v,
                      const std::int64_t*, const ref::AttentionDims& d) {
    st->check(d);
    Comm& comm = *st->comm;
    const int n = comm.size(), p = comm.rank();
    const std::int64_t* qpos = st->of(p);
    // Step 0, this rank's own block: straight into the running result (the reference's call).
    if (n == 1) {
      ref::causal_attention_forward(att, lse, q, k, v, qpos, qpos, d);
      return;
    }
    Arena& a = *st->arena;
    const std::size_t nk = static_cast<std::size_t>(d.B) * d.Tk * d.NKV * d.hs;
    DoubleBuffer kv(a, 2 * nk);  // [K, V] blocks, each [B, Tl, NKV, hs]
    auto part = a.allocate<float>(static_cast<std::size_t>(d.B) * d.Tq * d.NH * d.hs,
                                  Category::workspace);  // one block's output [B, Tl, NH, hs]
    auto part_lse = a.allocate<float>(static_cast<std::size_t>(d.B) * d.NH * d.Tq,
                                      Category::workspace);  // [B, NH, Tl]
    if (!dry_run()) {
      std::memcpy(kv.at(0).data(), k, nk * sizeof(float));
      std::memcpy(kv.at(0).data() + nk, v, nk * sizeof(float));
    }
    for (int j = 0; j < n; ++j) {
      const int src = (p - j + n) % n;
      std::optional<Hop> hop;
      if (j < n - 1) hop.emplace(comm, kv.at(j), kv.at(j + 1));
      if (j == 0) {
        ref::causal_attention_forward(att, lse, q, k, v, qpos, qpos, d);
      } else {
        const float* kb = kv.at(j).data();
        ref::causal_attention_forward(part.data(), part_lse.data(), q, kb, kb + nk, qpos,
                                      st->of(src), d);
        ref::merge_attention_partials(att, lse, part.data(), part_lse.data(), d);
      }
      if (hop) hop->wait();
    }
  };
  core.backward = [st](float* dq, float* dk, float* dv, const float* datt, const float* q,
                       const float* k, const float* v, const float* att, const float* lse,
                       const std::int64_t*, const ref::AttentionDims& d) {
    st->check(d);
    Comm& comm = *st->comm;
    const int n = comm.size(), p = comm.rank();
    const std::int64_t* qpos = st->of(p);
    if (n == 1) {  // one block holds every key: the reference's one-shot backward
      ref::causal_attention_backward(dq, dk, dv, datt, q, k, v, lse, qpos, qpos, d);
      return;
    }
    Arena& a = *st->arena;
    const std::size_t nk = static_cast<std::size_t>(d.B) * d.Tk * d.NKV * d.hs;
    auto delta = a.allocate<float>(static_cast<std::size_t>(d.B) * d.NH * d.Tq,
                                   Category::workspace);  // [B, NH, Tl]
    ref::attention_row_delta(delta.data(), datt, att, d);
    DoubleBuffer kv(a, 2 * nk), dkv(a, 2 * nk);  // [K, V] blocks and [dK, dV] accumulators
    if (!dry_run()) {
      std::memcpy(kv.at(0).data(), k, nk * sizeof(float));
      std::memcpy(kv.at(0).data() + nk, v, nk * sizeof(float));
      std::memset(dkv.at(0).data(), 0, 2 * nk * sizeof(float));
      std::memset(dq, 0, static_cast<std::size_t>(d.B) * d.Tq * d.NH * d.hs * sizeof(float));
    }
    for (int j = 0; j < n; ++j) {
      const int src = (p - j + n) % n;
      std::optional<Hop> kv_hop;
      if (j < n - 1) kv_hop.emplace(comm, kv.at(j), kv.at(j + 1));
      // Block src's accumulator holds the shares of its holders src..p-1; add this rank's.
      const float* kb = kv.at(j).data();
      float* db = dkv.at(j).data();
      ref::causal_attention_backward(dq, db, db + nk, datt, q, kb, kb + nk, lse, qpos, st->of(src),
                                     d, delta.data(), /*accumulate=*/true);
      Hop dkv_hop(comm, dkv.at(j), dkv.at(j + 1));
      // Complete the receives from prev in the order they were posted: the runtime records a
      // pair's progress as one counter (`consumed`), so completing the later one first would
      // leave the sender of the earlier one waiting.
      if (kv_hop) kv_hop->wait();
      dkv_hop.wait();
    }
    // The n-th hop brought this rank's own block, summed over every rank's queries.
    if (dry_run()) return;
    std::memcpy(dk, dkv.at(n).data(), nk * sizeof(float));
    std::memcpy(dv, dkv.at(n).data() + nk, nk * sizeof(float));
  };
  return core;
}

}  // namespace tspemu::tsp
