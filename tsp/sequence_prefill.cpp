#include "sequence_prefill.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <span>

#include "ring_hop.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/sequence_heads_exchange.hpp"

namespace tspemu::tsp::detail {

namespace {

using Sz = std::size_t;

Sz z(std::int64_t v) {
  return static_cast<Sz>(v);
}

// Every rank's own positions of every sequence: at[q][b] = own.owned(q, b, P_b), and per rank the
// first row of each sequence in its step (sequence-major) and its row count.
struct Layout {
  std::vector<std::vector<std::vector<std::int64_t>>> at;  // [n][B][count]
  std::vector<std::vector<Sz>> first;                      // [n][B]
  std::vector<Sz> rows;                                    // [n]
  Layout(const KvOwnership& own, int n, int B) : at(z(n)), first(z(n)), rows(z(n), 0) {
    for (int q = 0; q < n; ++q)
      for (int b = 0; b < B; ++b) {
        first[z(q)].push_back(rows[z(q)]);
        at[z(q)].push_back(own.owned(q, b, own.prompt_length(b)));
        rows[z(q)] += at[z(q)].back().size();
      }
  }
};

}  // namespace

DecodeStep own_prefill_step(const DecodeStep& all, const KvOwnership& own, int rank) {
  DecodeStep st;
  st.prefill = true;
  for (Sz b = 0; b < all.count.size(); ++b) {
    const int seq = static_cast<int>(b);
    const std::vector<std::int64_t> mine = own.owned(rank, seq, own.prompt_length(seq));
    st.offset.push_back(st.tokens.size());
    st.count.push_back(static_cast<int>(mine.size()));
    for (const std::int64_t p : mine) {
      st.tokens.push_back(all.tokens[all.offset[b] + z(p)]);
      st.positions.push_back(p);
    }
  }
  return st;
}

template <class T>
void ring_prefill_attention(Rank& rank, Comm& comm, const KvOwnership& own, const DecodeStep& st,
                            const T* q, const T* k, const T* v, T* out, T* lse,
                            const PrefillHeads& h, TrafficCounters& traffic) {
  const int n = comm.size(), p = comm.rank(), B = static_cast<int>(st.count.size());
  const Layout lay(own, n, B);
  const Sz kvd = z(h.NKV) * z(h.hs), qd = z(h.NH) * z(h.hs), NH = z(h.NH);
  const Sz N = z(st.rows());
  Arena& a = rank.arena();
  const Sz widest = *std::max_element(lay.rows.begin(), lay.rows.end());
  Buffer<T> block[2] = {a.allocate<T>(2 * widest * kvd, Category::kv),
                        a.allocate<T>(2 * widest * kvd, Category::kv)};
  auto part = a.allocate<T>(N * qd, Category::workspace);
  auto part_lse = a.allocate<T>(N * NH, Category::workspace);
  std::copy_n(k, N * kvd, block[0].data());  // [K rows | V rows] of this rank's N tokens
  std::copy_n(v, N * kvd, block[0].data() + N * kvd);
  for (int j = 0; j < n; ++j) {
    const int src = (p - j + n) % n, next_src = (src - 1 + n) % n;
    const Sz held = lay.rows[z(src)];
    std::optional<RingHop<T>> hop;
    if (j < n - 1)
      measured(rank, traffic, [&] {
        hop.emplace(comm, std::span<const T>(block[j % 2].data(), 2 * held * kvd),
                    std::span<T>(block[(j + 1) % 2].data(), 2 * lay.rows[z(next_src)] * kvd));
      });
    const T* kb = block[j % 2].data();
    const T* vb = kb + held * kvd;
    for (int b = 0; b < B; ++b) {
      const Sz o = st.offset[z(b)], first = lay.first[z(src)][z(b)];
      const auto& keys = lay.at[z(src)][z(b)];
      const int nq = st.count[z(b)], nk = static_cast<int>(keys.size());
      if (nq == 0 || nk == 0) continue;  // an empty block: nothing to merge
      const ref::AttentionDims d{1, nq, nk, h.NH, h.NKV, h.hs};
      const std::int64_t* qpos = st.positions.data() + o;
      if (j == 0) {
        ref::causal_attention_forward(out + o * qd, lse + NH * o, q + o * qd, kb + first * kvd,
                                      vb + first * kvd, qpos, keys.data(), d);
      } else {
        ref::causal_attention_forward(part.data() + o * qd, part_lse.data() + NH * o, q + o * qd,
                                      kb + first * kvd, vb + first * kvd, qpos, keys.data(), d);
        ref::merge_attention_partials(out + o * qd, lse + NH * o, part.data() + o * qd,
                                      part_lse.data() + NH * o, d);
      }
    }
    if (hop) measured(rank, traffic, [&] { hop->wait(); });
  }
}

template <class T>
void ulysses_prefill_attention(Rank& rank, Comm& comm, const KvOwnership& own, const DecodeStep& st,
                               const T* q, const T* k, const T* v, T* out, const PrefillHeads& h,
                               TrafficCounters& traffic) {
  const int n = comm.size(), B = static_cast<int>(st.count.size());
  const Layout lay(own, n, B);
  const Sz nz = z(n), hs = z(h.hs), NHn = z(h.NH) / nz, NKVn = z(h.NKV) / nz;
  const Sz qd = z(h.NH) * hs, kvd = z(h.NKV) * hs;
  std::vector<Sz> slot(z(B));  // sequence b's first slot
  Sz M = 0, longest = 0;
  for (int b = 0; b < B; ++b) {
    slot[z(b)] = M;
    const auto P = z(own.prompt_length(b));
    M += (P + nz - 1) / nz;
    longest = std::max(longest, P);
  }
  Arena& a = rank.arena();
  auto qs = a.allocate<T>(M * qd, Category::comm, /*zero=*/true);  // [M, NH, hs] sequence side
  auto ks = a.allocate<T>(M * kvd, Category::comm, /*zero=*/true);
  auto vs = a.allocate<T>(M * kvd, Category::comm, /*zero=*/true);
  for (int b = 0; b < B; ++b) {
    const Sz o = st.offset[z(b)], c = z(st.count[z(b)]), s = slot[z(b)];
    std::copy_n(q + o * qd, c * qd, qs.data() + s * qd);
    std::copy_n(k + o * kvd, c * kvd, ks.data() + s * kvd);
    std::copy_n(v + o * kvd, c * kvd, vs.data() + s * kvd);
  }
  const Sz wq = NHn * hs, wk = NKVn * hs;                // one slot's row on the heads side
  auto qh = a.allocate<T>(nz * M * wq, Category::comm);  // [n·M, NHn, hs], rank-major slots
  auto kh = a.allocate<T>(nz * M * wk, Category::comm);
  auto vh = a.allocate<T>(nz * M * wk, Category::comm);
  auto ah = a.allocate<T>(nz * M * wq, Category::comm, /*zero=*/true);
  const SequenceHeadsShape q_side{1, M, z(h.NH), hs}, kv_side{1, M, z(h.NKV), hs};
  measured(rank, traffic, [&] {
    all_to_all_sequence_to_heads<T>(comm, qs.span(), qh.span(), q_side);
    all_to_all_sequence_to_heads<T>(comm, ks.span(), kh.span(), kv_side);
    all_to_all_sequence_to_heads<T>(comm, vs.span(), vh.span(), kv_side);
  });
  // One sequence in position order on this rank's heads: the reference's call over all its keys.
  auto qb = a.allocate<T>(longest * wq, Category::workspace);
  auto kb = a.allocate<T>(longest * wk, Category::kv);
  auto vb = a.allocate<T>(longest * wk, Category::kv);
  auto ab = a.allocate<T>(longest * wq, Category::workspace);
  auto lb = a.allocate<T>(longest * NHn, Category::workspace);
  std::vector<std::int64_t> pos(longest);
  std::iota(pos.begin(), pos.end(), std::int64_t{0});
  for (int b = 0; b < B; ++b) {
    const int P = static_cast<int>(own.prompt_length(b));
    for (Sz r = 0; r < nz; ++r) {
      const auto& mine = lay.at[r][z(b)];
      for (Sz i = 0; i < mine.size(); ++i) {
        const Sz from = r * M + slot[z(b)] + i, to = z(mine[i]);
        std::copy_n(qh.data() + from * wq, wq, qb.data() + to * wq);
        std::copy_n(kh.data() + from * wk, wk, kb.data() + to * wk);
        std::copy_n(vh.data() + from * wk, wk, vb.data() + to * wk);
      }
    }
    ref::causal_attention_forward(
        ab.data(), lb.data(), qb.data(), kb.data(), vb.data(), pos.data(), pos.data(),
        ref::AttentionDims{1, P, P, static_cast<int>(NHn), static_cast<int>(NKVn), h.hs});
    for (Sz r = 0; r < nz; ++r) {
      const auto& mine = lay.at[r][z(b)];
      for (Sz i = 0; i < mine.size(); ++i)
        std::copy_n(ab.data() + z(mine[i]) * wq, wq, ah.data() + (r * M + slot[z(b)] + i) * wq);
    }
  }
  measured(rank, traffic,
           [&] { all_to_all_heads_to_sequence<T>(comm, ah.span(), qs.span(), q_side); });
  for (int b = 0; b < B; ++b) {
    const Sz o = st.offset[z(b)], c = z(st.count[z(b)]);
    std::copy_n(qs.data() + slot[z(b)] * qd, c * qd, out + o * qd);
  }
}

#define TSPEMU_SEQUENCE_PREFILL(T)                                                                \
  template void ring_prefill_attention(Rank&, Comm&, const KvOwnership&, const DecodeStep&,       \
                                       const T*, const T*, const T*, T*, T*, const PrefillHeads&, \
                                       TrafficCounters&);                                         \
  template void ulysses_prefill_attention(Rank&, Comm&, const KvOwnership&, const DecodeStep&,    \
                                          const T*, const T*, const T*, T*, const PrefillHeads&,  \
                                          TrafficCounters&);
TSPEMU_SEQUENCE_PREFILL(float)
TSPEMU_SEQUENCE_PREFILL(double)
#undef TSPEMU_SEQUENCE_PREFILL

}  // namespace tspemu::tsp::detail
