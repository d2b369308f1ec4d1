#include "tspemu/runtime/all_to_all.hpp"

#include "arguments.hpp"

namespace tspemu::detail {

void all_to_all(Comm& comm, const std::byte* send, std::size_t send_count, std::byte* recv,
                std::size_t recv_count, Dtype dtype) {
  check_comm(comm, "all_to_all");
  const std::size_t es = dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  check_count(comm, "all_to_all", "recv", recv_count, send_count);
  if (send_count % n != 0)
    bad_argument(comm, "all_to_all",
                 "send has " + std::to_string(send_count) + " elements, not a multiple of the " +
                     std::to_string(n) + " ranks");
  if (overlaps(send, send_count * es, recv, recv_count * es))
    bad_argument(comm, "all_to_all", "send and recv overlap (in place is not supported)");
  const std::size_t block = send_count / n * es;
  Call call(comm, {CollectiveKind::all_to_all, dtype, -1, send_count},
            std::span<const std::byte>(send, send_count * es));
  if (block > 0)
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t q = (me + i) % n;
      call.recv(static_cast<int>(q), 0, me * block, {recv + q * block, block});
    }
  call.finish();
  count_traffic(comm, CollectiveKind::all_to_all, (n - 1) * block, (n - 1) * block);
}

}  // namespace tspemu::detail
