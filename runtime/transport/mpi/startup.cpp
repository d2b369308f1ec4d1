// Start-up and shutdown: MPI once per process, the world's communicator, the process layout, runs'
// start.
#include "progress.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

namespace {

// Read by the other processes of this node (copy_from_process) to learn whether they may read
// this one's memory in place: random per process, so that a pid naming another process (another
// pid namespace) is not taken for this one even if that process runs the same program.
const std::uint64_t& probe_word() {
  static const std::uint64_t word = [] {
    std::random_device random;
    return std::uint64_t{random()} << 32 | random();
  }();
  return word;
}

// MPI itself, once per process: initialized by the first World spanning processes (unless the
// program did), finalized at exit after every live world's progress thread has stopped.
struct MpiProcess {
  std::mutex mu;
  std::vector<MpiTransport::Progress*> live;
  bool we_initialized = false;
  static MpiProcess& get();
};
void stop_progress(MpiTransport::Progress& p);
void cancel_posted(MpiTransport::Progress& p);

void finalize_at_exit() {
  MpiProcess& m = MpiProcess::get();
  {
    std::lock_guard lock(m.mu);
    for (auto* p : m.live) {
      stop_progress(*p);
      cancel_posted(*p);  // a world still alive at exit: no receive outlives MPI
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

MpiProcess& MpiProcess::get() {
  static MpiProcess* m = [] {
    auto* made = new MpiProcess();  // never destroyed: finalize_at_exit runs after main
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                "MPI_Init_thread");
      made->we_initialized = true;
      std::atexit(finalize_at_exit);
    }
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error("World(mpi): MPI provides thread level " + std::to_string(provided) +
                               ", MPI_THREAD_MULTIPLE is needed (MPI_Init_thread)");
    void* ub = nullptr;
    int has = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has);
    if (has && *static_cast<int*>(ub) < kReplyTagLimit)
      throw std::runtime_error("World(mpi): MPI_TAG_UB " + std::to_string(*static_cast<int*>(ub)) +
                               " is below the " + std::to_string(kReplyTagLimit) + " tags needed");
    return made;
  }();
  return *m;
}

void stop_progress(MpiTransport::Progress& p) {
  if (p.stopped) return;
  p.stopped = true;
  // release: pairs with the progress thread's acquire load; it sees every command pushed before.
  p.stopping.store(true, std::memory_order_release);
  p.parker.unpark();
  if (p.thread.joinable()) p.thread.join();
}

void cancel_posted(MpiTransport::Progress& p) {
  p.cancel_posted();
}

}  // namespace

MpiTransport::MpiTransport(WorldShared& w) : w_(w), p_(std::make_unique<Progress>(w)) {
  MpiProcess& mp = MpiProcess::get();
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int n = w.opts.ranks;
  if (n % size != 0)
    throw std::invalid_argument("World(mpi): ranks=" + std::to_string(n) + " is not divisible by " +
                                std::to_string(size) + " MPI processes (process " +
                                std::to_string(rank) + ")");
  w.processes = size;
  w.local_ranks = n / size;
  w.first_local = rank * w.local_ranks;
  p_->process = rank;
  const auto processes = static_cast<std::size_t>(size);
  p_->wire_sent.assign(processes, 0);
  p_->wire_received.assign(processes, 0);
  p_->messages_to.reset(new std::atomic<std::uint64_t>[processes]);
  p_->messages_from.reset(new std::atomic<std::uint64_t>[processes]);
  for (std::size_t q = 0; q < processes; ++q) {
    p_->messages_to[q].store(0, std::memory_order_relaxed);
    p_->messages_from[q].store(0, std::memory_order_relaxed);
  }
  p_->held.resize(static_cast<std::size_t>(w.local_ranks));
  p_->serving.reset(new std::atomic<int>[static_cast<std::size_t>(n)]);
  for (int i = 0; i < n; ++i)
    p_->serving[static_cast<std::size_t>(i)].store(0, std::memory_order_relaxed);
  // Collective over MPI_COMM_WORLD: every process makes its worlds in the same order.
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &p_->comm), "MPI_Comm_dup");
  p_->posted_buffers = std::make_unique<std::byte[]>(kPostedBytes * kPostedReceives);
  p_->init_posted();
  {
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(p_->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    int on_node = 1;
    MPI_Comm_size(node, &on_node);
    p_->yield_when_idle = static_cast<unsigned>(on_node) > std::thread::hardware_concurrency();
    int first_on_node = rank;
    check_mpi(MPI_Allreduce(&rank, &first_on_node, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce");
    map_control_rings(*p_, node, p_->yield_when_idle);
    MPI_Comm_free(&node);
    find_direct_peers(first_on_node);
  }
  {
    std::lock_guard lock(mp.mu);
    mp.live.push_back(p_.get());
  }
  p_->thread = std::thread([p = p_.get()] { p->loop(); });
}

// Deliberately not guarded: a lock or join that throws here would leave the progress thread running
// on freed state; terminating (the destructor is noexcept) is the only safe outcome.
// NOLINTNEXTLINE(bugprone-exception-escape)
MpiTransport::~MpiTransport() {
  MpiProcess& mp = MpiProcess::get();
  std::lock_guard lock(mp.mu);
  stop_progress(*p_);
  mp.live.erase(std::remove(mp.live.begin(), mp.live.end(), p_.get()), mp.live.end());
  // A freed communicator's context id is reused by the next MPI_Comm_dup, so every message still
  // on its way on this one (a done, an abort, the reply to a read cancelled by a failure) is taken
  // in first (drain: collective, every process destroys its worlds in the same order). If that
  // does not complete (another process never ends this world), the communicator and the buffers
  // of sends in flight are left to MPI_Finalize rather than freed under MPI.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && p_->drain())
    MPI_Comm_free(&p_->comm);
  else {
    // Left to MPI, see above, with the posted receives' buffers. A bad_alloc here ends the
    // process, as any exception leaving this destructor does (see the NOLINT on it).
    if (!p_->pending.empty())
      new std::vector<Progress::Outstanding>(  // NOLINT(bugprone-unhandled-exception-at-new)
          std::move(p_->pending));
    if (!finalized) static_cast<void>(p_->posted_buffers.release());
  }
}

void MpiTransport::find_direct_peers(int first_on_node) {
  // Collective over the world (every process takes part, whatever it decides): each process's pid,
  // its node, where its probe word lies and its value.
  constexpr int kFields = 4;
  const std::uint64_t mine[kFields] = {
      static_cast<std::uint64_t>(getpid()), static_cast<std::uint64_t>(first_on_node),
      reinterpret_cast<std::uintptr_t>(&probe_word()), probe_word()};
  const std::size_t processes = p_->wire_sent.size();
  std::vector<std::uint64_t> all(kFields * processes);
  check_mpi(MPI_Allgather(mine, kFields, MPI_UINT64_T, all.data(), kFields, MPI_UINT64_T, p_->comm),
            "MPI_Allgather");
  p_->direct_pid.assign(processes, 0);
  // TSPEMU_MPI_DIRECT_READS=0: every read of another process goes over MPI (the path between
  // machines), e.g. to test it on one machine.
  const char* env = std::getenv("TSPEMU_MPI_DIRECT_READS");
  if (env != nullptr && std::string(env) == "0") return;
  for (std::size_t q = 0; q < processes; ++q) {
    const std::uint64_t* peer = all.data() + kFields * q;
    if (static_cast<int>(q) == p_->process || peer[1] != mine[1]) continue;
    const auto pid = static_cast<pid_t>(peer[0]);
    std::uint64_t seen = 0;
    if (copy_from_process(pid, peer[2], reinterpret_cast<std::byte*>(&seen), sizeof seen) &&
        seen == peer[3])
      p_->direct_pid[q] = pid;
  }
}

void MpiTransport::add_group(Group& g) {
  std::vector<std::vector<std::byte>> early;
  std::lock_guard lock(p_->groups_mu);
  p_->groups[g.wire_id] = &g;
  auto it = p_->deferred.find(g.wire_id);
  if (it == p_->deferred.end()) return;
  early = std::move(it->second);
  p_->deferred.erase(it);
  // Under groups_mu, so these come before any later message the progress thread applies.
  for (const auto& m : early) p_->apply(g, m);
}

void MpiTransport::start_run(std::uint32_t generation) {
  {
    std::scoped_lock lock(p_->groups_mu, p_->incoming_mu);
    // relaxed: ordered by the two mutexes the progress thread takes before reading it.
    p_->generation.store(generation, std::memory_order_relaxed);
    Group* world = p_->groups.at(0);
    // Again under the lock: a message of the last run may have reached the mirrors after
    // World::run's reset and before the new generation above.
    world->reset();
    p_->groups.clear();
    p_->groups[0] = world;
    p_->deferred.clear();
    p_->incoming.clear();
    for (auto& held : p_->held) held.clear();  // a failed run's
    // relaxed: no message of the next run moves before the barrier below (Progress::messages_to).
    for (int q = 0; q < w_.processes; ++q) {
      p_->messages_to[static_cast<std::size_t>(q)].store(0, std::memory_order_relaxed);
      p_->messages_from[static_cast<std::size_t>(q)].store(0, std::memory_order_relaxed);
    }
  }
  std::atomic<int> met{0};
  Progress::Command cmd;
  cmd.kind = Progress::Command::kBarrier;
  cmd.flag = &met;
  p_->push(std::move(cmd));
  // acquire: pairs with the progress thread's release store when the barrier completes.
  met.wait(0, std::memory_order_acquire);
  p_->run_start_ns = w_.now_ns();
}

}  // namespace tspemu::detail
