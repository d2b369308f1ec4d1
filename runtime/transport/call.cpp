#include "call.hpp"

#include <algorithm>
#include <sstream>

#include "../state.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

namespace {

bool compatible(const Fingerprint& a, const Fingerprint& b, bool counts_must_match) {
  return a.kind == b.kind && a.dtype == b.dtype && a.root == b.root &&
         (!counts_must_match || a.count == b.count);
}

}  // namespace

Call::Call(Comm& comm, const Fingerprint& fp, std::span<const std::byte> step0,
           bool counts_must_match)
    : t_(transport_of(comm)) {
  RankState& self = comm.self();
  st_.comm = &comm;
  st_.rank = comm.rank();
  st_.size = comm.size();
  st_.seq = comm.next_seq();
  inject_delay(self);
  const std::uint64_t call_bytes = fp.count * dtype_size(fp.dtype);
  st_.op = OpRef{collective_name(fp.kind), st_.seq, &comm.group(), -1, "", call_bytes};
  record_ = detail::record_begin(self, st_.op.what, st_.seq, comm.group(), -1, fp.root, call_bytes);
  root_ = fp.root;
  if (self.trace) trace_begin_ns_ = self.world->now_ns();
  try {
    t_.open(st_, fp, CallHeader{self.sim_ns}, step0);
    // Every member compares every fingerprint with member 0's, so all of them reach the same
    // verdict and the same message.
    const Fingerprint& ref = fingerprint(0);
    bool ok = true;
    for (int r = 1; r < st_.size; ++r)
      ok = ok && compatible(ref, fingerprint(r), counts_must_match);
    if (!ok) {
      std::ostringstream m;
      m << "collective #" << st_.seq << " on group " << comm.name() << " disagrees:";
      for (int r = 0; r < st_.size; ++r)
        if (r == 0 || !compatible(ref, fingerprint(r), counts_must_match))
          m << (r ? ", " : " ") << "rank " << r << " called " << describe(fingerprint(r));
      detail::raise(self, CollectiveMismatch(m.str()));
    }
    if (const SimClockModel* sim = detail::sim_model(self)) {
      // The call starts on the simulated clock when its last member arrives; every member computes
      // the same start and end from the same published clocks.
      std::int64_t start = 0;
      for (int r = 0; r < st_.size; ++r) start = std::max(start, t_.header(st_, r).sim_ns);
      sim_begin_ns_ = start;
      sim_end_ns_ =
          start + detail::sim_ns_of(sim->collective_seconds(fp.kind, call_bytes, st_.size));
      self.sim_ns = sim_end_ns_;
    }
  } catch (...) {
    t_.abandon(st_);
    detail::record_end(self, record_, false);  // no destructor runs for a throwing constructor
    throw;
  }
}

Call::~Call() {
  // A Call left by an exception: every such path raised the world's abort first; wait for reads
  // of our buffers that already started (the transport's abandon).
  if (!st_.finished) t_.abandon(st_);
  if (!recorded_end_) detail::record_end(st_.comm->self(), record_, false);
}

void Call::finish() {
  t_.finish(st_);
  RankState& self = st_.comm->self();
  recorded_end_ = true;
  detail::record_end(self, record_, true);
  if (self.trace)
    self.trace->record(TraceEvent{
        TraceEvent::Type::collective, st_.op.what, st_.seq, st_.comm->group().id, -1, root_,
        st_.op.bytes, 0, 0, trace_begin_ns_, self.world->now_ns(), sim_begin_ns_, sim_end_ns_});
}

Transport& transport_of(Comm& comm) {
  return *comm.self().world->transport;
}

std::uint64_t group_id(const Comm& comm) {
  return comm.group().id;
}

void count_traffic(Comm& comm, CollectiveKind kind, std::size_t sent, std::size_t received) {
  auto& e = comm.self().counters[kind];
  e.calls++;
  e.bytes_sent += sent;
  e.bytes_received += received;
}

void fail_world(Comm& comm, const std::string& message, std::exception_ptr error) {
  RankState& self = comm.self();
  self.world->fail(self.rank, message, std::move(error));
}

void wait_for(Comm& comm, const OpRef& op, const std::function<bool()>& ready) {
  wait_until(comm.self(), -1, op, ready);
}

void inject_delay(Comm& comm) {
  detail::inject_delay(comm.self());
}
bool injecting(const Comm& comm) {
  return comm.self().world->opts.inject.has_value();
}
std::size_t inject_below(Comm& comm, std::size_t n) {
  return comm.self().inject.below(n);
}
std::uint64_t record_begin(Comm& comm, const char* what, std::uint64_t seq, int peer,
                           std::uint64_t bytes) {
  return detail::record_begin(comm.self(), what, seq, comm.group(), peer, -1, bytes);
}
void record_end(Comm& comm, std::uint64_t id, bool ok) {
  detail::record_end(comm.self(), id, ok);
}
bool tracing(const Comm& comm) {
  return comm.self().trace != nullptr;
}
std::int64_t now_ns(const Comm& comm) {
  return comm.self().world->now_ns();
}
std::uint64_t next_flow(Comm& comm) {
  return comm.self().trace->next_flow(comm.self().rank);
}
void trace_record(Comm& comm, const TraceEvent& event) {
  comm.self().trace->record(event);
}
const SimClockModel* sim_model(const Comm& comm) {
  return detail::sim_model(comm.self());
}
std::int64_t& sim_clock(Comm& comm) {
  return comm.self().sim_ns;
}

}  // namespace tspemu::detail
