#include "tspemu/runtime/barrier.hpp"

#include "arguments.hpp"
#include "round.hpp"

namespace tspemu {

void barrier(Comm& comm) {
  detail::check_comm(comm, "barrier");
  detail::Round rd(comm, {CollectiveKind::barrier, Dtype::byte, -1, 0}, {}, nullptr);
  rd.finish();
  detail::count_traffic(comm, CollectiveKind::barrier, 0, 0);
}

}  // namespace tspemu
