#include "tspemu/runtime/sequence_heads_exchange.hpp"

#include <cstring>
#include <string>

#include "arguments.hpp"
#include "described_call.hpp"

namespace tspemu::detail {

namespace {

const char* op_name(bool to_heads) {
  return to_heads ? "all_to_all_sequence_to_heads" : "all_to_all_heads_to_sequence";
}

// The call's description (described_call.hpp): word count, direction, B, S_local, H, hs.
std::string describe_call(const std::vector<std::uint64_t>& d) {
  return std::string(op_name(d[1] != 0)) + "(B=" + std::to_string(d[2]) +
         ", S_local=" + std::to_string(d[3]) + ", H=" + std::to_string(d[4]) +
         ", hs=" + std::to_string(d[5]) + ")";
}

std::string dims(std::size_t a, std::size_t b, std::size_t c, std::size_t d) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ", " +
         std::to_string(d) + "]";
}

}  // namespace

void sequence_heads_exchange(Comm& comm, const std::byte* in, std::size_t in_count, std::byte* out,
                             std::size_t out_count, Dtype dtype, const SequenceHeadsShape& shape,
                             bool to_heads) {
  const char* op = op_name(to_heads);
  check_comm(comm, op);
  const std::size_t es = dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  // Named variables, not a structured binding: the lambda below captures them.
  const std::size_t B = shape.B, S = shape.S_local, H = shape.H, hs = shape.hs;
  if (H % n != 0)
    bad_argument(comm, op,
                 "H = " + std::to_string(H) + " heads are not divisible by the " +
                     std::to_string(n) + " ranks");
  const std::size_t Hn = H / n;
  const std::size_t count = B * S * H * hs;
  // Built only for the message: the call itself allocates nothing.
  auto sides = [&](bool seq_side) {
    return seq_side ? "[B, S_local, H, hs] = " + dims(B, S, H, hs)
                    : "[B, n·S_local, H/n, hs] = " + dims(B, n * S, Hn, hs);
  };
  if (in_count != count)
    bad_argument(comm, op,
                 "in " + sides(to_heads) + " needs " + std::to_string(count) + " elements, has " +
                     std::to_string(in_count));
  if (out_count != count)
    bad_argument(comm, op,
                 "out " + sides(!to_heads) + " needs " + std::to_string(count) + " elements, has " +
                     std::to_string(out_count));
  if (overlaps(in, count * es, out, count * es))
    bad_argument(comm, op, "in and out overlap (in place is not supported)");

  const std::uint64_t description[] = {5, to_heads, B, S, H, hs};
  Call call(comm, {CollectiveKind::all_to_all, dtype, kDescribedCallRoot, count},
            std::as_bytes(std::span(description)), /*counts_must_match=*/false);
  require_same_description(call, comm, describe_call);
  call.post(1, std::span<const std::byte>(in, count * es));
  // One row: this rank's Hn heads of one token, Hn·hs elements contiguous on both sides.
  const std::size_t row = Hn * hs * es;
  if (row > 0) {
    for (std::size_t i = 0; i < n; ++i) {
      // Start with the next rank: the ranks spread their first reads over different owners.
      const int q = static_cast<int>((me + i) % n);
      const std::size_t qq = static_cast<std::size_t>(q);
      for (std::size_t b = 0; b < B; ++b) {
        if (to_heads)
          // out_me[b, q·S + s, :, :] = in_q[b, s, me·Hn : (me+1)·Hn, :] for s < S
          call.recv_rows(q, 1, (b * S * n + me) * row, n * row, row, S,
                         out + (b * n * S + qq * S) * row, row);
        else
          // out_me[b, s, q·Hn : (q+1)·Hn, :] = in_q[b, me·S + s, :, :] for s < S
          call.recv_rows(q, 1, (b * n * S + me * S) * row, row, row, S,
                         out + (b * S * n + qq) * row, n * row);
      }
    }
  }
  call.finish();
  const std::size_t block = count / n * es;
  count_traffic(comm, CollectiveKind::all_to_all, (n - 1) * block, (n - 1) * block);
}

}  // namespace tspemu::detail
