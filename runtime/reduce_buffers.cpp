#include "tspemu/runtime/reduce_buffers.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "arguments.hpp"
#include "exposed_call.hpp"
#include "round.hpp"

namespace tspemu::detail {

namespace {

// What a rank publishes: its table of buffers (the caller's array; peers read the spans in it).
template <class T>
struct SetCall {
  const std::span<T>* table;
  std::size_t buffers;
};

template <class T>
const std::byte* bytes_of(const T* p) {
  return reinterpret_cast<const std::byte*>(p);
}
template <class T>
std::byte* bytes_of(T* p) {
  return reinterpret_cast<std::byte*>(p);
}

template <class T>
std::size_t total_count(std::span<const std::span<T>> buffers) {
  std::size_t total = 0;
  for (const auto& b : buffers) total += b.size();
  return total;
}

// Programming errors in this rank's set, before the call touches the mailbox.
template <class T>
void check_set(Comm& comm, const char* op, std::span<const std::span<T>> buffers) {
  check_comm(comm, op);
  // Quadratic, but a set is a layer's tensors; buffers that overlap would race.
  for (std::size_t i = 0; i < buffers.size(); ++i)
    for (std::size_t j = i + 1; j < buffers.size(); ++j)
      if (overlaps(bytes_of(buffers[i].data()), buffers[i].size_bytes(),
                   bytes_of(buffers[j].data()), buffers[j].size_bytes()))
        bad_argument(comm, op,
                     "buffers " + std::to_string(i) + " and " + std::to_string(j) + " overlap");
}

// Publishes this rank's set and checks that every rank passed the same number of buffers with the
// same sizes.
template <class T>
class SetRound {
 public:
  SetRound(Comm& comm, const char* op, CollectiveKind kind, std::span<const std::span<T>> buffers,
           std::size_t fingerprint_count)
      : call_{{buffers.data(), buffers.size()}, {}},
        rd_(comm, {kind, dtype_of<T>(), kExposedCallRoot, fingerprint_count}, call_.payload(),
            nullptr,
            /*fingerprint_counts_must_match=*/false) {
    require_same_call<SetCall<T>>(
        rd_, comm,
        [](const SetCall<T>& a, const SetCall<T>& b) {
          if (a.buffers != b.buffers) return false;
          for (std::size_t i = 0; i < a.buffers; ++i)
            if (a.table[i].size() != b.table[i].size()) return false;
          return true;
        },
        [op](const SetCall<T>& c) { return describe(op, c); });
  }

  Round& round() { return rd_; }
  // Member r's buffers; read them (and this) under a ReadScope.
  const std::span<T>* table(int r) const { return ExposedCall<SetCall<T>>::of(rd_, r).table; }

 private:
  static std::string describe(const char* op, const SetCall<T>& c) {
    constexpr std::size_t kListed = 8;
    std::string s = std::string(op) + "(" + std::to_string(c.buffers) + " buffers";
    std::size_t total = 0;
    for (std::size_t i = 0; i < c.buffers; ++i) {
      total += c.table[i].size();
      if (i < kListed) s += (i ? ", " : ": ") + std::to_string(c.table[i].size());
    }
    if (c.buffers > kListed) s += ", ...";
    if (c.buffers > 0) s += " elements";
    return s + ", total " + std::to_string(total) + ", " + dtype_name(dtype_of<T>()) + ")";
  }

  const ExposedCall<SetCall<T>> call_;
  Round rd_;
};

// Calls fn(i, at, len) for each piece of [lo, hi) of the buffers' concatenation: buffer i's
// elements [at, at + len).
template <class T, class Fn>
void for_each_piece(std::span<const std::span<T>> buffers, std::size_t lo, std::size_t hi,
                    Fn&& fn) {
  std::size_t offset = 0;
  for (std::size_t i = 0; i < buffers.size() && offset < hi; ++i) {
    const std::size_t size = buffers[i].size();
    const std::size_t b = std::max(lo, offset), e = std::min(hi, offset + size);
    if (b < e) fn(i, b - offset, e - b);
    offset += size;
  }
}

// Balanced chunk c of count over n ranks, as all_reduce's: the first count % n one longer.
std::size_t chunk_begin(std::size_t count, std::size_t n, std::size_t c) {
  return c * (count / n) + std::min(c, count % n);
}

}  // namespace

template <class T>
void all_reduce_buffers(Comm& comm, std::span<const std::span<T>> buffers) {
  constexpr Dtype dtype = dtype_of<T>();
  const char* op = "all_reduce_buffers";
  check_set(comm, op, buffers);
  const std::size_t total = total_count(buffers);
  SetRound<T> set(comm, op, CollectiveKind::all_reduce, buffers, total);
  Round& rd = set.round();
  const int n = rd.size();
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t me = static_cast<std::size_t>(rd.rank());
  // Step 1 (reduce-scatter): this rank sums its chunk of the concatenation over every rank's
  // buffers, in place. Safe: only this rank reads its own chunk of its own buffers.
  const std::size_t b0 = chunk_begin(total, nn, me), b1 = chunk_begin(total, nn, me + 1);
  {
    ReadScope read(rd);
    const std::span<T>* tables[kMaxRanks];
    for (int r = 0; r < n; ++r) tables[r] = set.table(r);
    for_each_piece(buffers, b0, b1, [&](std::size_t i, std::size_t at, std::size_t len) {
      const std::byte* srcs[kMaxRanks];
      for (int r = 0; r < n; ++r) srcs[r] = bytes_of(tables[r][i].data() + at);
      sum_ranks_into(dtype, bytes_of(buffers[i].data() + at), srcs, n, len);
    });
  }
  rd.advance(kReduced);
  // Step 2 (all-gather): copy each owner's reduced chunk once it is ready. Overwriting our chunk c
  // is safe then: its owner, the only reader of it, has finished step 1.
  for (std::size_t k = 1; k < nn; ++k) {
    const std::size_t c = (me + k) % nn;
    rd.wait_stage(static_cast<int>(c), kReduced);
    ReadScope read(rd);
    const std::span<T>* owner = set.table(static_cast<int>(c));
    for_each_piece(buffers, chunk_begin(total, nn, c), chunk_begin(total, nn, c + 1),
                   [&](std::size_t i, std::size_t at, std::size_t len) {
                     std::memcpy(buffers[i].data() + at, owner[i].data() + at, len * sizeof(T));
                   });
  }
  rd.finish();
  // As all_reduce counts one buffer of the concatenated count (counters.hpp).
  const std::size_t bytes = total * sizeof(T), mine = (b1 - b0) * sizeof(T);
  const std::size_t traffic = (bytes - mine) + (nn - 1) * mine;
  count_traffic(comm, CollectiveKind::all_reduce, traffic, traffic);
}

template <class T>
void reduce_scatter_buffers(Comm& comm, std::span<const std::span<T>> buffers) {
  const char* op = "reduce_scatter_buffers";
  check_set(comm, op, buffers);
  const std::size_t nn = static_cast<std::size_t>(comm.size());
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].size() % nn != 0)
      bad_argument(comm, op,
                   "buffer " + std::to_string(i) + " has " + std::to_string(buffers[i].size()) +
                       " elements, not a multiple of the " + std::to_string(nn) + " ranks");
  const std::size_t block_total = total_count(buffers) / nn;
  SetRound<T> set(comm, op, CollectiveKind::reduce_scatter, buffers, block_total);
  Round& rd = set.round();
  const int n = rd.size();
  const std::size_t me = static_cast<std::size_t>(rd.rank());
  {
    // In place is safe: the peers read only their own blocks of our buffers.
    ReadScope read(rd);
    const std::span<T>* tables[kMaxRanks];
    for (int r = 0; r < n; ++r) tables[r] = set.table(r);
    const std::byte* srcs[kMaxRanks];
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const std::size_t c = buffers[i].size() / nn;
      for (int r = 0; r < n; ++r) srcs[r] = bytes_of(tables[r][i].data() + me * c);
      sum_ranks_into(dtype_of<T>(), bytes_of(buffers[i].data() + me * c), srcs, n, c);
    }
  }
  rd.finish();
  const std::size_t moved = (nn - 1) * block_total * sizeof(T);
  count_traffic(comm, CollectiveKind::reduce_scatter, moved, moved);
}

#define TSPEMU_INSTANTIATE(T)                                                \
  template void all_reduce_buffers<T>(Comm&, std::span<const std::span<T>>); \
  template void reduce_scatter_buffers<T>(Comm&, std::span<const std::span<T>>);
TSPEMU_INSTANTIATE(float)
TSPEMU_INSTANTIATE(double)
TSPEMU_INSTANTIATE(std::int32_t)
TSPEMU_INSTANTIATE(std::int64_t)
#undef TSPEMU_INSTANTIATE

}  // namespace tspemu::detail
