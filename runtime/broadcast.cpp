#include "tspemu/runtime/broadcast.hpp"

#include <cstring>

#include "arguments.hpp"
#include "round.hpp"

namespace tspemu::detail {

void broadcast(Comm& comm, std::byte* buf, std::size_t count, Dtype dtype, int root) {
  check_comm(comm, "broadcast");
  check_root(comm, "broadcast", root);
  const std::size_t bytes = count * dtype_size(dtype);
  const bool is_root = comm.rank() == root;
  Round rd(comm, {CollectiveKind::broadcast, dtype, root, count},
           is_root ? std::span<const std::byte>(buf, bytes) : std::span<const std::byte>(), buf);
  if (!is_root && bytes > 0) {
    ReadScope read(rd);
    std::memcpy(buf, rd.payload(root), bytes);
  }
  rd.finish();
  const std::size_t n = static_cast<std::size_t>(comm.size());
  count_traffic(comm, CollectiveKind::broadcast, is_root ? (n - 1) * bytes : 0,
                is_root ? 0 : bytes);
}

}  // namespace tspemu::detail
