#include "tspemu/runtime/reduce_buffers.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "arguments.hpp"
#include "described_call.hpp"

namespace tspemu::detail {

namespace {

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

inline constexpr std::size_t kInlineBuffers = 16;

// One call over a set of buffers: step 0 is the description (the number of buffers, then each
// one's size), checked to be every member's; step 1 is the set itself, one message of pieces.
template <class T>
class SetCall {
 public:
  SetCall(Comm& comm, const char* op, CollectiveKind kind, std::span<const std::span<T>> buffers,
          std::size_t fingerprint_count)
      : description_(describe_set(buffers)),
        pieces_(pieces_of(buffers)),
        call_(comm, {kind, dtype_of<T>(), kDescribedCallRoot, fingerprint_count},
              std::as_bytes(description_.span()), /*counts_must_match=*/false) {
    require_same_description(call_, comm,
                             [op](const std::vector<std::uint64_t>& d) { return describe(op, d); });
    call_.post(1, pieces());
  }

  Call& call() { return call_; }
  Pieces pieces() const { return pieces_.span(); }

 private:
  static CallArray<std::uint64_t, kInlineBuffers + 1> describe_set(
      std::span<const std::span<T>> buffers) {
    CallArray<std::uint64_t, kInlineBuffers + 1> d(buffers.size() + 1);
    d[0] = buffers.size();
    for (std::size_t i = 0; i < buffers.size(); ++i) d[i + 1] = buffers[i].size();
    return d;
  }
  static CallArray<std::span<const std::byte>, kInlineBuffers> pieces_of(
      std::span<const std::span<T>> buffers) {
    CallArray<std::span<const std::byte>, kInlineBuffers> p(buffers.size());
    for (std::size_t i = 0; i < buffers.size(); ++i) p[i] = std::as_bytes(buffers[i]);
    return p;
  }
  static std::string describe(const char* op, const std::vector<std::uint64_t>& d) {
    constexpr std::size_t kListed = 8;
    const std::size_t buffers = d[0];
    std::string s = std::string(op) + "(" + std::to_string(buffers) + " buffers";
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < buffers; ++i) {
      total += d[i + 1];
      if (i < kListed) s += (i ? ", " : ": ") + std::to_string(d[i + 1]);
    }
    if (buffers > kListed) s += ", ...";
    if (buffers > 0) s += " elements";
    return s + ", total " + std::to_string(total) + ", " + dtype_name(dtype_of<T>()) + ")";
  }

  const CallArray<std::uint64_t, kInlineBuffers + 1> description_;
  const CallArray<std::span<const std::byte>, kInlineBuffers> pieces_;
  Call call_;
};

// Calls fn(i, at, len, pos) for each piece of [lo, hi) of the buffers' concatenation: buffer i's
// elements [at, at + len), which start at element pos of the concatenation.
template <class T, class Fn>
void for_each_piece(std::span<const std::span<T>> buffers, std::size_t lo, std::size_t hi,
                    Fn&& fn) {
  std::size_t offset = 0;
  for (std::size_t i = 0; i < buffers.size() && offset < hi; ++i) {
    const std::size_t size = buffers[i].size();
    const std::size_t b = std::max(lo, offset), e = std::min(hi, offset + size);
    if (b < e) fn(i, b - offset, e - b, b);
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
  SetCall<T> set(comm, op, CollectiveKind::all_reduce, buffers, total);
  Call& call = set.call();
  const std::size_t nn = static_cast<std::size_t>(call.size());
  const std::size_t me = static_cast<std::size_t>(call.rank());
  // Step 1 (reduce-scatter): this rank sums its chunk of the concatenation over every rank's
  // set, in place. Safe: only this rank reads its own chunk of its own buffers.
  const std::size_t b0 = chunk_begin(total, nn, me), b1 = chunk_begin(total, nn, me + 1);
  for_each_piece(
      buffers, b0, b1, [&](std::size_t i, std::size_t at, std::size_t len, std::size_t pos) {
        call.recv_reduce(1, pos * sizeof(T), len, dtype, bytes_of(buffers[i].data() + at));
      });
  // Step 2 (all-gather): post the set, whose chunk `me` is now reduced; copy each owner's reduced
  // chunk once posted. Overwriting our chunk c is safe then: its owner, the only reader of it,
  // has finished step 1.
  call.post(2, set.pieces());
  for (std::size_t k = 1; k < nn; ++k) {
    const std::size_t c = (me + k) % nn;
    for_each_piece(buffers, chunk_begin(total, nn, c), chunk_begin(total, nn, c + 1),
                   [&](std::size_t i, std::size_t at, std::size_t len, std::size_t pos) {
                     call.recv(static_cast<int>(c), 2, pos * sizeof(T),
                               {bytes_of(buffers[i].data() + at), len * sizeof(T)});
                   });
  }
  call.finish();
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
  SetCall<T> set(comm, op, CollectiveKind::reduce_scatter, buffers, block_total);
  Call& call = set.call();
  const std::size_t me = static_cast<std::size_t>(call.rank());
  // In place is safe: the peers read only their own blocks of our buffers.
  std::size_t offset = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::size_t c = buffers[i].size() / nn;
    call.recv_reduce(1, (offset + me * c) * sizeof(T), c, dtype_of<T>(),
                     bytes_of(buffers[i].data() + me * c));
    offset += buffers[i].size();
  }
  call.finish();
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
