#include "call.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "../world/op_hooks.hpp"
#include "../world/wait.hpp"
#include "../world/world_state.hpp"
#include "deferred_calls.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

namespace {

// "rank 2", "ranks 1-3", "ranks 0, 2-3": the members listed, ascending.
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

// "ranks 1, 3 called X, rank 2 called Y": one class's members, those with equal descriptions
// together, in order of first member.
std::string class_calls(const std::vector<int>& members, std::span<const std::string> calls) {
  std::string s;
  std::vector<bool> listed(members.size(), false);
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (listed[i]) continue;
    std::vector<int> same;
    for (std::size_t j = i; j < members.size(); ++j)
      if (!listed[j] && calls[static_cast<std::size_t>(members[j])] ==
                            calls[static_cast<std::size_t>(members[i])]) {
        listed[j] = true;
        same.push_back(members[j]);
      }
    if (!s.empty()) s += ", ";
    s += rank_list(same) + " called " + calls[static_cast<std::size_t>(members[i])];
  }
  return s;
}

}  // namespace

std::string mismatch_message(const std::string& group, std::uint64_t seq, std::span<const int> cls,
                             std::span<const std::string> calls) {
  std::vector<std::vector<int>> classes;
  for (std::size_t r = 0; r < cls.size(); ++r) {
    const auto k = static_cast<std::size_t>(cls[r]);
    if (classes.size() <= k) classes.resize(k + 1);
    classes[k].push_back(static_cast<int>(r));
  }
  // Largest first; among equals, the one whose first member is lowest (stable sort).
  std::stable_sort(classes.begin(), classes.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::ostringstream m;
  m << "collective #" << seq << " on group " << group << ": ";
  if (classes.size() > 1 && classes[0].size() == classes[1].size()) {
    // No majority: no member can be called the deviating one.
    m << "ranks split ";
    for (std::size_t k = 0; k < classes.size(); ++k) m << (k ? "/" : "") << classes[k].size();
    m << ":";
    for (std::size_t k = 0; k < classes.size(); ++k)
      m << (k ? ", " : " ") << class_calls(classes[k], calls);
    return m.str();
  }
  // The minority classes, in order of first member, then the majority's call.
  std::sort(classes.begin() + 1, classes.end());
  for (std::size_t k = 1; k < classes.size(); ++k)
    m << (k > 1 ? ", " : "") << class_calls(classes[k], calls);
  m << " while " << class_calls(classes[0], calls);
  return m.str();
}

std::string disagreement(const std::string& group, std::uint64_t seq, int size,
                         const Fingerprint* const* fps, bool counts_must_match) {
  bool ok = true;
  for (int r = 1; r < size; ++r) ok = ok && compatible(*fps[0], *fps[r], counts_must_match);
  if (ok) return {};
  // Classes of compatible calls, numbered by first member: compatibility compares a fixed set of
  // fields for equality, so it is an equivalence.
  std::vector<int> cls(static_cast<std::size_t>(size), -1);
  std::vector<std::string> calls(static_cast<std::size_t>(size));
  int classes = 0;
  for (int r = 0; r < size; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    calls[ur] = describe(*fps[r]);
    for (int q = 0; q < r && cls[ur] < 0; ++q)
      if (compatible(*fps[q], *fps[r], counts_must_match))
        cls[ur] = cls[static_cast<std::size_t>(q)];
    if (cls[ur] < 0) cls[ur] = classes++;
  }
  return mismatch_message(group, seq, cls, calls);
}

namespace {

// Call #seq's state before its open, but for `seq` (known only after the deferred calls have run):
// built whole rather than assigned field by field, so each field is stored once (an assignment
// stores the defaults first; this runs on every call).
CallState fresh_call_state(Comm& comm, const Fingerprint& fp, bool step0_only) {
  return {.comm = &comm,
          .rank = comm.rank(),
          .size = comm.size(),
          .op = {.what = collective_name(fp.kind),
                 .group = &comm.group(),
                 .bytes = fp.count * dtype_size(fp.dtype)},
          .step0_only = step0_only};
}

// Whether something must run or be reported before a call on `comm` takes its number: a handle
// destroyed unwaited, non-blocking calls pending on the Comm, or the call being one of them. Call's
// constructor carries these duties out only under this test, and the eager broadcast's short path
// (needs_full_call) takes no call that passes it, so a duty whose condition is missing here never
// runs at all rather than being skipped by the short path alone.
bool has_pre_number_duties(const RankState& self, const Comm& comm) {
  const DeferredCalls* deferred = comm.deferred();
  return !self.unwaited.empty() ||
         (deferred != nullptr && (deferred->running() || deferred->pending()));
}

// Whether a collective call on `comm` needs Call rather than the eager broadcast's short path:
// something observes collectives (a trace, the simulated clock, injection or a listed observer:
// each hooks their begin, meet or end) or the meet; or the call has pre-number duties.
bool needs_full_call(const RankState& self, const Comm& comm) {
  const WorldShared& w = *self.world;
  return w.observed[static_cast<int>(OpInfo::Kind::collective)] != 0 || !w.on_meet.empty() ||
         has_pre_number_duties(self, comm);
}

}  // namespace

bool Call::eager_broadcast(Comm& comm, const Fingerprint& fp, std::byte* buf) {
  RankState& self = comm.self();
  if (needs_full_call(self, comm)) return false;
  // The shared-memory transport's verbs without virtual dispatch, as Call's; any other (MPI)
  // through its own.
  Transport& t = *self.world->transport;
  SharedMemoryTransport* shm = self.world->shared_memory;
  CallState st = fresh_call_state(comm, fp, /*step0_only=*/false);
  st.seq = comm.next_seq();
  st.op.seq = st.seq;
  const std::uint64_t bytes = st.op.bytes;
  const bool is_root = st.rank == fp.root;
  // The flight record and the wait's OpRef (st.op) are all a diagnosis reads: a hang or failure
  // inside names this call as the rank's pending operation, as Call's would.
  const std::uint64_t waits_at_begin = self.waits;
  note_entry(self);
  const std::uint64_t record =
      self.flight.begin(st.op.what, st.seq, &comm.group().name, -1, fp.root, bytes);
  try {
    // No observer reads the header (nobody observes the meet).
    const auto step0 =
        is_root ? std::span<const std::byte>(buf, bytes) : std::span<const std::byte>();
    if (shm != nullptr)
      shm->SharedMemoryTransport::open_rooted(st, fp, CallHeader{}, step0);
    else
      t.open_rooted(st, fp, CallHeader{}, step0);
    if (!is_root && bytes > 0) {
      if (shm != nullptr)
        shm->SharedMemoryTransport::recv(st, fp.root, 0, 0, {buf, bytes});
      else
        t.recv(st, fp.root, 0, 0, {buf, bytes});
    }
  } catch (...) {
    t.abandon(st);
    end_own_record(self, record, false, bytes, waits_at_begin);
    throw;
  }
  if (shm != nullptr)
    shm->SharedMemoryTransport::finish(st);
  else
    t.finish(st);
  end_own_record(self, record, true, bytes, waits_at_begin);
  return true;
}

Call::Call(Comm& comm, const Fingerprint& blocking_fp, std::span<const std::byte> step0,
           bool counts_must_match, CallForm form)
    : t_(transport_of(comm)),
      shm_(comm.self().world->shared_memory),
      // The sequence number and the blocking form are known only after the deferred calls below
      // have run.
      st_(fresh_call_state(comm, blocking_fp, form == CallForm::step0_only && shm_ != nullptr)),
      op_{.kind = OpInfo::Kind::collective,
          .what = st_.op.what,
          .group = &comm.group(),
          .root = blocking_fp.root,
          .bytes = st_.op.bytes,
          .collective = blocking_fp.kind,
          .members = st_.size} {
  RankState& self = comm.self();
  // Before this call takes its number: a handle destroyed unwaited is reported here, and the
  // rank's pending non-blocking calls on the Comm run first, in issue order, so every member's
  // mailbox calls follow issue order whatever order it waits in (deferred_calls.hpp). A deferred
  // call's own Call is the non-blocking form.
  bool nonblocking = false;
  if (has_pre_number_duties(self, comm)) {
    if (!self.unwaited.empty()) detail::raise(self, std::logic_error(self.unwaited));
    DeferredCalls* deferred = comm.deferred();
    nonblocking = deferred != nullptr && deferred->running();
    if (deferred != nullptr && !nonblocking && deferred->pending()) deferred->run_all(comm);
  }
  Fingerprint fp = blocking_fp;
  fp.nonblocking = nonblocking;
  st_.seq = comm.next_seq();
  st_.op.seq = st_.seq;
  op_.seq = st_.seq;
  op_.nonblocking = nonblocking;
  notify_begin(self, op_);
  try {
    // The eager broadcast root meets nobody (open_rooted); observers of the meet need every
    // member's header, so a run with any of them meets.
    bool met = true;
    if (form == CallForm::rooted_eager && self.world->on_meet.empty())
      met = shm_ != nullptr
                ? shm_->SharedMemoryTransport::open_rooted(st_, fp, call_header(self), step0)
                : t_.open_rooted(st_, fp, call_header(self), step0);
    else if (shm_ != nullptr)
      shm_->SharedMemoryTransport::open(st_, fp, call_header(self), step0);
    else
      t_.open(st_, fp, call_header(self), step0);
    if (!met) return;  // the transport compares the fingerprints once it meets the members
    // Every member compares every fingerprint with member 0's, so all of them reach the same
    // verdict and the same message (formatted only then).
    bool agree = true;
    const Fingerprint& first = fingerprint(0);
    for (int r = 1; r < st_.size; ++r)
      agree = agree && compatible(first, fingerprint(r), counts_must_match);
    if (!agree) {
      const Fingerprint* fps[kMaxRanks];
      for (int r = 0; r < st_.size; ++r) fps[r] = &fingerprint(r);
      detail::raise(self, CollectiveMismatch(disagreement(comm.name(), st_.seq, st_.size, fps,
                                                          counts_must_match)));
    }
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

bool Call::recv_all_step0(std::byte* dst, const std::size_t* offsets, std::size_t elem_size) {
  SharedMemoryTransport* m = st_.comm->self().world->mailboxes;
  return m != nullptr && m->SharedMemoryTransport::recv_all_step0(st_, dst, offsets, elem_size);
}

void Call::finish() {
  if (shm_ != nullptr)
    shm_->SharedMemoryTransport::finish(st_);
  else
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

void fail_world(Comm& comm, const std::string& message, const std::exception_ptr& error) {
  RankState& self = comm.self();
  self.world->fail(self.rank, message, error);
}

void wait_for(Comm& comm, const OpRef& op, const std::function<bool()>& ready) {
  wait_until(comm.self(), -1, op, ready);
}

SimStreams::Transfer issue_on_comm_stream(Comm& comm, CollectiveKind kind, std::uint64_t bytes) {
  RankState& self = comm.self();
  const SimClockModel* sim = sim_model(self);
  if (sim == nullptr) return {};
  return self.sim.issue(sim_ns_of(sim->collective_seconds(
      kind, bytes, comm.size(), sim->spans_nodes(comm.group().world_ranks))));
}

void wait_on_comm_stream(Comm& comm, const SimStreams::Transfer& transfer) {
  RankState& self = comm.self();
  if (sim_model(self) != nullptr) self.sim.wait(transfer);
}

void report_unwaited(Comm& comm, const std::string& message) {
  RankState& self = comm.self();
  if (self.unwaited.empty()) self.unwaited = message;
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
