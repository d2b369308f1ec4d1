// Shared state of a world and of its groups: the ranks, the run control, the groups (each with
// its shared-memory mailbox, transport/shared_memory.hpp) and the transport the world uses. The
// wait loop over it is wait.hpp; the hooks around every operation, op_hooks.hpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../transport/parker.hpp"
#include "observer.hpp"
#include "tspemu/core/compute_span.hpp"
#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/dtype.hpp"
#include "tspemu/runtime/elapsed_clock.hpp"
#include "tspemu/runtime/flight_recorder.hpp"
#include "tspemu/runtime/sim_streams.hpp"
#include "tspemu/runtime/world.hpp"
#include "watchdog.hpp"

namespace tspemu::detail {

struct WorldShared;
struct Group;
// The shared-memory transport's parts a group holds (transport/shared_memory.hpp,
// transport/early_exposure.hpp): held by pointer, so this header does not include them.
struct Slot;
struct Channel;
struct MemberExposures;
class SharedMemoryTransport;

// The other processes of a world that spans several (WorldOptions::mpi, transport/mpi.hpp): what
// the world tells them besides the transport's traffic. Absent (null) in a one-process world.
class ProcessLink {
 public:
  virtual ~ProcessLink() = default;
  // Makes a group made in this process reachable by the other processes' messages for it.
  virtual void add_group(Group& group) = 0;
  // Between runs, on the caller's thread: drops the last run's state and meets every process, so
  // no process starts run `generation` before every other one has reset its groups for it.
  virtual void start_run(std::uint32_t generation) = 0;
  // After this process's ranks have returned, on the caller's thread: waits until every process
  // has ended the run and, if one of them failed, until its failure is recorded here, so every
  // process's run ends the same way.
  virtual void end_run() = 0;
  // The first failure this process saw, to end every other process's run with it.
  virtual void local_failure(int rank, const std::string& message,
                             const std::exception_ptr& error) noexcept = 0;
};

struct Group {
  Group(WorldShared* world, std::uint64_t id, std::string name, std::vector<int> world_ranks);
  int size() const { return static_cast<int>(world_ranks.size()); }
  // Inline: three lookups per message. acquire: pairs with the acq_rel CAS that installed it.
  Channel& channel(int src, int dst) {
    Channel* c =
        channels[static_cast<std::size_t>(src) * world_ranks.size() + static_cast<std::size_t>(dst)]
            .load(std::memory_order_acquire);
    return c != nullptr ? *c : make_channel(src, dst);
  }
  Channel& make_channel(int src, int dst);  // first use of the pair by either end
  void reset();                             // only while no rank runs

  WorldShared* world;
  std::uint64_t id;
  // The group's name in every process (ids count the groups of one process): the world group is
  // 0, a split's group mixes its parent's, the split call's number and the color.
  std::uint64_t wire_id = 0;
  std::string name;
  std::vector<int> world_ranks;
  // Each member's parker (of its RankState), woken after every publish to the mailbox: one load
  // per member instead of two (world rank, then rank state).
  std::vector<Parker*> parkers;
  // The processes other than this one hosting members (ascending); empty in a one-process world.
  std::vector<int> other_processes;
  // The shared-memory transport's mailbox of this group (transport/shared_memory.hpp).
  std::unique_ptr<Slot[]> slots;
  // Made on first use by either end. acq_rel CAS installs a fully built Channel; acquire loads
  // pair with it, so the loser of a race and every later user see the constructed object.
  std::unique_ptr<std::atomic<Channel*>[]> channels;
  // Each member's exposed non-blocking all_gathers (transport/early_exposure.hpp).
  std::unique_ptr<MemberExposures[]> exposures;
  ~Group();
};

// The rank's side of compute_span.hpp: records spans in its trace and charges them on its simulated
// clock. Installed on the rank's thread for a run when tracing or a simulated clock is on.
struct RankComputeObserver final : ComputeObserver {
  explicit RankComputeObserver(RankState* s) : self(s) {}
  Token begin_compute() noexcept override;
  void end_compute(const Token& token, const char* name, double flops) noexcept override;
  RankState* self;
};

struct RankState {
  RankState(WorldShared* w, int id, std::size_t capacity, std::size_t flight_depth,
            const ElapsedClock& clock, int ranks, bool dry)
      : world(w),
        rank(id),
        arena(id, capacity, dry),
        flight(flight_depth, clock),
        last_scan(static_cast<std::size_t>(ranks), 0) {}
  WorldShared* world;
  int rank;
  Parker parker;
  // True over a run of reads of other ranks' buffers, never over a wait. seq_cst store then a
  // seq_cst load of `aborted` (begin_reading, shared_memory.cpp) against the aborter's seq_cst
  // store of `aborted` then load of this flag: an exposing rank that sees reading == false after an
  // abort knows no read will start.
  alignas(64) std::atomic<bool> reading{false};
  // Set (release) when this rank's run function has returned or thrown; acquire loads by waiters
  // turn a wait on a departed rank into HangError instead of a hang.
  alignas(64) std::atomic<bool> exited{false};
  // This rank's compute counter (core/compute_span.hpp: raised with release at every kernel's
  // begin on its thread); members acquire-load it before copying into this rank's exposed buffers
  // (transport/early_exposure.hpp). Never reset: exposures compare it with its value at issue.
  alignas(64) std::atomic<std::uint64_t> computes_begun{0};
  // Operations this rank has begun (note_entry, op_hooks.hpp), never reset: a rank waiting for this
  // one reads it (relaxed) at each wake-up to see whether it entered the runtime since its last
  // look (stuck_rank_poll, watchdog.hpp). It publishes nothing, so relaxed suffices on both sides:
  // a stale read only delays a report by one wake-up, and only this rank writes it.
  alignas(64) std::atomic<std::uint64_t> ops_begun{0};
  // Whether this rank's run function is still running (kInRun), has returned (kReturned, this
  // rank's CAS when it leaves it) or was given up on while stuck outside the runtime (kGivenUp, a
  // waiter's CAS in stuck_rank_poll): exactly one of the two CASes wins. acq_rel on both: the
  // loser's acquire sees what the winner did before (the waiter's count in `stranded`, or the
  // rank's last operations). Reset to kInRun by World::run between runs (the generation bump
  // publishes it).
  std::atomic<int> departure{kInRun};
  static constexpr int kInRun = 0, kReturned = 1, kGivenUp = 2;
  Arena arena;
  TrafficCounters counters;
  // The wait this rank is blocked in, for the other ranks' watchdog scans (watchdog.hpp).
  PendingSlot pending;
  // Own thread only; read by World::run after the run (flight_recorder.hpp).
  FlightRecorder flight;
  // This rank's previous watchdog scan: the wait id of every rank, valid if scan_valid.
  std::vector<std::uint64_t> last_scan;
  bool scan_valid = false;
  // Own thread only: this rank's events when tracing (null otherwise), and its simulated clock.
  std::unique_ptr<RankTrace> trace;
  SimStreams sim;  // its simulated clock: compute and communication streams
  RankComputeObserver compute{this};
  // Own thread only: waits begun (wait_until calls whose first test failed), never reset. An
  // operation that saw it unchanged did not wait (notify_end: its flight record's end).
  std::uint64_t waits = 0;
  // Own thread only (reset by World::run before the run starts): how many groups hold an eager
  // broadcast this rank was root of and has not met the members of yet (Slot::unmet).
  int unmet_calls = 0;
  // Own thread only (reset by World::run before the run starts): the first non-blocking
  // collective whose handle was destroyed unwaited (nonblocking.hpp), as the error the rank
  // raises at its next collective or when its run function returns; empty when none.
  std::string unwaited;
  // Own thread only (reset by World::run before the run starts): this rank's injection stream.
  InjectionStream inject;
};

struct WorldShared {
  explicit WorldShared(const WorldOptions& o);
  WorldOptions opts;
  int spin_iterations;  // before yielding: shorter when ranks outnumber cores
  // A step 0 wait's first spin on the member's descriptor stamp alone (shared_memory.cpp:
  // wait_stage): spin_iterations, or 0 when ranks outnumber cores, where the member is likely off
  // its core and the spin only delays the yield (measured slower there: docs/benchmarks.md).
  int stamp_spin_iterations;
  int yield_iterations;  // before parking
  // A yield that took longer than this ran another thread on our core: stop yielding and park
  // (a parked rank is woken ahead of a CPU-bound thread; a yielding one waits out its slice).
  std::chrono::nanoseconds long_yield;
  // Every world rank's state; in a world spanning processes, only the ranks [first_local,
  // first_local + local_ranks) run here (the others' states hold the mirrors' parkers only).
  std::vector<std::unique_ptr<RankState>> ranks;
  int first_local = 0;
  int local_ranks = 0;
  int processes = 1;
  bool hosts(int world_rank) const {
    return world_rank >= first_local && world_rank < first_local + local_ranks;
  }
  int process_of(int world_rank) const { return world_rank / local_ranks; }
  // Every timestamp of the world (flight recorder, pending waits, traces), since the world was
  // made: read once or twice per operation by the flight recorder, so the cheap clock. Constructed
  // before any RankState (World's constructor adds them), whose recorders keep a pointer to it.
  ElapsedClock clock;
  std::int64_t now_ns() const { return clock.now_ns(); }
  std::shared_ptr<Group> world_group;
  // How the collectives and messages of this world move bytes (transport.hpp).
  std::unique_ptr<Transport> transport;
  // The same object when it is SharedMemoryTransport or DryTransport (which overrides none of its
  // verbs), so Call may call them without virtual dispatch; null otherwise (MPI).
  SharedMemoryTransport* shared_memory = nullptr;
  // The shared-memory transport the world's transport is or builds on (MpiTransport mirrors the
  // other processes' members into its mailboxes), or null: Call reads small step-0 messages from
  // its mailboxes directly (recv_all_step0). Derived from `transport` once, at construction.
  SharedMemoryTransport* mailboxes = nullptr;
  // The transport's link to the other processes (the same object), or null.
  ProcessLink* link = nullptr;
  // What may run beside every operation, in order (observer.hpp).
  std::vector<std::unique_ptr<Observer>> observers;
  // The observers this run's options enable, per hook (refilled by World::run while the workers
  // are idle; capacity reserved at construction, so a run start does not allocate).
  std::vector<Observer*> on_begin, on_meet, on_end, on_wait;
  // Per OpInfo::Kind, the hooks (kHookBegin | kHookMeet | kHookEnd) some selected observer acts on
  // (Observer::kinds); notify_* of any other hook returns after one test.
  std::uint8_t observed[OpInfo::kKinds] = {};

  // Set once per run by the first failure (seq_cst: the abort half of the `reading` handshake,
  // and every waiter polls it); cleared only between runs.
  std::atomic<bool> aborted{false};
  std::mutex failure_mu;  // guards the first failure (error path only)
  int failed_rank = -1;
  std::string failure_message;
  std::exception_ptr failure;

  // Groups made by split, found by (run generation, parent id, parent seq, color) so every member
  // gets the same one. The entry holds the group until its last member has looked it up, then is
  // erased (the members' Comms keep the group alive). Not a weak_ptr: a fast member that drops
  // its Comm (e.g. after an eager send) before a slow member's lookup would kill the group, and
  // the slow member would make a fresh, empty one and hang.
  struct PendingGroup {
    std::shared_ptr<Group> group;
    int lookups_left = 0;
  };
  std::mutex groups_mu;
  std::uint64_t next_group_id = 1;
  std::map<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, int>, PendingGroup> split_groups;
  // Every group made in this run, kept until the next run starts: flight records and pending
  // waits name their group by pointer, and failures are formatted after the members have left.
  std::vector<std::shared_ptr<Group>> run_groups;
  // Names of every group made while tracing, by id (trace events name groups by id). Guarded by
  // groups_mu; read by Trace between runs.
  std::map<std::uint64_t, std::string> group_names;

  // Run control. The caller of World::run bumps `generation` (release; pairs with the workers'
  // acquire wait/load, publishing `fn` and the reset state) and waits for `running` to reach 0
  // (each worker's acq_rel decrement publishes its rank's results to the caller).
  std::vector<std::thread> threads;
  const std::function<void(Rank&)>* fn = nullptr;
  // The run function's copy `fn` points to while stuck_rank_timeout is on: a rank given up on
  // runs on in it after World::run has returned and the caller's function is gone. Replaced only
  // by the next run, which first waits for that rank (`stranded`).
  std::function<void(Rank&)> fn_copy;
  std::atomic<std::uint32_t> generation{0};
  std::atomic<int> running{0};
  // Ranks given up on (RankState::departure == kGivenUp) whose run function has not returned yet:
  // raised by the waiter that gives one up (before its CAS, so never negative), lowered (acq_rel)
  // by the rank when it returns; World::run and ~World load it with acquire, so a rank's last
  // writes happen before the next run resets its state.
  std::atomic<int> stranded{0};
  bool stopping = false;  // written before the final generation bump, read after it

  // Fills on_begin .. on_wait from `observers` and `opts`.
  void select_observers();
  // Records `error` as the run's failure if it is the first, raises `aborted` and wakes everyone.
  // A first failure raised in this process (not `from_other_process`) goes to the other ones.
  void fail(int rank, const std::string& message, const std::exception_ptr& error,
            bool from_other_process = false);
  std::string first_failure();
};

}  // namespace tspemu::detail
