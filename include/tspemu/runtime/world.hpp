// World: N ranks, each a thread with its own arena, running one SPMD function per run.
//
// What: World(opts).run(fn) calls fn(rank) on every rank concurrently, rank i on its own thread.
// Requirements: 1 <= ranks <= kMaxRanks; fn must not let exceptions escape except to report a
// failure (that is the point); run() must not be called from inside fn (it throws
// std::invalid_argument at once, so the run fails naming that rank).
// Guarantees:
//  - threads are created once and kept between runs; run() returns when every rank has returned;
//  - if any rank throws, every other rank's pending or later wait fails within milliseconds with
//    PeerFailure naming the first failing rank, and run() then throws RankFailure(first rank,
//    first message, original exception) after every rank has stopped. The world stays usable.
//  - a rank waiting for a rank that has already returned from fn fails with HangError; a wait
//    with no progress for opts.hang_timeout fails with HangError naming the operation and the
//    ranks it waits for; when every rank is blocked for opts.watchdog_timeout, HangError lists
//    every rank's pending operation and the wait-for cycle (watchdog).
//  - a message sent and never received by the end of the run, of any size, fails the run with
//    CollectiveMismatch naming the sender, the receiver, the message number and its size;
//  - a hang diagnosis (hang_timeout or watchdog) is printed to stderr as soon as it is made, so
//    it is seen even while a rank busy outside the runtime keeps run() from returning;
//  - a rank that stays outside the runtime for opts.stuck_rank_timeout while another waits for
//    it fails the run with HangError naming it, and run() returns without it: the stuck rank's
//    thread runs on in its run function (it cannot be interrupted). The next run() first waits
//    for it to return; until then its arena, counters and trace are its own, not to be read. A
//    World destroyed while it is stuck detaches its threads, and the last of them to stop frees
//    the world's state (nothing leaks once the stuck rank returns);
//  - every failure carries the last operations of every rank (RankFailure::flight_record()).
// Cost: a run round trip wakes N threads (one futex wake each when they sleep).
//
// Example:
//   tspemu::World world({.ranks = 4});
//   world.run([](tspemu::Rank& r) {
//     auto x = r.arena().allocate<float>(1024, tspemu::Category::workspace);
//     tspemu::all_reduce(r.comm(), x.span());
//   });
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

#include "tspemu/runtime/arena.hpp"
#include "tspemu/runtime/comm.hpp"
#include "tspemu/runtime/counters.hpp"
#include "tspemu/runtime/injection.hpp"
#include "tspemu/runtime/sim_clock.hpp"
#include "tspemu/runtime/trace.hpp"

namespace tspemu {

namespace detail {
struct WorldShared;
struct RankState;
}  // namespace detail

struct WorldOptions {
  int ranks = 1;
  // Emulated device memory per rank. Nothing is reserved up front; allocations are accounted.
  std::size_t arena_capacity = std::size_t{16} << 30;
  // A wait that sees no progress this long fails with HangError.
  std::chrono::milliseconds hang_timeout{30'000};
  // Hang watchdog (runtime/watchdog.hpp): when every rank has been blocked in a wait (or has
  // returned) this long with no progress, the run fails with HangError listing each rank's pending
  // operation and the wait-for cycle. 0 disables it (hang_timeout still applies).
  std::chrono::milliseconds watchdog_timeout{3'000};
  // Stuck rank (runtime/watchdog.hpp): when a rank has waited this long for a rank of this process
  // that stayed outside the runtime all that time (in no operation: computing, or looping
  // forever), the run fails with HangError naming the stuck rank (RankFailure::rank()) and every
  // rank waiting for it, and World::run returns without waiting for the stuck rank, which cannot
  // be interrupted. The default is hang_timeout's default (30 s), where the wait fails anyway:
  // compute longer than that between operations while a peer waits needs both raised. Above
  // hang_timeout, hang_timeout reports the waiter first and run() waits for every rank. 0 disables
  // it. Not in a world spanning processes (mpi), where hang_timeout reports the wait.
  std::chrono::milliseconds stuck_rank_timeout{30'000};
  // Operations of each rank kept by its flight recorder and printed with a failure (0: none).
  std::size_t flight_recorder_depth = 64;
  // Record every rank's events (trace.hpp); read them with World::trace() between runs.
  bool trace = false;
  std::size_t trace_capacity = std::size_t{1} << 16;  // events per rank; more are dropped
  // Give every event a simulated duration from this model (sim_clock.hpp): an estimate.
  std::optional<SimClockModel> sim_clock{};
  // Seeded delays and delivery reordering (injection.hpp); World::set_injection changes it.
  // Checked by Injection::validate against hang_timeout.
  std::optional<Injection> inject{};
  // Pin rank i's thread to core i mod (cores available).
  bool pin_threads = false;
  // Dry run (core/dry_run.hpp): every rank's arena accounts without backing (arena.hpp) and every
  // rank thread sees dry_run() == true during a run, so kernels and copies skip their bytes and
  // a schedule of any size measures its memory and traffic in seconds. The world's transport is
  // the dry-run transport: collectives still meet, check fingerprints and count bytes, but copy
  // nothing of arena memory.
  bool dry_run = false;
  // Span the processes of MPI_COMM_WORLD (transport/mpi.hpp; only when built with MPI): every
  // process constructs the World with the same options and makes the same run() calls; `ranks`
  // (global ids) are spread as ranks / P consecutive ranks per process (P must divide ranks), and
  // each process runs fn on its own ranks only. Collectives and messages between ranks of one
  // process stay in shared memory; results, fingerprint checks and failures are as in one process.
  // MPI is initialized by the first such World (MPI_THREAD_MULTIPLE) unless the program did,
  // and finalized at exit.
  bool mpi = false;
};

inline constexpr int kMaxRanks = 256;

// What a rank sees inside World::run.
class Rank {
 public:
  int id() const { return id_; }
  int size() const { return size_; }
  Comm& comm() { return comm_; }  // the world communicator
  Arena& arena() { return *arena_; }
  TrafficCounters& counters() { return *counters_; }

  // Made by World for each run.
  Rank(int id, int size, Comm comm, Arena* arena, TrafficCounters* counters)
      : id_(id), size_(size), comm_(std::move(comm)), arena_(arena), counters_(counters) {}

 private:
  int id_;
  int size_;
  Comm comm_;
  Arena* arena_;
  TrafficCounters* counters_;
};

// How a rank about to sleep and the rank that wakes it fence (the Parker's handshake): "membarrier"
// (the waker's fence is a compiler barrier, the sleeper's a membarrier system call) or "seq_cst"
// (both fence; no usable membarrier, or TSPEMU_MEMBARRIER=0 in the environment). Decided once per
// process, at the first world.
const char* wake_handshake();

class World {
 public:
  explicit World(WorldOptions opts);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int size() const;
  const WorldOptions& options() const;
  // Whether `rank` runs in this process (always, unless options().mpi). A rank hosted elsewhere:
  // its counters and simulated clock are those of its process at the end of the last run; its
  // arena and trace here are untouched.
  bool hosts(int rank) const;
  void run(const std::function<void(Rank&)>& fn);

  // Inspection between runs (not during one).
  Arena& arena(int rank);
  const TrafficCounters& counters(int rank) const;
  void clear_counters();
  // The recorded events of every rank (empty unless options().trace).
  Trace trace() const;
  // A rank's simulated clock at the end of the last run, seconds (0 without options().sim_clock).
  double simulated_seconds(int rank) const;
  // Of a rank's simulated clock, the seconds its compute stream computed, waited for
  // communication (exposed) and ran while communication proceeded on its communication stream
  // (overlapped communication), summed over runs (sim_streams.hpp); the rest is waiting for the
  // other ranks at the start of a run. Zeros without options().sim_clock.
  struct SimulatedTime {
    double compute = 0, exposed_comm = 0, overlapped_comm = 0;
  };
  SimulatedTime simulated_time(int rank) const;
  // Injection for the following runs (nullopt: off). Only between runs. Throws
  // std::invalid_argument (and keeps the setting) if Injection::validate rejects it.
  void set_injection(std::optional<Injection> inject);

 private:
  // Shared with the rank threads (~World).
  std::shared_ptr<detail::WorldShared> shared_;
};

}  // namespace tspemu
