// What the parts of the MPI transport share: a read of another process's message (Fetch), the
// reads of one verb (FetchSet), the progress thread and what it owns (Progress), and the fast
// path's polling wait (MpiTransport::pump_until). Private to runtime/transport/mpi/.
#pragma once

#include <mpi.h>
#include <sys/mman.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../world/wait.hpp"
#include "../mpi.hpp"
#include "../parker.hpp"
#include "rings.hpp"
#include "wire.hpp"

namespace tspemu::detail {

// One read of another process's message, owned by the reading rank's thread until `state` leaves
// kPending.
struct MpiTransport::Fetch {
  enum : int { kPending = 0, kArrived = 1, kCancelled = 2 };
  std::byte* dst = nullptr;
  std::size_t rows = 0, row_bytes = 0, dst_stride = 0;
  int source = 0;  // process
  int tag = 0;
  RankState* waiter = nullptr;
  std::vector<std::byte> request;
  // Written by the progress thread when the reply has arrived (or the receive was cancelled);
  // seq_cst store then the waiter's unpark, pairing with the seq_cst load in the waiter's
  // wait_until condition: the Parker's Dekker handshake (parker.hpp). The reply's bytes in dst
  // happen before it (MPI_Testsome returned on this thread before the store).
  std::atomic<int> state{kPending};
};

// The reads of other processes' messages of one step that one verb (recv_each, recv_reduce) has
// in flight together: started together, then waited for one by one. A read still in flight when the
// set ends (its reader unwinding) is cancelled first, since its destination may be freed then. A
// read of a member in a process of this node whose memory this one may read (direct_pid), of at
// least kDirectBytes, is copied in place by the reader (process_vm_readv) when waited for: the
// set's first read of the member asks where its message lies, the others of the set copy at once,
// and the owner's process, often descheduled on oversubscribed cores, answers one request per
// member and step instead of one per chunk and copies nothing.
// One set at a time per thread (checked): the reads are the thread's own, kept between sets (a
// Fetch is shared with the progress thread by address, so they stay put while any is in flight).
struct MpiTransport::FetchSet {
  struct Read {
    Fetch fetch;
    bool started = false;
    bool in_place = false;  // copied at wait, from the member's address (Source)
    int from = 0;
    std::size_t offset = 0, end = 0;
    std::byte* dst = nullptr;
  };
  // A member read in place: where its message lies, asked by the set's first read of it. Every
  // entry is kUnasked between sets (the set's end resets those it asked).
  struct Source {
    enum : unsigned char { kUnasked, kAsked, kKnown, kOverMpi } state = kUnasked;
    Fetch fetch;
    alignas(8) std::byte reply[sizeof(AddressReply)] = {};
    AddressReply where;
  };
  // Below this a reply carrying the bytes costs what one carrying the address does.
  static constexpr std::size_t kDirectBytes = std::size_t{16} << 10;

  // Room for reads [0, capacity) of the members' messages of step `step_read`.
  FetchSet(MpiTransport& transport, CallState& call, int step_read, std::size_t capacity);
  FetchSet(const FetchSet&) = delete;
  FetchSet& operator=(const FetchSet&) = delete;
  ~FetchSet();
  // Read i: bytes [offset, offset + bytes) of member `from`'s step message into dst.
  void start(std::size_t i, int from, std::size_t offset, std::size_t bytes, std::byte* dst);
  // Waits for read i (nothing when it was not started or came with the open), then for its
  // owner's post to be mirrored here, whose size bounds the range read.
  void wait(std::size_t i);

  MpiTransport& t;
  CallState& c;
  const int step;
  Read* reads = nullptr;
  Source* sources = nullptr;  // by group rank
  std::size_t asked = 0;      // members whose address this set asked for
  std::size_t used = 0;       // reads [0, used) have `started` set
};

struct MpiTransport::Progress {
  struct Command {
    // kBarrier: every process meets; kAgree: also *value = the maximum over processes;
    // kGather: every process's `bytes` into `gathered`, in process order; kGatherv: the same with
    // process q's `counts[q]` bytes at `displs[q]`.
    enum Kind { kSend, kFetch, kCancel, kBarrier, kAgree, kGather, kGatherv } kind = kSend;
    std::vector<int> counts, displs;
    int dest = -1;
    std::vector<std::byte> bytes;
    std::byte* gathered = nullptr;
    Fetch* fetch = nullptr;
    std::atomic<int>* flag = nullptr;
    int* value = nullptr;
  };
  struct Outstanding {
    enum Kind { kOwnedSend, kFetchRecv, kReply, kBarrier } kind = kOwnedSend;
    std::vector<std::byte> buffer;
    // kOwnedSend of one message to several processes: the buffer they share.
    std::shared_ptr<const std::vector<std::byte>> shared;
    Fetch* fetch = nullptr;
    int owner = -1;  // kReply: the world rank whose posted buffer is being sent
    std::atomic<int>* flag = nullptr;
    std::vector<int> counts, displs;  // kGatherv's, alive until it completes
  };
  struct Incoming {
    MessageHeader header;
    std::vector<std::byte> payload;
  };
  using MessageKey = std::tuple<std::uint64_t, int, int, std::uint64_t>;  // group, src, dst, index

  explicit Progress(WorldShared& world) : w(world) {}

  WorldShared& w;
  MPI_Comm comm = MPI_COMM_NULL;
  int process = 0;
  std::thread thread;
  Parker parker;
  // The run whose messages are taken (World::run's generation); a message of another run is
  // dropped. Set by start_run between runs while holding groups_mu and incoming_mu, and read by
  // the progress thread under the lock of what the message would change, so no message of the
  // last run lands in state reset for the next one (relaxed: the mutexes order it). Rank threads
  // read it during a run, after World::run's release bump of the generation published it.
  std::atomic<std::uint32_t> generation{0};
  std::uint32_t run() const { return generation.load(std::memory_order_relaxed); }
  // Set (release) by stop_progress; the progress thread's acquire load ends its loop.
  std::atomic<bool> stopping{false};
  bool stopped = false;  // guarded by MpiProcess::mu

  std::mutex queue_mu;
  std::vector<Command> queue;
  // Whether `queue` may hold commands: set (release) under queue_mu after each push, cleared under
  // it when run_commands takes them. Lets a poll with nothing queued (most polls) skip queue_mu:
  // poll_once looked twice per poll, and a waiting process's polls were its lock and unlock.
  // A hint, acquire-loaded without the lock: a thread sees its own pushes (program order), the
  // progress thread a push that unparked it (the Parker's handshake orders the store before the
  // wake), and a poller that reads false while another thread pushes sees it on a later poll, as
  // it would have had it taken queue_mu a moment earlier.
  std::atomic<bool> queued{false};

  // Held by whichever thread drives MPI: the progress thread, or a rank thread waiting on the
  // fast path (MpiTransport::pump_until). It guards `requests`, `pending`, `wire_sent` and
  // `wire_received`, and keeps control messages applied in arrival order (one poller at a time).
  std::mutex poll_mu;
  // Rank threads polling MPI themselves right now. Incremented and decremented by them, loaded by
  // the progress thread, which then stays parked instead of competing for the cores (relaxed: a
  // hint; a rank that stops polling without its condition met sets `handed` and unparks it).
  std::atomic<int> pumping{0};
  // Set (relaxed) by a rank thread that gave up polling and is about to park: the progress thread,
  // unparked right after, polls without pause again (the unpark orders it).
  std::atomic<bool> handed{false};
  // Whether an idle poller yields between polls: when this node's processes outnumber its cores,
  // as OpenMPI itself does then (mpi_yield_when_idle), so both sides are compared alike.
  bool yield_when_idle = false;

  // The groups of the run by wire id, and control messages for a group not made here yet.
  std::mutex groups_mu;
  std::unordered_map<std::uint64_t, Group*> groups;
  std::unordered_map<std::uint64_t, std::vector<std::vector<std::byte>>> deferred;

  std::mutex incoming_mu;
  std::map<MessageKey, std::unique_ptr<Incoming>> incoming;

  // Replies in flight from each world rank's posted buffers. Incremented and decremented by the
  // progress thread (seq_cst stores); an unwinding owner's seq_cst loads in abandon() wait for 0
  // so it does not free a buffer MPI still reads.
  std::unique_ptr<std::atomic<int>[]> serving;

  // Reads that arrived before their owner published the step here (serve_read); under poll_mu.
  std::vector<std::pair<std::vector<std::byte>, int>> early_reads;
  // Eager broadcasts each local rank received without sending their open (MpiTransport::hold),
  // by local rank: on group g (alive for the run: World keeps its groups), as member `member`,
  // calls #first .. #last. Only the rank's own thread touches its entries during a run;
  // start_run clears them between runs.
  struct Held {
    Group* g = nullptr;
    int member = 0;
    std::uint64_t first = 0, last = 0;
  };
  std::vector<std::vector<Held>> held;

  // Under poll_mu.
  std::vector<MPI_Request> requests;
  std::vector<int> completed;  // test_some's, reused
  std::vector<MPI_Status> statuses;
  std::vector<std::pair<int, MPI_Status>> finished;
  std::vector<std::byte> inbox;  // receive's
  // Receives of kControlTag posted in advance, each into its own kPostedBytes buffer, taken in
  // the order they were posted (so in the order each sender sent: MPI matches an arriving message
  // to the first posted receive that fits, and all of these fit every message of the tag).
  // Persistent (MPI_Recv_init once, MPI_Start to post again): a taken receive is reposted without
  // allocating and initializing a request, and MPI_Test does not free it (callgrind, 8 B broadcast
  // receiver at P = 8, per call: MPI_Irecv 704 -> MPI_Start 599, MPI_Test 808 -> 751).
  MPI_Request posted[kPostedReceives] = {};
  std::unique_ptr<std::byte[]> posted_buffers;
  int posted_next = 0;  // the oldest posted receive
  unsigned polls = 0;   // poll_once's, counting to the next probe of kLargeControlTag
  void init_posted() {
    for (int i = 0; i < kPostedReceives; ++i) {
      MPI_Recv_init(posted_buffers.get() + static_cast<std::size_t>(i) * kPostedBytes,
                    static_cast<int>(kPostedBytes), MPI_BYTE, MPI_ANY_SOURCE, kControlTag, comm,
                    &posted[i]);
      MPI_Start(&posted[i]);
    }
  }
  // Takes in (apply: and applies) up to `limit` control messages that arrived into posted
  // receives, reposting each; how many.
  int take_posted(bool apply, int limit);
  // Cancels the posted receives (the world's end); one that got a message counts it.
  void cancel_posted();
  std::vector<Outstanding> pending;
  // Per process: its pid when this process may read its memory in place (same node, and a probe
  // read succeeded at the start), else 0. Written before the progress thread starts, then only
  // read.
  std::vector<pid_t> direct_pid;
  // Control messages to and from the processes of this node, by process (nullptr: over MPI; see
  // map_control_rings). Written before the progress thread starts, then read; the rings' own
  // positions change under poll_mu (one writer and one reader per ring and process).
  std::vector<ControlRing*> ring_to, ring_from;
  std::vector<int> ring_sources;         // the processes with a ring_from
  std::vector<std::uint64_t> ring_tail;  // by process: what this process wrote to ring_to
  std::vector<std::uint64_t> ring_room;  // by process: ring_to's head as last loaded + ring_bytes
  std::size_t ring_bytes = kRingBytes;   // of each ring in use (ring_bytes_in_use)
  bool control_over_mpi = true;          // some process sends control messages here over MPI
  std::vector<std::byte> ring_inbox;     // take_rings'
  std::vector<std::pair<void*, std::size_t>> mappings;  // unmapped with the Progress
  ~Progress() {
    for (const auto& [at, bytes] : mappings) munmap(at, bytes);
  }
  // Writes a control message of at most kPostedBytes to process `dest`'s ring; false when `dest`
  // is reached over MPI. A full ring is waited for while taking in this process's own rings (so
  // two processes filling each other's never wait on each other). Caller holds poll_mu.
  bool ring_send(int dest, std::span<const std::byte> bytes);
  // Takes in and applies up to `limit` control messages from the rings; how many. Caller holds
  // poll_mu.
  int take_rings(int limit);
  // Messages (control, read requests, replies) sent to and received from each process over the
  // world's life: at the world's end every message sent to this process is taken in (drain), so
  // none is left to match the traffic of a later communicator that reuses this one's context.
  // Progress thread only, then the destructor once it has stopped.
  std::vector<std::uint64_t> wire_sent, wire_received;

  // Point-to-point messages (kMessage) of the current run sent to and received from each process:
  // end_run waits until every message sent to this process has arrived, then checks that every
  // one was taken. `messages_to`: incremented by rank threads (relaxed: end_run reads it after
  // every local rank stopped, ordered by World::run's acquire load of `running`);
  // `messages_from`: release increments by the progress thread after the message is stored,
  // pairing with end_run's acquire loads. Both reset by start_run before its barrier, when no
  // message of the next run can be on its way.
  std::unique_ptr<std::atomic<std::uint64_t>[]> messages_to, messages_from;
  // This process's clock (WorldShared::now_ns) when the run's opening barrier completed: traces
  // from another process are shifted by the difference of the two (share_traces).
  std::int64_t run_start_ns = 0;
  // Names of other processes' trace events and groups (TraceEvent::name points into it).
  std::set<std::string> trace_names;

  // Queues a command. drive: the caller (a rank thread) executes the queue itself when no other
  // thread is polling, saving the hand-off to the progress thread; the progress thread is still
  // unparked when the caller does not poll on (more than one rank per process), because a send
  // left in `requests` completes only while someone polls.
  void push(Command c, bool drive = false) {
    {
      std::lock_guard lock(queue_mu);
      queue.push_back(std::move(c));
      queued.store(true, std::memory_order_release);
    }
    if (drive) {
      std::unique_lock lock(poll_mu, std::try_to_lock);
      if (lock.owns_lock()) {
        run_commands();
        if (w.local_ranks == 1) {
          // A small send is usually complete at once (copied out by MPI): completing it here
          // leaves the progress thread nothing in flight to spin on while this rank computes.
          if (!requests.empty()) test_some();
          return;
        }
      }
    }
    parker.unpark();
  }
  void send_to(int process_id, std::vector<std::byte> bytes, bool drive = false) {
    // One rank per process and MPI free: the caller sends at once, past the queue (what is queued
    // goes first, so a thread's messages to a process keep their order).
    if (drive && w.local_ranks == 1) {
      std::unique_lock lock(poll_mu, std::try_to_lock);
      if (lock.owns_lock()) {
        run_commands();
        isend_owned(process_id, std::move(bytes));
        test_some();  // see push
        return;
      }
    }
    Command c;
    c.kind = Command::kSend;
    c.dest = process_id;
    c.bytes = std::move(bytes);
    push(std::move(c), drive);
  }

  // The same control message to every process in `to` (drive, see send_to). One rank per process
  // and MPI free: the caller sends it itself (isend_all) from `bytes`; otherwise a copy per
  // process goes through the queue. `bytes` is left empty when its storage had to be kept for a
  // send still in flight: a caller reusing it as a buffer only resizes it again.
  void send_to_all(std::span<const int> to, std::vector<std::byte>& bytes) {
    if (w.local_ranks == 1) {
      std::unique_lock lock(poll_mu, std::try_to_lock);
      if (lock.owns_lock()) {
        run_commands();
        isend_all(to, bytes);
        return;
      }
    }
    for (int q : to) send_to(q, bytes, true);
  }
  // Sends `bytes` to every process in `to`. When every send completed at once (OpenMPI's
  // shared-memory transport copies a small message out within MPI_Isend) nothing is kept: no
  // allocation, no entry in `pending`, nothing for test_some to poll, and `bytes` is the caller's
  // again. Otherwise its storage moves to `pending` (a moved vector keeps its heap block, which the
  // sends read) until the last of them completes. Never waits: a thread holds poll_mu only while
  // it makes progress. Caller holds poll_mu.
  void isend_all(std::span<const int> to, std::vector<std::byte>& bytes) {
    MPI_Request sends[kMaxRanks];
    int n = 0;
    for (int q : to) {
      if (ring_send(q, bytes)) continue;
      MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, q,
                control_tag(bytes.size()), comm, &sends[n++]);
      ++wire_sent[static_cast<std::size_t>(q)];
    }
    if (n == 0) return;
    int all_done = 0;
    MPI_Testall(n, sends, &all_done, MPI_STATUSES_IGNORE);
    if (all_done) return;
    // A MPI_Testall that returns false modifies no request: each is completed by test_some.
    const auto shared = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
    bytes.clear();
    for (int k = 0; k < n; ++k) {
      Outstanding o;
      o.kind = Outstanding::kOwnedSend;
      o.shared = shared;
      requests.push_back(sends[k]);
      pending.push_back(std::move(o));
    }
    test_some();  // see push
  }
  // A control message to process `dest`, its buffer kept until the send completes. Caller holds
  // poll_mu.
  void isend_owned(int dest, std::vector<std::byte> bytes) {
    Outstanding o;
    o.kind = Outstanding::kOwnedSend;
    o.buffer = std::move(bytes);
    isend_kept(dest, std::move(o));
  }
  // Sends o's buffer (or the one it shares), kept in `pending` until the send completes, to
  // process `dest`. Caller holds poll_mu.
  void isend_kept(int dest, Outstanding&& o) {
    const std::vector<std::byte>& bytes = o.shared ? *o.shared : o.buffer;
    if (ring_send(dest, bytes)) return;
    MPI_Request r;
    MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest,
              control_tag(bytes.size()), comm, &r);
    ++wire_sent[static_cast<std::size_t>(dest)];
    requests.push_back(r);
    pending.push_back(std::move(o));
  }

  void loop();
  // Executes the queued commands, takes in the control messages that arrived and completes the
  // requests that finished; whether anything happened. Caller holds poll_mu.
  bool poll_once();
  bool run_commands();
  // One MPI_Testsome over `requests`, completing what finished; false when nothing did.
  bool test_some();
  void execute(Command& c);
  // The control message m from process `source` (m is reused by the caller: what is kept is
  // copied).
  void receive(const std::vector<std::byte>& m, int source);
  void complete(std::size_t i, const MPI_Status& status);
  bool drain();
  void apply(Group& g, const std::vector<std::byte>& m);
  void owe_done(const Group& g, std::uint64_t seq, int owner_process);
  void serve_read(const std::vector<std::byte>& m, int from_process);
  void take_abort(const std::vector<std::byte>& m);
  void wake_members(const Group& g) {
    for (int r : g.world_ranks)
      if (w.hosts(r)) w.ranks[static_cast<std::size_t>(r)]->parker.unpark();
  }
};

// Copies bytes [address, address + bytes) of process `pid` into dst; false when the kernel refuses
// (not permitted, no such process, not mapped there).
bool copy_from_process(pid_t pid, std::uint64_t address, std::byte* dst, std::size_t bytes);

template <class Ready>
bool MpiTransport::pump_until(Ready&& ready) {
  if (ready()) return true;
  if (w_.local_ranks != 1) return false;
  // Polls for up to kQuiet after the last sign of traffic (a message taken in, a request completed
  // or still in flight: a large transfer moves only while its sides poll), at most kLongest in
  // all; then the usual wait (which watches the abort, the departure of the peer and the hang
  // timeout) parks, and the progress thread serves.
  constexpr auto kQuiet = std::chrono::microseconds(500);
  constexpr auto kLongest = std::chrono::milliseconds(20);
  // relaxed: see Progress::pumping.
  p_->pumping.fetch_add(1, std::memory_order_relaxed);
  const auto start = std::chrono::steady_clock::now();
  auto last_traffic = start;
  bool met = false;
  for (unsigned i = 1;; ++i) {
    bool busy = false;
    {
      std::unique_lock lock(p_->poll_mu, std::try_to_lock);
      if (lock.owns_lock()) busy = p_->poll_once() || !p_->requests.empty();
    }
    if (ready()) {
      met = true;
      break;
    }
    // seq_cst: pairs with WorldShared::fail's store; the wait_until that follows throws.
    if (w_.aborted.load(std::memory_order_seq_cst)) break;
    if (busy || i % 16 == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (busy) last_traffic = now;
      if (now - last_traffic > kQuiet || now - start > kLongest) break;
    }
    if (!busy && p_->yield_when_idle) std::this_thread::yield();
  }
  p_->pumping.fetch_sub(1, std::memory_order_relaxed);
  if (!met) {
    // Parking next: the progress thread serves from here on (relaxed: the unpark orders it).
    p_->handed.store(true, std::memory_order_relaxed);
    p_->parker.unpark();
  }
  return met;
}

}  // namespace tspemu::detail
