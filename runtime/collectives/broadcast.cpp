#include "tspemu/runtime/broadcast.hpp"

#include "arguments.hpp"

namespace tspemu::detail {

void broadcast(Comm& comm, std::byte* buf, std::size_t count, Dtype dtype, int root) {
  check_comm(comm, "broadcast");
  check_root(comm, "broadcast", root);
  const std::size_t bytes = count * dtype_size(dtype);
  const bool is_root = comm.rank() == root;
  const Fingerprint fp{CollectiveKind::broadcast, dtype, root, count};
  // The root posts its buffer once; every other member reads it. A small payload travels in the
  // mailbox, so the root need not wait for the readers (Transport::open_rooted); unobserved, it
  // takes the short path.
  const bool eager = bytes <= kSmallMessageBytes;
  if (!eager || !Call::eager_broadcast(comm, fp, buf)) {
    Call call(comm, fp,
              is_root ? std::span<const std::byte>(buf, bytes) : std::span<const std::byte>(),
              /*counts_must_match=*/true, eager ? CallForm::rooted_eager : CallForm::general);
    if (!is_root && bytes > 0) call.recv(root, 0, 0, {buf, bytes});
    call.finish();
  }
  const std::size_t n = static_cast<std::size_t>(comm.size());
  count_traffic(comm, CollectiveKind::broadcast, is_root ? (n - 1) * bytes : 0,
                is_root ? 0 : bytes);
}

}  // namespace tspemu::detail
