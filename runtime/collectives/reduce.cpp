#include "tspemu/runtime/reduce.hpp"

#include "arguments.hpp"

namespace tspemu::detail {

void reduce(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
            std::size_t recv_count, Dtype dtype, int root) {
  check_comm(comm, "reduce");
  check_root(comm, "reduce", root);
  const std::size_t es = dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const bool is_root = comm.rank() == root;
  const std::size_t bytes = send_count * es;
  if (is_root) {
    check_count(comm, "reduce", "recv (at the root)", recv_count, send_count);
    if (send != recv && overlaps(send, bytes, recv, bytes))
      bad_argument(comm, "reduce", "send and recv overlap without being the same buffer");
  }
  if (dtype == Dtype::byte) bad_argument(comm, "reduce", "cannot sum raw bytes");
  Call call(comm, {CollectiveKind::reduce, dtype, root, send_count},
            std::span<const std::byte>(send, bytes));
  if (is_root) call.recv_reduce(0, 0, send_count, dtype, recv);
  call.finish();
  count_traffic(comm, CollectiveKind::reduce, is_root ? 0 : bytes, is_root ? (n - 1) * bytes : 0);
}

}  // namespace tspemu::detail
