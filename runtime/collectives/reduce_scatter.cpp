#include "tspemu/runtime/reduce_scatter.hpp"

#include "arguments.hpp"

namespace tspemu::detail {

void reduce_scatter(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
                    std::size_t recv_count, Dtype dtype) {
  check_comm(comm, "reduce_scatter");
  const std::size_t es = dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  check_count(comm, "reduce_scatter", "send", send_count, n * recv_count);
  const std::size_t block = recv_count * es;
  if (recv != send + me * block && overlaps(send, send_count * es, recv, block))
    bad_argument(comm, "reduce_scatter", "recv overlaps send but is not this rank's block of it");
  if (dtype == Dtype::byte) bad_argument(comm, "reduce_scatter", "cannot sum raw bytes");
  Call call(comm, {CollectiveKind::reduce_scatter, dtype, -1, recv_count},
            std::span<const std::byte>(send, send_count * es));
  // In place is safe: recv aliases only this rank's own block, which no peer reads.
  call.recv_reduce(0, me * block, recv_count, dtype, recv);
  call.finish();
  count_traffic(comm, CollectiveKind::reduce_scatter, (n - 1) * block, (n - 1) * block);
}

}  // namespace tspemu::detail
