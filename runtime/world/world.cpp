#include "tspemu/runtime/world.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "../transport/dry.hpp"
#include "../transport/early_exposure.hpp"
#include "op_hooks.hpp"
#include "wait.hpp"
#include "world_state.hpp"
#if TSPEMU_HAVE_MPI
#include "../transport/mpi.hpp"
#endif
#include "tspemu/core/dry_run.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu {
namespace detail {

// Operations per rank printed in RankFailure::what(); the full recorder is in flight_record().
inline constexpr std::size_t kFlightRecordsInMessage = 6;

std::string describe(const Fingerprint& fp) {
  // A split's call carries its (color, key) pair as two int64: an encoding, not the user's call.
  if (fp.kind == CollectiveKind::split) return "split";
  std::ostringstream s;
  s << (fp.nonblocking ? "i" : "") << collective_name(fp.kind) << "(count=" << fp.count << ", "
    << dtype_name(fp.dtype);
  if (fp.root >= 0) s << ", root=" << fp.root;
  s << ")";
  return s.str();
}

std::string describe(const OpRef& op) {
  std::ostringstream s;
  s << op.what << " #" << op.seq;
  if (op.bytes > 0) s << " (" << format_bytes(op.bytes) << ")";
  if (op.peer_group_rank >= 0) s << " with rank " << op.peer_group_rank;
  if (op.group != nullptr) s << " on group " << op.group->name;
  if (op.stage != nullptr && op.stage[0] != '\0') s << " (awaiting " << op.stage << ")";
  return s.str();
}

void run_begin_hooks(RankState& self, OpInfo& op) {
  for (Observer* o : self.world->on_begin) o->on_begin(self, op);
}
void run_end_hooks(RankState& self, OpInfo& op, bool ok) {
  for (Observer* o : self.world->on_end) o->on_end(self, op, ok);
}

CallHeader call_header(const RankState& self) {
  return CallHeader{self.sim.now_ns()};
}

void WorldShared::select_observers() {
  on_begin.clear();
  on_meet.clear();
  on_end.clear();
  on_wait.clear();
  std::fill(std::begin(observed), std::end(observed), std::uint8_t{0});
  for (const auto& o : observers) {
    const unsigned h = o->hooks(opts);
    if (h & kHookBegin) on_begin.push_back(o.get());
    if (h & kHookMeet) on_meet.push_back(o.get());
    if (h & kHookEnd) on_end.push_back(o.get());
    if (h & kHookWait) on_wait.push_back(o.get());
    for (const ObserverHook hook : {kHookBegin, kHookMeet, kHookEnd}) {
      if ((h & hook) == 0) continue;
      const unsigned kinds = o->kinds(hook);
      for (int k = 0; k < OpInfo::kKinds; ++k)
        if (kinds & (1u << k)) observed[k] = static_cast<std::uint8_t>(observed[k] | hook);
    }
  }
}

WaitScope::WaitScope(RankState& self, const OpRef& op, int waits_for) : self_(self) {
  for (Observer* o : self.world->on_wait) o->on_wait_begin(self, op, waits_for);
}
WaitScope::~WaitScope() {
  for (Observer* o : self_.world->on_wait) o->on_wait_end(self_);
}

Group::Group(WorldShared* w, std::uint64_t group_id, std::string group_name, std::vector<int> ranks)
    : world(w),
      id(group_id),
      name(std::move(group_name)),
      world_ranks(std::move(ranks)),
      slots(new Slot[world_ranks.size()]),
      channels(new std::atomic<Channel*>[world_ranks.size() * world_ranks.size()]),
      exposures(new MemberExposures[world_ranks.size()]) {
  for (std::size_t i = 0; i < world_ranks.size() * world_ranks.size(); ++i)
    channels[i].store(nullptr, std::memory_order_relaxed);
  for (int r : world_ranks) {
    parkers.push_back(&w->ranks[static_cast<std::size_t>(r)]->parker);
    if (!w->hosts(r)) other_processes.push_back(w->process_of(r));
  }
  std::sort(other_processes.begin(), other_processes.end());
  other_processes.erase(std::unique(other_processes.begin(), other_processes.end()),
                        other_processes.end());
}

Group::~Group() {
  for (std::size_t i = 0; i < world_ranks.size() * world_ranks.size(); ++i)
    delete channels[i].load(std::memory_order_relaxed);
}

Channel& Group::make_channel(int src, int dst) {
  auto& cell =
      channels[static_cast<std::size_t>(src) * world_ranks.size() + static_cast<std::size_t>(dst)];
  Channel* c = cell.load(std::memory_order_acquire);
  if (c != nullptr) return *c;
  auto* fresh = new Channel();
  if (cell.compare_exchange_strong(c, fresh, std::memory_order_acq_rel, std::memory_order_acquire))
    return *fresh;
  delete fresh;  // another end installed it first; `c` now holds theirs
  return *c;
}

void Group::reset() {
  for (std::size_t i = 0; i < world_ranks.size(); ++i) {
    slots[i].progress.store(0, std::memory_order_relaxed);
    slots[i].unmet_first = 0;
    slots[i].unmet_last = 0;
    slots[i].unawaited = 0;
    slots[i].seen_member = -1;
    slots[i].seen_progress = 0;
    // relaxed, as progress above: the workers are idle, and World::run's generation bump (release)
    // publishes these stores to the next run's ranks.
    for (Descriptor& d : slots[i].desc) d.stamp.store(0, std::memory_order_relaxed);
    exposures[i].reset();
  }
  for (std::size_t i = 0; i < world_ranks.size() * world_ranks.size(); ++i)
    delete channels[i].exchange(nullptr, std::memory_order_relaxed);
}

namespace {

// Nanoseconds of one cpu_relax() step, measured once per process (best of a few short runs, so a
// preemption during one run does not inflate it). The x86 pause instruction costs an order of
// magnitude more on some CPUs than on others (docs/benchmarks.md), so spin budgets are set in
// time, not in steps.
double relax_ns() {
  static const double ns = [] {
    double best = 1e9;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 1000; ++i) cpu_relax();
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / 1000);
    }
    return std::max(best, 0.5);
  }();
  return ns;
}

}  // namespace

std::unique_ptr<Transport> make_transport(WorldShared& w) {
  if (w.opts.mpi) {
#if TSPEMU_HAVE_MPI
    if (w.opts.dry_run)
      throw std::invalid_argument(
          "World: dry_run and mpi together are not supported (a dry run "
          "plans in one process)");
    auto t = std::make_unique<MpiTransport>(w);
    w.link = t.get();
    return t;
#else
    throw std::invalid_argument(
        "World: mpi = true, but this tspemu was built without MPI "
        "(configure with -DTSPEMU_MPI=ON and OpenMPI installed)");
#endif
  }
  std::unique_ptr<SharedMemoryTransport> t;
  if (w.opts.dry_run)
    t = std::make_unique<DryTransport>();
  else
    t = std::make_unique<SharedMemoryTransport>();
  w.shared_memory = t.get();
  return t;
}

WorldShared::WorldShared(const WorldOptions& o) : opts(o), local_ranks(o.ranks) {
  transport = make_transport(*this);
  mailboxes = dynamic_cast<SharedMemoryTransport*>(transport.get());
  observers.push_back(make_injection_observer());
  observers.push_back(make_sim_clock_observer());
  observers.push_back(make_trace_observer());
  observers.push_back(make_pending_wait_observer());
  for (auto* hook : {&on_begin, &on_meet, &on_end, &on_wait}) hook->reserve(observers.size());
  select_observers();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Spinning only pays while the peer we wait for is running on another core. Oversubscribed,
  // the peer needs our core: yield almost at once.
  //
  // Otherwise spin ~2 us: several times the cache-line hand-offs of small collectives between
  // ranks on different cores, short enough that a rank whose peer was descheduled (other
  // processes on the machine, or the scheduler putting both ranks on one core) gives its core up
  // quickly; a long spin there makes every hand-off cost the whole spin (bench/runtime_bench).
  // Then yield, cheap when nothing else wants the core, for up to ~250 us (400 yields; a few
  // futex park/wake round trips on a VM, where a parked vCPU halts), so waits for a peer's copy
  // of a few MiB do not pay a wake-up. The figures: docs/benchmarks.md. A yield that lost
  // the core to another process ends the phase at once (long_yield).
  // wait_until also bounds the yield phase in time (kMaxYieldPhase), so it then parks and polls
  // the abort flag even if each yield hands the core to another process for a long slice.
  //
  // Policy choices measured with bench/runtime_bench, see bench/report_runtime.py.
  const bool oversubscribed = opts.ranks > cores;
  spin_iterations =
      oversubscribed ? 8 : static_cast<int>(std::clamp(2000.0 / relax_ns(), 16.0, 4000.0));
  stamp_spin_iterations = oversubscribed ? 0 : spin_iterations;
  yield_iterations = oversubscribed ? 200 : 400;
  // Oversubscribed, yields hand the core to other ranks, which is the point; otherwise a yield
  // that took over 20 us (far longer than a yield to an idle core) lost the core to another
  // process.
  long_yield = oversubscribed ? std::chrono::nanoseconds::max() : std::chrono::microseconds(20);
}

void WorldShared::fail(int rank, const std::string& message, const std::exception_ptr& error,
                       bool from_other_process) {
  bool first = false;
  {
    std::lock_guard lock(failure_mu);
    if (failed_rank < 0) {
      first = true;
      failed_rank = rank;
      failure_message = message;
      failure = error;
    }
  }
  if (first && link != nullptr && !from_other_process) link->local_failure(rank, message, error);
  // seq_cst: pairs with the seq_cst loads in check_abort/begin_read (see RankState::reading).
  aborted.store(true, std::memory_order_seq_cst);
  for (auto& r : ranks) r->parker.unpark();
}

std::string WorldShared::first_failure() {
  std::lock_guard lock(failure_mu);
  return "rank " + std::to_string(failed_rank) + " failed first: " + failure_message;
}

void check_abort(RankState& self, const OpRef& op) {
  // seq_cst: pairs with the store in WorldShared::fail.
  if (self.world->aborted.load(std::memory_order_seq_cst))
    throw PeerFailure("rank " + std::to_string(self.rank) + " stopped in " + describe(op) + ": " +
                      self.world->first_failure());
}

void throw_departed(RankState& self, int peer, const OpRef& op) {
  raise(self, HangError("rank " + std::to_string(self.rank) + " waits in " + describe(op) +
                        " for world rank " + std::to_string(peer) +
                        ", which already returned from its run function\n" +
                        describe_pending(*self.world, self.world->now_ns())));
}

void report_hang_now(const std::string& diagnosis) {
  std::fprintf(stderr, "tspemu: %s\n", diagnosis.c_str());
  std::fflush(stderr);
}

void throw_hang(RankState& self, int peer, const OpRef& op,
                std::chrono::steady_clock::duration waited) {
  const double s = std::chrono::duration<double>(waited).count();
  std::ostringstream m;
  m << "rank " << self.rank << " made no progress for " << s << " s in " << describe(op);
  if (peer >= 0) m << ", waiting for world rank " << peer;
  m << "\n" << describe_pending(*self.world, self.world->now_ns());
  const std::string cycle = describe_wait_cycle(*self.world);
  if (!cycle.empty()) m << "\n" << cycle;
  report_hang_now(m.str());
  raise(self, HangError(m.str()));
}

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

// The world whose run function this thread is running (null outside a run): World::run from
// inside it would wait for this very thread.
thread_local const WorldShared* running_world = nullptr;

// The first message of the run that was sent and never received: its sender's world rank and an
// error naming both ends, or {-1, ""} (every message of every group of the run was consumed).
// Called after every rank has stopped.
std::pair<int, std::string> unreceived_message(WorldShared& w) {
  std::vector<Group*> groups{w.world_group.get()};
  for (const auto& g : w.run_groups) groups.push_back(g.get());
  for (Group* g : groups) {
    const std::size_t n = g->world_ranks.size();
    for (std::size_t src = 0; src < n; ++src)
      for (std::size_t dst = 0; dst < n; ++dst) {
        // acquire: pairs with the installing CAS (Group::channel); the ranks have stopped.
        const Channel* c = g->channels[src * n + dst].load(std::memory_order_acquire);
        if (c == nullptr) continue;
        // acquire: pairs with the sender's and receiver's seq_cst stores of the counters.
        const std::uint64_t posted = c->posted.load(std::memory_order_acquire);
        for (std::uint64_t m = c->consumed.load(std::memory_order_acquire); m < posted; ++m) {
          const P2PMessage& msg = c->ring[m % kChannelDepth];
          // acquire: pairs with the receiver's seq_cst store of kConsumed.
          if (msg.state.load(std::memory_order_acquire) == kConsumed) continue;
          std::ostringstream s;
          s << "rank " << g->world_ranks[src] << " sent message #" << m + 1 << " ("
            << format_bytes(msg.bytes) << ") to rank " << g->world_ranks[dst] << " on group "
            << g->name << ", which rank " << g->world_ranks[dst]
            << " never received before the run ended";
          return {g->world_ranks[src], s.str()};
        }
      }
  }
  return {-1, ""};
}

// Claims this rank's departure from its run function (RankState::departure): false when a waiter
// has given it up (stuck_rank_poll), so World::run no longer waits for it.
bool claim_departure(RankState& st) {
  int expected = RankState::kInRun;
  // acq_rel: see RankState::departure.
  return st.departure.compare_exchange_strong(expected, RankState::kReturned,
                                              std::memory_order_acq_rel, std::memory_order_acquire);
}

// Runs the rank's function for one run. Returns false when the rank was given up on while in it
// (stuck_rank_timeout): World::run has then counted it out, and the run's state is no longer its.
bool run_rank(WorldShared& w, int id) {
  RankState& st = *w.ranks[static_cast<std::size_t>(id)];
  running_world = &w;
  bool claimed = false;
  bool given_up = false;
  try {
    Rank rank(id, w.opts.ranks, Comm(w.world_group, id, &st), &st.arena, &st.counters);
    // Kernels' ComputeSpans (core/compute_span.hpp) reach this rank's trace and simulated clock.
    const bool observed = st.trace != nullptr || w.opts.sim_clock.has_value();
    ScopedComputeObserver observer(observed ? &st.compute : nullptr);
    ScopedComputeCounter counter(&st.computes_begun);
    ScopedDryRun dry(w.opts.dry_run);
    (*w.fn)(rank);
    claimed = true;
    given_up = !claim_departure(st);
    if (!given_up) {
      // A handle destroyed unwaited whose rank made no collective since (nonblocking.hpp).
      if (!st.unwaited.empty()) throw std::logic_error(st.unwaited);
      // Meets the members of this rank's last eager broadcasts (transport.hpp: open_rooted).
      w.transport->settle(st);
    }
  } catch (...) {
    if (!claimed) given_up = !claim_departure(st);
    if (!given_up) {
      auto e = std::current_exception();
      w.fail(id, what_of(e), e);
    }
  }
  running_world = nullptr;
  if (given_up) {
    // acq_rel: the release half publishes this rank's last writes to World::run and ~World
    // (their acquire loads of `stranded`).
    if (w.stranded.fetch_sub(1, std::memory_order_acq_rel) == 1) w.stranded.notify_all();
    return false;
  }
  // release: pairs with the acquire load in wait_until; everything this rank published is visible
  // to a waiter that sees it gone.
  st.exited.store(true, std::memory_order_release);
  for (auto& r : w.ranks) r->parker.unpark();
  return true;
}

// `shared` is the thread's own copy (std::thread keeps its arguments until the function returns),
// so the thread holds the world's state: a world destroyed while one of its ranks is stuck leaves
// the state to its threads, the last of which frees it (~World).
void worker(const std::shared_ptr<WorldShared>& shared, int id) {
  WorldShared& w = *shared;
  if (w.opts.pin_threads) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<unsigned>(id) % cores, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  std::uint32_t seen = 0;
  for (;;) {
    // acquire: pairs with the release bump in World::run / ~World.
    w.generation.wait(seen, std::memory_order_acquire);
    const std::uint32_t g = w.generation.load(std::memory_order_acquire);
    if (g == seen) continue;
    seen = g;
    if (w.stopping) return;
    // Given up on: stuck_rank_poll gave its share of `running` back for it.
    if (!run_rank(w, id)) continue;
    // acq_rel: publishes this rank's results to the caller of run (acquire load there).
    if (w.running.fetch_sub(1, std::memory_order_acq_rel) == 1) w.running.notify_all();
  }
}

}  // namespace
}  // namespace detail

const char* wake_handshake() {
  return detail::WakeFences::decide() ? "membarrier" : "seq_cst";
}

World::World(WorldOptions opts) {
  if (opts.ranks < 1 || opts.ranks > kMaxRanks)
    throw std::invalid_argument("World: ranks=" + std::to_string(opts.ranks) + " must be in [1, " +
                                std::to_string(kMaxRanks) + "]");
  if (opts.hang_timeout.count() <= 0)
    throw std::invalid_argument("World: hang_timeout must be positive");
  if (opts.watchdog_timeout.count() < 0)
    throw std::invalid_argument("World: watchdog_timeout must be positive, or 0 to disable it");
  if (opts.stuck_rank_timeout.count() < 0)
    throw std::invalid_argument("World: stuck_rank_timeout must be positive, or 0 to disable it");
  if (opts.sim_clock) opts.sim_clock->validate(opts.ranks);
  if (opts.inject) opts.inject->validate(opts.hang_timeout);
  shared_ = std::make_shared<detail::WorldShared>(opts);
  auto& w = *shared_;
  std::vector<int> all(static_cast<std::size_t>(opts.ranks));
  for (int i = 0; i < opts.ranks; ++i) {
    all[static_cast<std::size_t>(i)] = i;
    w.ranks.push_back(std::make_unique<detail::RankState>(
        &w, i, opts.arena_capacity, opts.flight_recorder_depth, w.clock, opts.ranks, opts.dry_run));
  }
  w.world_group = std::make_shared<detail::Group>(&w, 0, "world", all);
  if (w.link != nullptr) w.link->add_group(*w.world_group);
  if (opts.trace) {
    w.group_names[0] = "world";
    // A rank hosted by another process has a buffer too: its events are copied into it at the
    // end of each run (transport/mpi.hpp), so Trace shows every rank in every process.
    for (int i = 0; i < opts.ranks; ++i) {
      auto& r = w.ranks[static_cast<std::size_t>(i)];
      r->trace = std::make_unique<RankTrace>(opts.trace_capacity, w.clock);
      if (w.hosts(i)) r->arena.set_trace(r->trace.get());
    }
  }
  for (int i = w.first_local; i < w.first_local + w.local_ranks; ++i)
    w.threads.emplace_back(detail::worker, shared_, i);
}

World::~World() {
  auto& w = *shared_;
  w.stopping = true;
  w.generation.fetch_add(1, std::memory_order_release);
  w.generation.notify_all();
  // acquire: pairs with a given-up rank's decrement when it returns (run_rank).
  if (w.stranded.load(std::memory_order_acquire) == 0) {
    for (auto& t : w.threads) t.join();
    return;
  }
  // A rank given up on (stuck_rank_timeout) is still in its run function, which nothing can
  // interrupt: waiting for it could take forever. Every worker holds the state (worker()), so the
  // last one to stop (the stuck rank, once it returns) frees it.
  for (auto& t : w.threads) t.detach();
}

bool World::hosts(int rank) const {
  return shared_->hosts(rank);
}
int World::size() const {
  return shared_->opts.ranks;
}
const WorldOptions& World::options() const {
  return shared_->opts;
}
Arena& World::arena(int rank) {
  return shared_->ranks.at(static_cast<std::size_t>(rank))->arena;
}
const TrafficCounters& World::counters(int rank) const {
  return shared_->ranks.at(static_cast<std::size_t>(rank))->counters;
}
Trace World::trace() const {
  return Trace(shared_.get());
}
void World::set_injection(std::optional<Injection> inject) {
  if (inject) inject->validate(shared_->opts.hang_timeout);
  // Workers are idle between runs; the next run's generation bump publishes the change.
  shared_->opts.inject = inject;
}
double World::simulated_seconds(int rank) const {
  return static_cast<double>(shared_->ranks.at(static_cast<std::size_t>(rank))->sim.now_ns()) *
         1e-9;
}
World::SimulatedTime World::simulated_time(int rank) const {
  const SimStreams& s = shared_->ranks.at(static_cast<std::size_t>(rank))->sim;
  return {static_cast<double>(s.compute_ns()) * 1e-9,
          static_cast<double>(s.exposed_comm_ns()) * 1e-9,
          static_cast<double>(s.overlapped_comm_ns()) * 1e-9};
}
void World::clear_counters() {
  for (auto& r : shared_->ranks) r->counters.clear();
}

void World::run(const std::function<void(Rank&)>& fn) {
  auto& w = *shared_;
  if (detail::running_world == &w)
    throw std::invalid_argument(
        "World::run called from inside a run function of the same world: it would wait for the "
        "calling rank itself; run the nested work in the run function directly, or in another "
        "World");
  // A rank given up on in the last run may still be in its run function, using its state and the
  // run's groups: wait for it before resetting them. acquire: pairs with its decrement.
  for (int s = w.stranded.load(std::memory_order_acquire); s != 0;
       s = w.stranded.load(std::memory_order_acquire))
    w.stranded.wait(s, std::memory_order_acquire);
  // Workers are idle here: plain writes are published by the generation bump below.
  w.aborted.store(false, std::memory_order_relaxed);
  w.failed_rank = -1;
  w.failure_message.clear();
  w.failure = nullptr;
  w.world_group->reset();
  // Entries of a failed run whose members never all looked them up (see split_groups).
  w.split_groups.clear();
  w.run_groups.clear();
  // Injection may have changed since the last run (set_injection).
  w.select_observers();
  // A run starts together on the simulated clock: at the latest rank's time.
  std::int64_t sim_start = 0;
  for (auto& r : w.ranks) sim_start = std::max(sim_start, r->sim.now_ns());
  for (auto& r : w.ranks) {
    r->sim.start_at(sim_start);
    if (w.opts.inject) r->inject.reset(w.opts.inject->seed, r->rank);
    r->flight.clear();
    r->scan_valid = false;
    r->unmet_calls = 0;
    r->unwaited.clear();
    r->exited.store(false, std::memory_order_relaxed);
    r->departure.store(detail::RankState::kInRun, std::memory_order_relaxed);
    r->reading.store(false, std::memory_order_relaxed);
    r->arena.reset_peaks();
  }
  if (w.link != nullptr) w.link->start_run(w.generation.load(std::memory_order_relaxed) + 1);
  if (w.opts.stuck_rank_timeout.count() > 0) {
    w.fn_copy = fn;  // see WorldShared::fn_copy
    w.fn = &w.fn_copy;
  } else {
    w.fn = &fn;
  }
  w.running.store(w.local_ranks, std::memory_order_relaxed);
  w.generation.fetch_add(1, std::memory_order_release);
  w.generation.notify_all();
  for (int left = w.running.load(std::memory_order_acquire); left != 0;
       left = w.running.load(std::memory_order_acquire))
    w.running.wait(left, std::memory_order_acquire);
  // w.fn stays: a rank given up on read it without any ordering with this thread; the next run
  // replaces it after waiting for that rank.
  bool failed = false;
  {
    // Under the lock: another process's failure may be recorded by the MPI progress thread.
    std::lock_guard lock(w.failure_mu);
    failed = w.failed_rank >= 0;
  }
  if (!failed) {
    // An eager message (copied at send, so its sender never waits) that nobody received is a
    // schedule bug as much as a blocked large one: reported, not left in the mailbox. Checked
    // before end_run, so that across processes every process ends the run with it (a message
    // to another process is checked by the receiving process's end_run).
    if (const auto [sender, lost] = detail::unreceived_message(w); sender >= 0) {
      const CollectiveMismatch error("unreceived message: " + lost);
      w.fail(sender, error.what(), std::make_exception_ptr(error));
    }
  }
  if (w.link != nullptr) w.link->end_run();
  if (w.failure) {
    // Every rank has stopped (the acquire loads of `running` above publish their recorders).
    const std::int64_t now = w.now_ns();
    std::string recent =
        "last operations of each rank (oldest first; all of them in flight_record()):";
    std::string all = "flight recorder (last operations of each rank, oldest first):";
    for (std::size_t i = 0; i < w.ranks.size(); ++i) {
      if (!w.hosts(static_cast<int>(i))) continue;  // recorded by its own process
      // acquire: pairs with the CAS that gave it up (also ordered by `running` above).
      if (w.ranks[i]->departure.load(std::memory_order_acquire) == detail::RankState::kGivenUp) {
        // Still in its run function: its recorder is its own (and it was in no operation).
        const std::string stuck = "\nrank " + std::to_string(i) + ": stuck in its run function";
        recent += stuck;
        all += stuck;
        continue;
      }
      const auto& f = w.ranks[i]->flight;
      const std::string head = "\nrank " + std::to_string(i) + ", " + std::to_string(f.total()) +
                               " operations in this run:";
      recent += head + f.format(detail::kFlightRecordsInMessage, now);
      all += head + f.format(f.depth(), now);
    }
    const std::string what = w.opts.inject
                                 ? w.failure_message + "\n(under " + w.opts.inject->describe() +
                                       "; rerun with this seed to reproduce the event order)"
                                 : w.failure_message;
    throw RankFailure(w.failed_rank, what, w.failure,
                      w.opts.flight_recorder_depth > 0 ? recent : std::string(),
                      w.opts.flight_recorder_depth > 0 ? all : std::string());
  }
}

}  // namespace tspemu
