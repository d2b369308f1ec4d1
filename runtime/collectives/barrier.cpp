#include "tspemu/runtime/barrier.hpp"

#include "arguments.hpp"

namespace tspemu {

void barrier(Comm& comm) {
  detail::check_comm(comm, "barrier");
  detail::Call call(comm, {CollectiveKind::barrier, Dtype::byte, -1, 0}, {},
                    /*counts_must_match=*/true, detail::CallForm::step0_only);
  call.finish();
  detail::count_traffic(comm, CollectiveKind::barrier, 0, 0);
}

}  // namespace tspemu
