// The progress thread's loop and one poll: commands, posted receives, request completion, drain.
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

void MpiTransport::Progress::loop() {
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kYield = std::chrono::milliseconds(1);
  constexpr auto kShortParks = std::chrono::milliseconds(100);
  auto last_traffic = std::chrono::steady_clock::now();
  // acquire: pairs with the release store in stop_progress.
  while (!stopping.load(std::memory_order_acquire)) {
    // relaxed: see `handed`.
    if (handed.exchange(false, std::memory_order_relaxed))
      last_traffic = std::chrono::steady_clock::now();
    // A rank thread polls MPI itself (one rank per process): stay out of its way, woken by its
    // hand-off when it parks. Sends it left in flight move while it polls. The timeout bounds only
    // how long a peer's read waits on a rank that stopped polling with its condition met and went
    // on computing (it hands off only when it parks); each expiry is a context switch, which
    // oversubscribed processes pay in every small collective (docs/benchmarks.md).
    if (pumping.load(std::memory_order_relaxed) > 0) {
      parker.prepare();
      if (pumping.load(std::memory_order_relaxed) > 0 &&
          !stopping.load(std::memory_order_acquire) && !handed.load(std::memory_order_relaxed))
        parker.park(std::chrono::milliseconds(1));
      else
        parker.cancel();
      continue;
    }
    bool busy = false;
    bool in_flight = false;
    {
      std::unique_lock lock(poll_mu, std::try_to_lock);
      if (!lock.owns_lock()) {  // a rank thread is executing its commands
        std::this_thread::yield();
        continue;
      }
      busy = poll_once();
      in_flight = !requests.empty();
    }
    // Waiting, by time since the last traffic: poll without pause for kSpin (the answer to a
    // message just sent is a few microseconds away, and a yield or park there costs a wake-up on
    // both sides), then yield up to kYield, then park in short slices: incoming MPI traffic is only
    // seen by polling, so the slice bounds what a quiet process adds to a peer's read (commands
    // from our own ranks unpark at once).
    const auto now = std::chrono::steady_clock::now();
    // A transfer in flight (a reply, a read, a barrier) moves only while someone polls MPI: large
    // messages go in fragments that each side's polling hands on.
    if (busy || in_flight) {
      last_traffic = now;
      continue;
    }
    const auto quiet = now - last_traffic;
    if (quiet < kSpin) {
      cpu_relax();
    } else if (quiet < kYield) {
      std::this_thread::yield();
    } else {
      parker.prepare();
      bool queued;
      {
        std::lock_guard lock(queue_mu);
        queued = !queue.empty();
      }
      if (queued || stopping.load(std::memory_order_acquire))
        parker.cancel();
      else
        parker.park(quiet < kShortParks ? std::chrono::microseconds(20)
                                        : std::chrono::microseconds(200));
    }
  }
  // Stopping (the world is destroyed between runs, or at exit; no rank waits on a read then, so
  // nothing left is a read). Sends still in flight (the last dones, a reply a failed reader
  // never took) are polled for a bounded time; those left keep their buffers, left to MPI (the
  // few bytes leak) rather than freed under a send MPI may still read.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::lock_guard lock(poll_mu);
  run_commands();
  while (!requests.empty() && std::chrono::steady_clock::now() < until)
    if (!test_some()) std::this_thread::yield();
  // Sends still in flight are left to the destructor's drain.
}

bool MpiTransport::Progress::run_commands() {
  thread_local std::vector<Command> commands;
  // acquire: pairs with the release stores after a push (see `queued`).
  if (!queued.load(std::memory_order_acquire)) return false;
  {
    std::lock_guard lock(queue_mu);
    queued.store(false, std::memory_order_relaxed);  // under queue_mu: a later push sets it again
    if (queue.empty()) return false;
    commands.swap(queue);
  }
  for (auto& c : commands) execute(c);
  commands.clear();
  return true;
}

bool MpiTransport::Progress::poll_once() {
  bool busy = run_commands();
  if (take_rings(64) > 0) busy = true;
  if (control_over_mpi && take_posted(/*apply=*/true, 64) > 0) busy = true;
  // The other tag on one poll in kLargeProbeEvery: a probe that finds nothing costs as much as the
  // posted receives' test (~650 instructions, callgrind), and only a long point-to-point message
  // or an abort takes that tag; a few polls later is microseconds.
  const bool probe = ++polls % kLargeProbeEvery == 0;
  for (int i = 0; probe && i < 64; ++i) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    MPI_Improbe(MPI_ANY_SOURCE, kLargeControlTag, comm, &flag, &message, &status);
    if (!flag) break;
    int size = 0;
    MPI_Get_count(&status, MPI_BYTE, &size);
    inbox.resize(static_cast<std::size_t>(size));
    MPI_Mrecv(inbox.data(), size, MPI_BYTE, &message, MPI_STATUS_IGNORE);
    ++wire_received[static_cast<std::size_t>(status.MPI_SOURCE)];
    receive(inbox, status.MPI_SOURCE);
    busy = true;
  }
  if (!early_reads.empty()) {
    std::vector<std::pair<std::vector<std::byte>, int>> retry;
    retry.swap(early_reads);
    for (const auto& [m, from] : retry) serve_read(m, from);
    busy = busy || early_reads.size() < retry.size();
  }
  // What receive() queued (a done owed to a process whose member exposed a buffer) goes now.
  busy = run_commands() || busy;
  if (!requests.empty() && test_some()) busy = true;
  return busy;
}

int MpiTransport::Progress::take_posted(bool apply, int limit) {
  int taken = 0;
  for (; taken < limit; ++taken) {
    int flag = 0;
    MPI_Status status;
    MPI_Test(&posted[posted_next], &flag, &status);
    if (!flag) break;
    int size = 0;
    MPI_Get_count(&status, MPI_BYTE, &size);
    const std::byte* at =
        posted_buffers.get() + static_cast<std::size_t>(posted_next) * kPostedBytes;
    // Copied out before the buffer is posted again: what receive() keeps, it keeps from inbox.
    inbox.assign(at, at + size);
    MPI_Start(&posted[posted_next]);
    posted_next = (posted_next + 1) % kPostedReceives;
    ++wire_received[static_cast<std::size_t>(status.MPI_SOURCE)];
    if (apply) receive(inbox, status.MPI_SOURCE);
  }
  return taken;
}

void MpiTransport::Progress::cancel_posted() {
  for (int k = 0; k < kPostedReceives; ++k) {
    MPI_Request& r = posted[(posted_next + k) % kPostedReceives];
    MPI_Cancel(&r);
    MPI_Status status;
    MPI_Wait(&r, &status);
    int cancelled = 0;
    MPI_Test_cancelled(&status, &cancelled);
    if (!cancelled) ++wire_received[static_cast<std::size_t>(status.MPI_SOURCE)];
    MPI_Request_free(&r);  // persistent: complete leaves it allocated, inactive
  }
}

bool MpiTransport::Progress::test_some() {
  // Reused: this runs on every poll of the data path.
  completed.resize(requests.size());
  statuses.resize(requests.size());
  int count = 0;
  MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count, completed.data(),
               statuses.data());
  if (count <= 0 || count == MPI_UNDEFINED) return false;
  // Highest index first: complete() moves the last entry into its place, which is then one
  // still in flight (every finished entry above it was removed already).
  finished.clear();
  for (int k = 0; k < count; ++k) finished.emplace_back(completed[k], statuses[k]);
  std::sort(finished.begin(), finished.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [i, status] : finished) complete(static_cast<std::size_t>(i), status);
  return true;
}

bool MpiTransport::Progress::drain() {
  // How many messages every process sent here, against what arrived: the rest is taken in and
  // dropped (a done after a failed run, the reply to a read its reader cancelled). Bounded: a
  // process that never ends this world (it failed elsewhere) leaves the communicator to MPI.
  const std::size_t P = wire_sent.size();
  std::vector<std::uint64_t> expected(P, 0);
  MPI_Request counts = MPI_REQUEST_NULL;
  MPI_Ialltoall(wire_sent.data(), 1, MPI_UINT64_T, expected.data(), 1, MPI_UINT64_T, comm, &counts);
  bool counted = false;
  std::vector<std::byte> dropped;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    if (!counted) {
      int flag = 0;
      MPI_Test(&counts, &flag, MPI_STATUS_IGNORE);
      counted = flag != 0;
    }
    if (!requests.empty()) test_some();
    while (take_posted(/*apply=*/false, kPostedReceives) > 0) {
    }
    for (;;) {
      int flag = 0;
      MPI_Message message;
      MPI_Status status;
      MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &message, &status);
      if (!flag) break;
      int size = 0;
      MPI_Get_count(&status, MPI_BYTE, &size);
      dropped.resize(static_cast<std::size_t>(std::max(size, 1)));
      MPI_Mrecv(dropped.data(), size, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      ++wire_received[static_cast<std::size_t>(status.MPI_SOURCE)];
    }
    bool all_in = counted && requests.empty();
    for (std::size_t q = 0; all_in && q < P; ++q) all_in = wire_received[q] >= expected[q];
    if (all_in) {
      cancel_posted();  // nothing is left to match them
      return true;
    }
    std::this_thread::yield();
  }
  return false;
}

void MpiTransport::Progress::execute(Command& c) {
  switch (c.kind) {
    case Command::kSend:
      isend_owned(c.dest, std::move(c.bytes));
      break;
    case Command::kFetch: {
      Fetch& f = *c.fetch;
      MPI_Datatype type = MPI_BYTE;
      int count = static_cast<int>(f.row_bytes);
      if (f.rows > 1) {
        MPI_Type_create_hvector(static_cast<int>(f.rows), static_cast<int>(f.row_bytes),
                                static_cast<MPI_Aint>(f.dst_stride), MPI_BYTE, &type);
        MPI_Type_commit(&type);
        count = 1;
      }
      MPI_Request r;
      MPI_Irecv(f.dst, count, type, f.source, f.tag, comm, &r);
      if (type != MPI_BYTE) MPI_Type_free(&type);  // freed once the receive completes
      Outstanding o;
      o.kind = Outstanding::kFetchRecv;
      o.fetch = &f;
      requests.push_back(r);
      pending.push_back(std::move(o));
      // The request goes after the receive is posted, so the reply never waits unexpected.
      isend_owned(f.source, std::move(f.request));
      break;
    }
    case Command::kCancel:
      for (std::size_t i = 0; i < requests.size(); ++i)
        if (pending[i].kind == Outstanding::kFetchRecv && pending[i].fetch == c.fetch)
          MPI_Cancel(&requests[i]);  // completes (cancelled or arrived) in a later Testsome
      break;
    case Command::kAgree:
    case Command::kGather:
    case Command::kGatherv: {
      Outstanding o;
      o.kind = Outstanding::kBarrier;
      o.flag = c.flag;
      MPI_Request r;
      if (c.kind == Command::kAgree) {
        MPI_Iallreduce(MPI_IN_PLACE, c.value, 1, MPI_INT, MPI_MAX, comm, &r);
      } else if (c.kind == Command::kGatherv) {
        o.buffer = std::move(c.bytes);  // these live until the gather completes
        o.counts = std::move(c.counts);
        o.displs = std::move(c.displs);
        MPI_Iallgatherv(o.buffer.data(), static_cast<int>(o.buffer.size()), MPI_BYTE, c.gathered,
                        o.counts.data(), o.displs.data(), MPI_BYTE, comm, &r);
      } else {
        o.buffer = std::move(c.bytes);  // the send buffer lives until the gather completes
        MPI_Iallgather(o.buffer.data(), static_cast<int>(o.buffer.size()), MPI_BYTE, c.gathered,
                       static_cast<int>(o.buffer.size()), MPI_BYTE, comm, &r);
      }
      requests.push_back(r);
      pending.push_back(std::move(o));
      break;
    }
    case Command::kBarrier: {
      Outstanding o;
      o.kind = Outstanding::kBarrier;
      o.flag = c.flag;
      MPI_Request r;
      MPI_Ibarrier(comm, &r);
      requests.push_back(r);
      pending.push_back(std::move(o));
      break;
    }
  }
}

void MpiTransport::Progress::complete(std::size_t i, const MPI_Status& status) {
  // MPI_Testsome set requests[i] to MPI_REQUEST_NULL; drop the entry, moving the last one into
  // its place (their order means nothing): erasing from the middle moves every entry after it,
  // and a process whose receivers are descheduled has hundreds of sends in flight (complete()
  // was 53% of a broadcast root's time at P = 4 when its roots ran ahead without bound).
  Outstanding o = std::move(pending[i]);
  if (i + 1 != pending.size()) {
    requests[i] = requests.back();
    pending[i] = std::move(pending.back());
  }
  requests.pop_back();
  pending.pop_back();
  switch (o.kind) {
    case Outstanding::kOwnedSend:
      break;
    case Outstanding::kReply:
      // seq_cst: pairs with the owner's seq_cst loads in abandon().
      serving[static_cast<std::size_t>(o.owner)].fetch_sub(1, std::memory_order_seq_cst);
      break;
    case Outstanding::kFetchRecv: {
      Fetch& f = *o.fetch;
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (!cancelled) ++wire_received[static_cast<std::size_t>(f.source)];
      RankState* waiter = f.waiter;
      // A cancelled receive and one that got its reply both end here; the reader only needs to
      // know the receive is over (it asked for the cancel only because it is unwinding).
      // seq_cst: the store half of the Parker handshake with the reader (see Fetch::state).
      f.state.store(Fetch::kArrived, std::memory_order_seq_cst);
      waiter->parker.unpark();
      break;
    }
    case Outstanding::kBarrier:
      // release: pairs with start_run's acquire wait on the flag.
      o.flag->store(1, std::memory_order_release);
      o.flag->notify_all();
      break;
  }
}

}  // namespace tspemu::detail
