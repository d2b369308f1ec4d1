#include "tspemu/runtime/nonblocking.hpp"

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "../collectives/arguments.hpp"
#include "../transport/deferred_calls.hpp"
#include "../transport/early_exposure.hpp"
#include "tspemu/runtime/all_gather.hpp"
#include "tspemu/runtime/all_reduce.hpp"
#include "tspemu/runtime/broadcast.hpp"
#include "tspemu/runtime/reduce.hpp"
#include "tspemu/runtime/reduce_scatter.hpp"

namespace tspemu {

namespace {

const char* nonblocking_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::broadcast:
      return "ibroadcast";
    case CollectiveKind::all_gather:
      return "iall_gather";
    case CollectiveKind::reduce_scatter:
      return "ireduce_scatter";
    case CollectiveKind::all_reduce:
      return "iall_reduce";
    case CollectiveKind::reduce:
      return "ireduce";
    default:
      break;
  }
  throw std::logic_error("no non-blocking form of " + std::string(collective_name(kind)));
}

}  // namespace

namespace detail {

CollectiveHandle issue_collective(Comm& comm, CollectiveKind kind, Dtype dtype, int root,
                                  const std::byte* send, std::size_t send_count, std::byte* recv,
                                  std::size_t recv_count) {
  const char* what = nonblocking_name(kind);
  check_comm(comm, what);
  const std::size_t es = dtype_size(dtype);
  // The count of the blocking call's fingerprint: the cost model's convention (sim_clock.hpp).
  const std::size_t count =
      kind == CollectiveKind::broadcast || kind == CollectiveKind::reduce_scatter ? recv_count
                                                                                  : send_count;
  DeferredCalls& deferred = comm.make_deferred();
  // Every pending call runs, and takes its number, before any later call on the Comm.
  const std::uint64_t seq = comm.seq() + deferred.pending_count() + 1;
  DeferredCall call;
  call.what = what;
  call.seq = seq;
  call.buffers[0] = {send, send_count * es};
  call.buffers[1] = {recv, recv_count * es};
  // all_gather with valid arguments (else the blocking algorithm reports them when it runs):
  // published to the members at issue (early_exposure.hpp), its receive blocks checked there.
  const std::size_t block_bytes = send_count * es;
  if (kind == CollectiveKind::all_gather &&
      recv_count == static_cast<std::size_t>(comm.size()) * send_count &&
      (send == recv + static_cast<std::size_t>(comm.rank()) * block_bytes ||
       !overlaps(send, block_bytes, recv, recv_count * es)) &&
      exposable(comm, send, recv, block_bytes)) {
    call.exposure = std::make_shared<EarlyExposure>(
        comm, seq, Fingerprint(kind, dtype, -1, send_count, /*nb=*/true), send, recv, block_bytes);
    call.buffers[1] = {};
  }
  std::shared_ptr<EarlyExposure> exposure = call.exposure;
  call.run = [=](Comm& c) {
    // The blocking algorithm; its Call is marked non-blocking (DeferredCalls::running).
    switch (kind) {
      case CollectiveKind::broadcast:
        return broadcast(c, recv, recv_count, dtype, root);
      case CollectiveKind::all_gather:
        // The blocks this rank's members filled before it ran, and those it copies from members
        // still computing, are skipped by the algorithm.
        return all_gather(c, send, send_count, recv, recv_count, dtype, false,
                          exposure ? exposure->fill_from_peers() : 0);
      case CollectiveKind::reduce_scatter:
        return reduce_scatter(c, send, send_count, recv, recv_count, dtype);
      case CollectiveKind::all_reduce:
        return all_reduce(c, send, send_count, recv, recv_count, dtype);
      case CollectiveKind::reduce:
        return reduce(c, send, send_count, recv, recv_count, dtype, root);
      default:
        return;
    }
  };
  CollectiveHandle h;
  h.seq_ = call.seq;
  h.kind_ = kind;
  h.id_ = deferred.add(comm, std::move(call));
  h.comm_ = &comm;
  h.transfer_ = issue_on_comm_stream(comm, kind, count * es);
  return h;
}

}  // namespace detail

CollectiveHandle& CollectiveHandle::operator=(CollectiveHandle&& o) noexcept {
  if (this != &o) {
    abandon();
    comm_ = std::exchange(o.comm_, nullptr);
    id_ = o.id_;
    seq_ = o.seq_;
    kind_ = o.kind_;
    transfer_ = o.transfer_;
  }
  return *this;
}

CollectiveHandle::~CollectiveHandle() {
  abandon();
}

void CollectiveHandle::abandon() noexcept {
  if (comm_ == nullptr) return;
  Comm& comm = *std::exchange(comm_, nullptr);
  comm.deferred()->drop(id_);
  // Unwinding: the exception in flight is the run's failure; the members waiting for this
  // operation fail with PeerFailure once it aborts the world.
  if (std::uncaught_exceptions() > 0) return;
  try {
    detail::report_unwaited(
        comm, "rank " + std::to_string(comm.world_rank(comm.rank())) + ": " +
                  nonblocking_name(kind_) + " #" + std::to_string(seq_) + " on group " +
                  comm.name() +
                  ": its handle was destroyed without wait() (a non-blocking collective must be "
                  "waited; the operation was dropped)");
  } catch (...) {
    // Out of memory formatting the message: the members still fail, at the hang timeout.
  }
}

void CollectiveHandle::wait() {
  if (comm_ == nullptr) return;
  Comm& comm = *std::exchange(comm_, nullptr);
  comm.deferred()->run_through(comm, id_);
  detail::wait_on_comm_stream(comm, transfer_);
}

bool CollectiveHandle::done() const {
  return comm_ == nullptr || comm_->deferred()->done(id_);
}

}  // namespace tspemu
