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

std::string disagreement(const std::string& group, std::uint64_t seq, int size,
                         const Fingerprint* const* fps, bool counts_must_match) {
  bool ok = true;
  for (int r = 1; r < size; ++r) ok = ok && compatible(*fps[0], *fps[r], counts_must_match);
  if (ok) return {};
  std::ostringstream m;
  m << "collective #" << seq << " on group " << group << " disagrees:";
  for (int r = 0; r < size; ++r)
    if (r == 0 || !compatible(*fps[0], *fps[r], counts_must_match))
      m << (r ? ", " : " ") << "rank " << r << " called " << describe(*fps[r]);
  return m.str();
}

Call::Call(Comm& comm, const Fingerprint& fp, std::span<const std::byte> step0,
           bool counts_must_match, bool root_returns_early)
    : t_(transport_of(comm)) {
  RankState& self = comm.self();
  st_.comm = &comm;
  st_.rank = comm.rank();
  st_.size = comm.size();
  st_.seq = comm.next_seq();
  const std::uint64_t call_bytes = fp.count * dtype_size(fp.dtype);
  st_.op = OpRef{collective_name(fp.kind), st_.seq, &comm.group(), -1, "", call_bytes};
  op_.kind = OpInfo::Kind::collective;
  op_.what = st_.op.what;
  op_.seq = st_.seq;
  op_.group = &comm.group();
  op_.root = fp.root;
  op_.bytes = call_bytes;
  op_.collective = fp.kind;
  op_.members = st_.size;
  notify_begin(self, op_);
  try {
    // The eager broadcast root meets nobody (open_rooted); observers of the meet need every
    // member's header, so a run with any of them meets.
    const bool met = root_returns_early && self.world->on_meet.empty()
                         ? t_.open_rooted(st_, fp, call_header(self), step0)
                         : (t_.open(st_, fp, call_header(self), step0), true);
    if (!met) return;  // the transport compares the fingerprints once it meets the members
    // Every member compares every fingerprint with member 0's, so all of them reach the same
    // verdict and the same message.
    const Fingerprint* fps[kMaxRanks];
    for (int r = 0; r < st_.size; ++r) fps[r] = &fingerprint(r);
    const std::string differ = disagreement(comm.name(), st_.seq, st_.size, fps, counts_must_match);
    if (!differ.empty()) detail::raise(self, CollectiveMismatch(differ));
    notify_meet(self, op_, MemberHeaders{&t_, &st_});
  } catch (...) {
    t_.abandon(st_);
    notify_end(self, op_, false);  // no destructor runs for a throwing constructor
    throw;
  }
}

Call::~Call() {
  // A Call left by an exception: every such path raised the world's abort first; wait for reads
  // of our buffers that already started (the transport's abandon).
  if (!st_.finished) t_.abandon(st_);
  if (!ended_) notify_end(st_.comm->self(), op_, false);
}

void Call::finish() {
  t_.finish(st_);
  ended_ = true;
  notify_end(st_.comm->self(), op_, true);
}

Transport& transport_of(Comm& comm) {
  return *comm.self().world->transport;
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

void observe_begin(Comm& comm, OpInfo& op) {
  notify_begin(comm.self(), op);
}
void observe_end(Comm& comm, OpInfo& op, bool ok) {
  notify_end(comm.self(), op, ok);
}
bool injecting(const Comm& comm) {
  return comm.self().world->opts.inject.has_value();
}
std::size_t inject_below(Comm& comm, std::size_t n) {
  return comm.self().inject.below(n);
}

}  // namespace tspemu::detail
