#include "tspemu/runtime/all_reduce.hpp"

#include <cstring>

#include "arguments.hpp"

namespace tspemu::detail {

namespace {
// Balanced chunk c of count over n ranks: the first count % n chunks have one more element.
std::size_t chunk_begin(std::size_t count, std::size_t n, std::size_t c) {
  return c * (count / n) + std::min(c, count % n);
}
}  // namespace

void all_reduce(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
                std::size_t recv_count, Dtype dtype) {
  check_comm(comm, "all_reduce");
  const std::size_t es = dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  check_count(comm, "all_reduce", "recv", recv_count, send_count);
  const std::size_t bytes = send_count * es;
  if (send != recv && overlaps(send, bytes, recv, bytes))
    bad_argument(comm, "all_reduce", "send and recv overlap without being the same buffer");
  if (dtype == Dtype::byte) bad_argument(comm, "all_reduce", "cannot sum raw bytes");
  // Small: one step (below); the branch follows from the count and dtype every member agrees on.
  Call call(comm, {CollectiveKind::all_reduce, dtype, -1, send_count},
            std::span<const std::byte>(send, bytes), /*counts_must_match=*/true,
            bytes <= kSmallMessageBytes ? CallForm::step0_only : CallForm::general);
  const std::size_t b0 = chunk_begin(send_count, n, me);
  const std::size_t mine = chunk_begin(send_count, n, me + 1) - b0;
  // Counted as the two-step algorithm on every path (counters.hpp: reduce_scatter + all_gather
  // over balanced chunks), so the counters follow the formula, not the payload size.
  const std::size_t traffic = (bytes - mine * es) + (n - 1) * mine * es;
  if (bytes <= kSmallMessageBytes) {
    // Small: the inputs came with the meet; every rank sums all of them itself, in rank order,
    // so all agree bitwise.
    call.recv_reduce(0, 0, send_count, dtype, recv);
    call.finish();
    count_traffic(comm, CollectiveKind::all_reduce, traffic, traffic);
    return;
  }
  // Step 0 (reduce-scatter): this rank sums its chunk over every rank's input into recv. In place
  // is safe: only this rank reads its own chunk of its own buffer.
  call.recv_reduce(0, b0 * es, mine, dtype, recv + b0 * es);
  // Step 1 (all-gather): post recv, whose chunk `me` is now reduced; copy each owner's reduced
  // chunk once posted. Overwriting our chunk c is safe then: its owner, the only reader of it,
  // has finished step 0.
  call.post(1, std::span<const std::byte>(recv, bytes));
  std::size_t received = 0;
  BlockRead reads[kMaxRanks];
  for (std::size_t i = 1; i < n; ++i) {
    const std::size_t c = (me + i) % n;
    const std::size_t cb = chunk_begin(send_count, n, c);
    const std::size_t len = (chunk_begin(send_count, n, c + 1) - cb) * es;
    reads[i - 1] = {static_cast<int>(c), cb * es, recv + cb * es, len};
    received += len;
  }
  call.recv_each(1, std::span<const BlockRead>(reads, n - 1));
  call.finish();
  // Sent: the other ranks read their chunks of our input, then our reduced chunk.
  count_traffic(comm, CollectiveKind::all_reduce, traffic, (n - 1) * mine * es + received);
}

}  // namespace tspemu::detail
