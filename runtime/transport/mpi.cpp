#include "mpi.hpp"

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

#include "../parker.hpp"
#include "tspemu/runtime/error.hpp"

namespace tspemu::detail {

namespace {

// Control messages (to a process's progress thread) of at most kPostedBytes use one tag and land
// in receives posted in advance (Progress::posted); longer ones (a point-to-point message's
// payload, an abort's text) use another and are probed for. Replies to reads use tags that name
// the reader, the member read and the run (so a reply to a read cancelled by a failed run never
// matches a read of a later run).
constexpr int kControlTag = 1;
constexpr int kLargeControlTag = 2;
// A control message taken by MPI_Improbe + MPI_Mrecv is matched as an unexpected message and
// copied twice; one that finds its receive posted is matched on arrival and copied once.
constexpr std::size_t kPostedBytes = 2048;
constexpr int kPostedReceives = 16;
constexpr unsigned kLargeProbeEvery = 8;
// How many eager broadcasts a receiver enters before it sends the open of the last one, carrying
// the fingerprints of the others (MpiTransport::hold). Below kDescriptors / 2: a root waits for
// the receivers' progress kDescriptors - 1 calls back, and it must see it without them waiting.
// The largest such: each held open is P - 1 messages, and on oversubscribed cores the processes'
// summed time per message bounds a broadcast (8 B, same session, medians of 3 alternating runs:
// 16 -> 31 took P = 4 from 2.16 to 1.71 us, P = 8 from 5.61 to 5.09 us).
constexpr std::uint64_t kHeldOpens = 31;
static_assert(kHeldOpens < kDescriptors / 2);
constexpr int kReplyTagBase = 16;
constexpr int kReplyTagLimit = kReplyTagBase + (64 << 16);
int reply_tag(std::uint32_t generation, int reader_world_rank, int member) {
  return kReplyTagBase + static_cast<int>(((generation & 0x3fu) << 16) |
                                          (static_cast<unsigned>(reader_world_rank) << 8) |
                                          static_cast<unsigned>(member));
}

enum WireType : std::uint32_t { kOpen = 1, kPost, kDone, kMessage, kRead, kAbort };

struct WireHead {
  std::uint32_t type = 0;
  std::uint32_t generation = 0;  // World::run number: a message of an earlier run is dropped
  std::uint64_t group = 0;       // Group::wire_id
  std::uint64_t seq = 0;
  std::int32_t member = 0;  // the sender's group rank
  std::int32_t step = 0;
  std::uint64_t bytes = 0;  // open/post: the step message's size
};
struct OpenBody {
  Fingerprint fp;
  CallHeader header;
  std::uint8_t eager = 0;  // step 0 follows
  // The sender's fingerprints of its calls #seq - held .. #seq - 1 on the group follow (before
  // step 0): eager broadcasts it received without sending their open (MpiTransport::hold), as
  // `runs` HeldRuns in call order, each fingerprint once for the calls in a row that share it.
  std::uint32_t held = 0;
  std::uint32_t runs = 0;
};
// `calls` consecutive held calls with fingerprint fp. A receiver usually holds repeats of one
// call (a loop's broadcast): a held open is then one run, 24 bytes, and stays within OpenMPI's
// inline send (btl_vader_max_inline_send, 256 B), which with a fingerprint per call (16 bytes
// times 30) it exceeded: such a send takes a request, often still in flight after MPI_Testall.
struct HeldRun {
  Fingerprint fp;
  std::uint64_t calls = 0;
};
struct MessageBody {
  std::int32_t dst = 0;
  std::uint64_t index = 0;
  MessageHeader header;
};
struct ReadBody {
  std::uint64_t offset = 0, stride = 0, row_bytes = 0, rows = 0;
  std::int32_t reader = 0;  // world rank
  std::int32_t tag = 0;
  // Nonzero: reply with where the message lies (AddressReply), not with its bytes.
  std::uint32_t address_only = 0;
};
// The reply to an address-only read: the owner's step message starts at `address` in the owner's
// process (0 when it cannot be read in place: made of pieces, or the range exceeds it) and is
// `bytes` long. The reader copies from it itself (process_vm_readv).
struct AddressReply {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};
struct AbortBody {
  std::int32_t rank = 0;
  std::int32_t kind = 0;  // FailureKind
};
enum FailureKind : std::int32_t { kOther, kMismatch, kPeer, kHang, kOom };
// A group's control messages (open, post, done) and read requests keep their order only on one
// tag: every open, with the most fingerprints a held open carries and an eager step 0, fits.
static_assert(sizeof(WireHead) + sizeof(OpenBody) + kHeldOpens * sizeof(HeldRun) + kEagerBytes <=
                  kPostedBytes &&
              sizeof(WireHead) + sizeof(ReadBody) <= kPostedBytes);
int control_tag(std::size_t bytes) {
  return bytes <= kPostedBytes ? kControlTag : kLargeControlTag;
}

template <class Body>
std::vector<std::byte> encode(const WireHead& h, const Body& b, std::span<const std::byte> extra) {
  std::vector<std::byte> out(sizeof h + sizeof b + extra.size());
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &b, sizeof b);
  if (!extra.empty()) std::memcpy(out.data() + sizeof h + sizeof b, extra.data(), extra.size());
  return out;
}
template <class Body>
Body body_of(const std::vector<std::byte>& m) {
  Body b;
  std::memcpy(&b, m.data() + sizeof(WireHead), sizeof b);
  return b;
}
template <class Body>
std::span<const std::byte> extra_of(const std::vector<std::byte>& m) {
  return std::span<const std::byte>(m).subspan(sizeof(WireHead) + sizeof(Body));
}

// The calling thread's buffer for the control messages it sends to every other process of a group
// (open, post): reused, so that sending one allocates nothing (Progress::isend_all).
std::vector<std::byte>& control_buffer() {
  thread_local std::vector<std::byte> buffer;
  return buffer;
}

// Copies bytes [address, address + bytes) of process `pid` into dst; false when the kernel refuses
// (not permitted, no such process, not mapped there).
bool copy_from_process(pid_t pid, std::uint64_t address, std::byte* dst, std::size_t bytes) {
  while (bytes > 0) {
    iovec local{dst, bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};  // NOLINT(performance-no-int-to-ptr)
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) return false;
    const auto n = static_cast<std::size_t>(got);  // a short count stops at an unmapped page
    dst += n;
    address += n;
    bytes -= n;
  }
  return true;
}

// One process's control messages to another process of its node, in memory both map (a memfd of
// the reader's, MpiTransport::map_control_rings): one writer (the sending process's poll_mu
// holder) and one reader (the receiving process's), records of an 8-byte size then the message,
// padded to 8 bytes, wrapping around `data`. Positions count bytes since the world began. The
// atomics live in memory mapped by two processes: lock-free, so address-free (static_assert).
constexpr std::size_t kRingBytes = std::size_t{64} << 10;
struct ControlRing {
  // The bytes the reader has copied out: stored (release) by the reader after it copied a record
  // out; the writer's acquire load before it overwrites that space pairs with it.
  alignas(64) std::atomic<std::uint64_t> head;
  // The bytes the writer has published: stored (release) after the writer wrote a record; the
  // reader's acquire load before it reads the record pairs with it.
  alignas(64) std::atomic<std::uint64_t> tail;
  alignas(64) std::byte data[kRingBytes];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::is_trivially_destructible_v<ControlRing>);

constexpr std::uint64_t ring_record_bytes(std::size_t message_bytes) {
  return 8 + ((message_bytes + 7) & ~std::size_t{7});
}
static_assert(std::has_single_bit(kRingBytes));
// The bytes of each ring in use (a power of two): kRingBytes, or TSPEMU_MPI_CONTROL_RING_BYTES
// rounded down to one, at least 4 KiB (a record of kPostedBytes fits), so that tests make writers
// wait for room. Every process of a job reads the same environment: writer and reader agree.
std::size_t ring_bytes_in_use() {
  const char* v = std::getenv("TSPEMU_MPI_CONTROL_RING_BYTES");
  if (v == nullptr) return kRingBytes;
  const std::size_t asked = std::bit_floor(std::strtoull(v, nullptr, 10));
  return std::clamp<std::size_t>(asked, std::bit_ceil(8 + kPostedBytes), kRingBytes);
}
// Copies between a ring's data at byte position `at` (wrapping at `size`, a power of two) and flat
// memory.
void ring_write(ControlRing& r, std::size_t size, std::uint64_t at, const void* src,
                std::size_t n) {
  const std::size_t pos = at & (size - 1), first = std::min(n, size - pos);
  std::memcpy(r.data + pos, src, first);
  std::memcpy(r.data, static_cast<const std::byte*>(src) + first, n - first);
}
void ring_read(const ControlRing& r, std::size_t size, std::uint64_t at, void* dst, std::size_t n) {
  const std::size_t pos = at & (size - 1), first = std::min(n, size - pos);
  std::memcpy(dst, r.data + pos, first);
  std::memcpy(static_cast<std::byte*>(dst) + first, r.data, n - first);
}

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

// Never wait with the reading flag up (shared_memory.cpp: an aborting local owner waits for it to
// drop). relaxed load: only this thread writes its flag; release store: our reads of local peers'
// buffers happen before a peer that sees it down frees them.
void lower_reading_flag(RankState& self) {
  if (self.reading.load(std::memory_order_relaxed))
    self.reading.store(false, std::memory_order_release);
}

int checked_int(std::uint64_t n, const char* what) {
  if (n > static_cast<std::uint64_t>(INT_MAX))
    throw std::length_error(std::string("MPI transport: ") + what + " of " + std::to_string(n) +
                            " bytes exceeds one MPI message (" + std::to_string(INT_MAX) + ")");
  return static_cast<int>(n);
}

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw std::runtime_error(std::string(call) + " failed: " + std::string(text, len));
  }
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

}  // namespace

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

namespace {

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

namespace {
thread_local bool fetch_set_live = false;
}  // namespace

MpiTransport::FetchSet::FetchSet(MpiTransport& transport, CallState& call, int step_read,
                                 std::size_t capacity)
    : t(transport), c(call), step(step_read) {
  if (fetch_set_live)
    throw std::logic_error("rank " + std::to_string(c.comm->world_rank(c.rank)) + ": " + c.op.what +
                           " started a second set of reads while one is open");
  thread_local std::unique_ptr<Read[]> mine;
  thread_local std::size_t room = 0;
  thread_local std::unique_ptr<Source[]> members;
  thread_local std::size_t member_room = 0;
  if (room < capacity) {  // the last set ended: none of the old reads is in flight
    mine.reset(new Read[capacity]);
    room = capacity;
  }
  const auto n = static_cast<std::size_t>(c.size);
  if (member_room < n) {
    members.reset(new Source[n]);
    member_room = n;
  }
  reads = mine.get();
  sources = members.get();
  fetch_set_live = true;
}

MpiTransport::FetchSet::~FetchSet() {
  for (std::size_t i = 0; i < used; ++i)
    if (reads[i].started && !reads[i].in_place) t.cancel_fetch(reads[i].fetch);
  for (int m = 0; asked > 0 && m < c.size; ++m) {
    Source& s = sources[m];
    if (s.state == Source::kAsked) t.cancel_fetch(s.fetch);
    s.state = Source::kUnasked;
  }
  fetch_set_live = false;
}

void MpiTransport::FetchSet::start(std::size_t i, int from, std::size_t offset, std::size_t bytes,
                                   std::byte* dst) {
  for (; used <= i; ++used) reads[used].started = false;  // not all: an 8 B call uses a few
  Read& r = reads[i];
  r.from = from;
  r.offset = offset;
  r.end = offset + bytes;
  r.dst = dst;
  r.in_place = false;
  const Group& g = c.comm->group();
  if (bytes >= kDirectBytes && t.p_->direct_pid[static_cast<std::size_t>(t.w_.process_of(
                                   g.world_ranks[static_cast<std::size_t>(from)]))] != 0) {
    Source& s = sources[from];
    if (s.state == Source::kUnasked) {
      s.state = Source::kAsked;
      ++asked;
      t.start_address_fetch(c, from, step, offset, bytes, s.reply, s.fetch);
    }
    if (s.state != Source::kOverMpi) {
      r.in_place = true;
      r.started = true;
      return;
    }
  }
  r.started = t.start_fetch(c, from, step, offset, bytes, bytes, 1, dst, bytes, r.fetch);
}

void MpiTransport::FetchSet::wait(std::size_t i) {
  if (i >= used || !reads[i].started) return;
  Read& r = reads[i];
  r.started = false;
  if (!r.in_place) t.wait_fetch(c, r.from, r.fetch);
  Source& s = sources[r.from];
  if (r.in_place && s.state == Source::kAsked) {
    t.wait_fetch(c, r.from, s.fetch);
    std::memcpy(&s.where, s.reply, sizeof s.where);
    s.state = s.where.address != 0 ? Source::kKnown : Source::kOverMpi;
  }
  if (step > 0) {  // step 0 was mirrored at the meet
    lower_reading_flag(c.comm->self());
    t.pump_until([&] { return t.mirror_reached(c, r.from, step_stage(step)); });
    t.wait_stage(c, r.from, step_stage(step));
  }
  t.check_read_range(c, r.from, step, r.offset, r.end);
  if (!r.in_place) return;
  const std::size_t bytes = r.end - r.offset;
  const Group& g = c.comm->group();
  const pid_t pid = t.p_->direct_pid[static_cast<std::size_t>(
      t.w_.process_of(g.world_ranks[static_cast<std::size_t>(r.from)]))];
  if (s.state == Source::kKnown && r.end <= s.where.bytes &&
      copy_from_process(pid, s.where.address + r.offset, r.dst, bytes))
    return;
  // Not readable in place after all (a message of pieces, or the kernel refused): over MPI.
  if (t.start_fetch(c, r.from, step, r.offset, bytes, bytes, 1, r.dst, bytes, r.fetch))
    t.wait_fetch(c, r.from, r.fetch);
}

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
    // on computing (it hands off only when it parks); each expiry is a context switch, and at
    // 200 us those of 8 processes on 2 cores took about a third of an 8 B all-reduce's
    // time (P = 8).
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

bool MpiTransport::Progress::ring_send(int dest, std::span<const std::byte> bytes) {
  ControlRing* r = ring_to[static_cast<std::size_t>(dest)];
  if (r == nullptr || bytes.size() > kPostedBytes) return false;
  const auto q = static_cast<std::size_t>(dest);
  const std::uint64_t need = ring_record_bytes(bytes.size());
  // The reader's head is loaded only when the room last seen is short, so a writer running ahead
  // of its reader does not pull the reader's cache line on every message.
  while (ring_tail[q] + need > ring_room[q]) {
    // acquire: pairs with the reader's release store of head (take_rings): the record it copied
    // out is done with before this one overwrites it.
    ring_room[q] = r->head.load(std::memory_order_acquire) + ring_bytes;
    if (ring_tail[q] + need <= ring_room[q]) break;
    // The world is being destroyed: no reader takes messages any more (see Progress::loop).
    // acquire: as loop()'s.
    if (stopping.load(std::memory_order_acquire)) return true;
    if (take_rings(64) == 0) std::this_thread::yield();
  }
  const std::uint64_t size = bytes.size();
  ring_write(*r, ring_bytes, ring_tail[q], &size, sizeof size);
  ring_write(*r, ring_bytes, ring_tail[q] + sizeof size, bytes.data(), bytes.size());
  ring_tail[q] += need;
  // release: publishes the record; pairs with the reader's acquire load of tail (take_rings).
  r->tail.store(ring_tail[q], std::memory_order_release);
  return true;
}

int MpiTransport::Progress::take_rings(int limit) {
  int taken = 0;
  for (int source : ring_sources) {
    ControlRing& r = *ring_from[static_cast<std::size_t>(source)];
    // relaxed: this process alone stores head. acquire: pairs with the writer's release store of
    // tail (ring_send); the records below it are written.
    std::uint64_t head = r.head.load(std::memory_order_relaxed);
    const std::uint64_t tail = r.tail.load(std::memory_order_acquire);
    for (; head != tail && taken < limit; ++taken) {
      std::uint64_t size = 0;
      ring_read(r, ring_bytes, head, &size, sizeof size);
      ring_inbox.resize(size);
      ring_read(r, ring_bytes, head + sizeof size, ring_inbox.data(), size);
      head += ring_record_bytes(size);
      // release: the record is copied out before the writer may overwrite it (ring_send).
      r.head.store(head, std::memory_order_release);
      receive(ring_inbox, source);
    }
  }
  return taken;
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

void MpiTransport::Progress::receive(const std::vector<std::byte>& m, int source) {
  if (m.size() < sizeof(WireHead)) return;
  WireHead h;
  std::memcpy(&h, m.data(), sizeof h);
  // A message of another run is dropped: one of a run that ended (by a failure) before this one.
  switch (h.type) {
    case kOpen:
    case kPost:
    case kDone: {
      std::lock_guard lock(groups_mu);
      if (h.generation != run()) return;
      auto it = groups.find(h.group);
      if (it == groups.end())
        deferred[h.group].push_back(m);  // the group is not made here yet
      else
        apply(*it->second, m);
      break;
    }
    case kMessage: {
      const auto b = body_of<MessageBody>(m);
      auto in = std::make_unique<Incoming>();
      in->header = b.header;
      const auto payload = extra_of<MessageBody>(m);
      in->payload.assign(payload.begin(), payload.end());
      int dst_world = -1;
      {
        std::lock_guard lock(groups_mu);
        auto it = groups.find(h.group);
        if (it != groups.end())
          dst_world = it->second->world_ranks[static_cast<std::size_t>(b.dst)];
      }
      {
        std::lock_guard lock(incoming_mu);
        if (h.generation != run()) return;
        incoming[{h.group, h.member, b.dst, b.index}] = std::move(in);
        // release: pairs with end_run's acquire load; the message is in `incoming` before.
        messages_from[static_cast<std::size_t>(source)].fetch_add(1, std::memory_order_release);
      }
      // The receiver polls `incoming` under its mutex, so the unpark below is ordered after the
      // insertion; a receiver of a group not registered yet is woken by its next park timeout.
      if (dst_world >= 0)
        w.ranks[static_cast<std::size_t>(dst_world)]->parker.unpark();
      else
        for (int r = w.first_local; r < w.first_local + w.local_ranks; ++r)
          w.ranks[static_cast<std::size_t>(r)]->parker.unpark();
      break;
    }
    case kRead:
      if (h.generation == run()) serve_read(m, source);
      break;
    case kAbort:
      if (h.generation == run()) take_abort(m);
      break;
    default:
      break;
  }
}

void MpiTransport::Progress::apply(Group& g, const std::vector<std::byte>& m) {
  WireHead h;
  std::memcpy(&h, m.data(), sizeof h);
  Slot& s = g.slots[static_cast<std::size_t>(h.member)];
  // A done sent twice (by the finishing member and on an exposure, see owe_done) may arrive after
  // the member's next open: progress never moves back. relaxed: only the poller holding groups_mu
  // writes a mirror's progress.
  if (h.type == kDone &&
      s.progress.load(std::memory_order_relaxed) >= stage_value(h.seq, kDoneStage))
    return;
  Descriptor& d = s.desc[h.seq % kDescriptors];
  std::uint64_t stage = kDoneStage;
  bool exposes = false;
  if (h.type == kOpen) {
    const auto b = body_of<OpenBody>(m);
    d.fp = b.fp;
    d.header = b.header;
    d.eager = b.eager != 0;
    // The eager broadcast's settling reads this ring (shared_memory.hpp: Slot::fps), and so does a
    // receiver's check of its root (MpiTransport::open_rooted); the held calls' entries, and their
    // descriptors (a member that entered one of them in another form meets and reads them), are
    // unread until the progress store below covers them, and free (their sender entered #seq).
    auto data = extra_of<OpenBody>(m);
    std::uint64_t u = h.seq - b.held;
    for (std::uint32_t k = 0; k < b.runs; ++k) {
      HeldRun run;
      std::memcpy(&run, data.data() + k * sizeof(HeldRun), sizeof run);
      for (const std::uint64_t end = u + run.calls; u < end; ++u) {
        s.fps[u % (2 * kDescriptors)] = run.fp;
        Descriptor& held = s.desc[u % kDescriptors];
        held.fp = run.fp;
        held.header = b.header;
        held.eager = true;  // a receiver of an eager broadcast posts nothing
        for (int i = 0; i < kMaxSteps; ++i) held.step(i) = StepMessage{};
        held.step0 = StepMessage{held.data, nullptr, 0, 0};
      }
    }
    data = data.subspan(b.runs * sizeof(HeldRun));
    s.fps[h.seq % (2 * kDescriptors)] = b.fp;
    if (d.eager && !data.empty()) std::memcpy(d.data, data.data(), data.size());
    for (int i = 0; i < kMaxSteps; ++i) d.step(i) = StepMessage{};
    d.step0 = StepMessage{d.eager ? d.data : nullptr, nullptr, 0, h.bytes};
    stage = step_stage(0);
    exposes = !d.eager;
  } else if (h.type == kPost) {
    d.step(h.step) = StepMessage{nullptr, nullptr, 0, h.bytes};
    stage = step_stage(h.step);
    exposes = h.bytes > 0;
  }
  // seq_cst: publishes the mirror's descriptor; pairs with the seq_cst loads of wait_stage
  // (shared_memory.cpp), and is the store half of their Parker handshake, as a local member's
  // own store is. It is also the store half of the exposure handshake with MpiTransport::finish.
  s.progress.store(stage_value(h.seq, stage), std::memory_order_seq_cst);
  wake_members(g);
  if (exposes) owe_done(g, h.seq, w.process_of(g.world_ranks[static_cast<std::size_t>(h.member)]));
}

void MpiTransport::Progress::owe_done(const Group& g, std::uint64_t seq, int owner_process) {
  // The member exposed a buffer of call #seq, and waits for every member's done. A local member
  // that already finished the call sent no done to its process (it saw no exposure then): send it
  // now. seq_cst load after the seq_cst store of the mirror's progress (apply), against finish's
  // store of its own progress then load of the mirrors: one of the two sides sees the other.
  for (std::size_t m = 0; m < g.world_ranks.size(); ++m) {
    if (!w.hosts(g.world_ranks[m])) continue;
    if (g.slots[m].progress.load(std::memory_order_seq_cst) < stage_value(seq, kDoneStage))
      continue;
    WireHead h;
    h.type = kDone;
    h.generation = run();
    h.group = g.wire_id;
    h.seq = seq;
    h.member = static_cast<std::int32_t>(m);
    std::vector<std::byte> bytes(sizeof h);
    std::memcpy(bytes.data(), &h, sizeof h);
    Command c;
    c.kind = Command::kSend;
    c.dest = owner_process;
    c.bytes = std::move(bytes);
    std::lock_guard lock(queue_mu);  // sent by poll_once's next run_commands
    queue.push_back(std::move(c));
    queued.store(true, std::memory_order_release);
  }
}

void MpiTransport::Progress::serve_read(const std::vector<std::byte>& m, int from_process) {
  WireHead h;
  std::memcpy(&h, m.data(), sizeof h);
  if (h.generation != run()) return;  // a retried early read of a run that failed
  const auto b = body_of<ReadBody>(m);
  Group* g = nullptr;
  {
    std::lock_guard lock(groups_mu);
    auto it = groups.find(h.group);
    if (it != groups.end()) g = it->second;
  }
  // A read comes only after its reader saw the owner's open or post (mirrored from the owner's
  // own messages, sent after it posted), so the group exists here and the step is posted; the
  // owner keeps the buffer until the reader's done.
  if (g == nullptr) return;
  // The owner sends its open before it writes its own descriptor (it polls while it meets), and a
  // read of a later step may leave before the owner posts (recv_each, recv_reduce): a read of a
  // step not yet published here waits in early_reads. seq_cst: pairs with the owner's store in
  // publish. A reader's reads of one member all reply on one tag (reply_tag) and its receives
  // match replies in the order they leave, so a read also waits behind any earlier one of its tag
  // still held (recv_reduce has two chunks' reads of each member in flight). Only behind those: a
  // read held for a later step must not hold up another reader's, or another member's.
  const bool behind = std::any_of(early_reads.begin(), early_reads.end(), [&](const auto& held) {
    return held.second == from_process && body_of<ReadBody>(held.first).tag == b.tag;
  });
  if (behind || g->slots[static_cast<std::size_t>(h.member)].progress.load(
                    std::memory_order_seq_cst) < stage_value(h.seq, step_stage(h.step))) {
    early_reads.emplace_back(m, from_process);
    return;
  }
  const int owner = g->world_ranks[static_cast<std::size_t>(h.member)];
  // seq_cst increment, then seq_cst load of `aborted`, against the owner's side (WorldShared::fail
  // stores aborted before the owner's abandon() loads serving): either the owner waits for this
  // reply, or this read is dropped (the world is failing; its reader learns so from the abort).
  serving[static_cast<std::size_t>(owner)].fetch_add(1, std::memory_order_seq_cst);
  if (w.aborted.load(std::memory_order_seq_cst)) {
    serving[static_cast<std::size_t>(owner)].fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  const Descriptor& d = g->slots[static_cast<std::size_t>(h.member)].desc[h.seq % kDescriptors];
  const StepMessage& msg = d.step(h.step);
  Outstanding o;
  o.kind = Outstanding::kReply;
  o.owner = owner;
  const void* src = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
  if (b.address_only != 0) {
    // The reader copies the range itself (FetchSet): this process need not run while it does,
    // and the owner keeps the buffer until the reader's done, as for a reply of the bytes.
    AddressReply a;
    a.bytes = msg.bytes;
    if (msg.pieces == nullptr && b.rows == 1 && b.offset + b.row_bytes <= msg.bytes)
      a.address = reinterpret_cast<std::uintptr_t>(msg.single);
    o.buffer.resize(sizeof a);
    std::memcpy(o.buffer.data(), &a, sizeof a);
    src = o.buffer.data();
    count = static_cast<int>(sizeof a);
  } else if (b.rows == 0 || b.offset + (b.rows - 1) * b.stride + b.row_bytes > msg.bytes) {
    // A read that left before the post was mirrored at its reader, of more than was posted: an
    // empty reply ends its receive, and the reader, checking the range against the post, throws.
  } else if (msg.pieces == nullptr) {
    src = msg.single + b.offset;
    if (b.rows == 1) {
      count = static_cast<int>(b.row_bytes);
    } else {
      MPI_Type_create_hvector(static_cast<int>(b.rows), static_cast<int>(b.row_bytes),
                              static_cast<MPI_Aint>(b.stride), MPI_BYTE, &type);
      MPI_Type_commit(&type);
      count = 1;
    }
  } else {
    // A message made of pieces: pack the rows (the reader checked the range against its size).
    o.buffer.resize(b.rows * b.row_bytes);
    for (std::uint64_t r = 0; r < b.rows; ++r) {
      std::size_t pos = b.offset + r * b.stride, done = 0;
      while (done < b.row_bytes) {
        std::size_t at = pos + done;
        std::size_t i = 0;
        while (i < msg.piece_count && at >= msg.pieces[i].size()) at -= msg.pieces[i++].size();
        const std::size_t len =
            std::min<std::size_t>(msg.pieces[i].size() - at, b.row_bytes - done);
        std::memcpy(o.buffer.data() + r * b.row_bytes + done, msg.pieces[i].data() + at, len);
        done += len;
      }
    }
    src = o.buffer.data();
    count = static_cast<int>(o.buffer.size());
  }
  MPI_Request r;
  MPI_Isend(src, count, type, from_process, b.tag, comm, &r);
  ++wire_sent[static_cast<std::size_t>(from_process)];
  if (type != MPI_BYTE) MPI_Type_free(&type);
  requests.push_back(r);
  pending.push_back(std::move(o));
}

void MpiTransport::Progress::take_abort(const std::vector<std::byte>& m) {
  const auto b = body_of<AbortBody>(m);
  const auto text_bytes = extra_of<AbortBody>(m);
  std::string text(reinterpret_cast<const char*>(text_bytes.data()), text_bytes.size());
  if (b.kind == kHang)
    text += "\n(process " + std::to_string(process) + " when the hang report arrived) " +
            describe_pending(w, w.now_ns());
  std::exception_ptr e;
  switch (b.kind) {
    case kMismatch:
      e = std::make_exception_ptr(CollectiveMismatch(text));
      break;
    case kPeer:
      e = std::make_exception_ptr(PeerFailure(text));
      break;
    case kHang:
      e = std::make_exception_ptr(HangError(text));
      break;
    case kOom:
      e = std::make_exception_ptr(OutOfMemory(text));
      break;
    default:
      e = std::make_exception_ptr(Error(text));
      break;
  }
  w.fail(b.rank, text, e, /*from_other_process=*/true);
}

namespace {

// Control messages between processes of one node travel through ControlRings in memory both map,
// not through MPI: the reader's poll reads a ring's tail where it would test a posted receive
// (MPI_Test, ~650 instructions when nothing came), and a writer copies the message where
// MPI_Isend would match and copy it. Each process makes a memfd holding one ring per process of
// its node (the ring that process writes to it), and the others map it through /proc/<pid>/fd
// (what process_vm_readv's permission check also allows); a pair that cannot keeps MPI.
// Only while the node's processes fit its cores (`oversubscribed` false). Measured,
// mpi_runtime_bench alternating builds on 2 cores, 8 B at P = 2: tspemu's time per call 0.74-0.80
// -> 0.43-0.53 us for all-reduce, all-gather and reduce-scatter, 0.28 -> 0.17 us for broadcast
// (1.7-1.9x OpenMPI's same-run time -> 0.93-1.07x). At P = 4 and 8 (oversubscribed) the first
// three took 0.6-0.7x the time with rings, but the broadcast 2-3x: ~13k fewer instructions per
// call summed over the processes, lost to scheduling (its pollers yield 2-3x as often; see the
// README's Benchmarks for what was tried).
// TSPEMU_MPI_CONTROL_RINGS=1 uses them regardless, =0 never (so does TSPEMU_MPI_DIRECT_READS=0: the
// path between machines). Collective over the world.
void map_control_rings(MpiTransport::Progress& p, MPI_Comm node, bool oversubscribed) {
  int node_size = 1, node_rank = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  const std::size_t processes = p.wire_sent.size();
  p.ring_to.assign(processes, nullptr);
  p.ring_from.assign(processes, nullptr);
  p.ring_tail.assign(processes, 0);
  p.ring_bytes = ring_bytes_in_use();
  p.ring_room.assign(processes, p.ring_bytes);
  std::vector<int> node_process(static_cast<std::size_t>(node_size));
  check_mpi(MPI_Allgather(&p.process, 1, MPI_INT, node_process.data(), 1, MPI_INT, node),
            "MPI_Allgather");
  auto env_is = [](const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string(v) == value;
  };
  const bool enabled = (!oversubscribed || env_is("TSPEMU_MPI_CONTROL_RINGS", "1")) &&
                       !env_is("TSPEMU_MPI_CONTROL_RINGS", "0") &&
                       !env_is("TSPEMU_MPI_DIRECT_READS", "0");
  const std::size_t bytes = sizeof(ControlRing) * static_cast<std::size_t>(node_size);
  int fd = -1;
  void* mine = MAP_FAILED;
  if (enabled && node_size > 1) {
    fd = memfd_create("tspemu-control-rings", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0)
      mine = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mine != MAP_FAILED) p.mappings.emplace_back(mine, bytes);
  const long long id[2] = {mine != MAP_FAILED ? static_cast<long long>(getpid()) : 0LL, fd};
  std::vector<long long> ids(2 * static_cast<std::size_t>(node_size));
  check_mpi(MPI_Allgather(id, 2, MPI_LONG_LONG, ids.data(), 2, MPI_LONG_LONG, node),
            "MPI_Allgather");
  std::vector<int> writes(processes, 0), reads(processes, 0);
  for (int k = 0; k < node_size; ++k) {
    const auto at_k = 2 * static_cast<std::size_t>(k);
    if (k == node_rank || ids[at_k] == 0) continue;
    const std::string path =
        "/proc/" + std::to_string(ids[at_k]) + "/fd/" + std::to_string(ids[at_k + 1]);
    const int peer = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (peer < 0) continue;
    void* theirs = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, peer, 0);
    ::close(peer);
    if (theirs == MAP_FAILED) continue;
    p.mappings.emplace_back(theirs, bytes);
    const auto q = static_cast<std::size_t>(node_process[static_cast<std::size_t>(k)]);
    p.ring_to[q] = static_cast<ControlRing*>(theirs) + node_rank;
    writes[q] = 1;
  }
  // Which processes write to this one's rings. Every process opened its peers' memfds before it
  // entered, so each may close its own once this completes.
  check_mpi(MPI_Alltoall(writes.data(), 1, MPI_INT, reads.data(), 1, MPI_INT, p.comm),
            "MPI_Alltoall");
  if (fd >= 0) ::close(fd);
  p.control_over_mpi = false;
  for (std::size_t q = 0; q < processes; ++q) {
    if (static_cast<int>(q) == p.process) continue;
    if (reads[q] == 0) {
      p.control_over_mpi = true;
      continue;
    }
    const auto k = static_cast<std::size_t>(
        std::find(node_process.begin(), node_process.end(), static_cast<int>(q)) -
        node_process.begin());
    p.ring_from[q] = static_cast<ControlRing*>(mine) + k;
    p.ring_sources.push_back(static_cast<int>(q));
  }
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

bool MpiTransport::remote(const Comm& comm, int member) const {
  return !w_.hosts(comm.group().world_ranks[static_cast<std::size_t>(member)]);
}

void MpiTransport::notify(const CallState& c, int type, int step, std::uint64_t bytes) {
  const Group& g = c.comm->group();
  if (g.other_processes.empty()) return;
  WireHead h;
  h.type = static_cast<std::uint32_t>(type);
  h.generation = p_->run();
  h.group = g.wire_id;
  h.seq = c.seq;
  h.member = c.rank;
  h.step = step;
  h.bytes = bytes;
  std::vector<std::byte>& m = control_buffer();
  m.resize(sizeof h);
  std::memcpy(m.data(), &h, sizeof h);
  p_->send_to_all(g.other_processes, m);
}

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

bool MpiTransport::mirrors_reached(const CallState& c, std::uint64_t stage) const {
  const Group& g = c.comm->group();
  const std::uint64_t target = stage_value(c.seq, stage);
  for (int r = 0; r < c.size; ++r)
    // seq_cst: as wait_stage's load (pairs with apply's store).
    if (r != c.rank && !w_.hosts(g.world_ranks[static_cast<std::size_t>(r)]) &&
        g.slots[static_cast<std::size_t>(r)].progress.load(std::memory_order_seq_cst) < target)
      return false;
  return true;
}

bool MpiTransport::mirror_reached(const CallState& c, int member, std::uint64_t stage) const {
  // seq_cst: as wait_stage's load (pairs with apply's store).
  return c.comm->group().slots[static_cast<std::size_t>(member)].progress.load(
             std::memory_order_seq_cst) >= stage_value(c.seq, stage);
}

namespace {
std::vector<MpiTransport::Progress::Held>& held_of(MpiTransport::Progress& p, int world_rank) {
  return p.held[static_cast<std::size_t>(world_rank - p.w.first_local)];
}
}  // namespace

void MpiTransport::send_open(const CallState& c, const Fingerprint& fp, const CallHeader& header,
                             std::span<const std::byte> step0) {
  Group& g = c.comm->group();
  if (g.other_processes.empty()) return;
  // The open message is built from fp and header directly (our descriptor is written by the
  // shared-memory open below, which then waits for every member). The calls this rank held back
  // (hold) are the ones just before this one: their fingerprints ride along.
  auto& held = held_of(*p_, c.comm->world_rank(c.rank));
  std::uint64_t first_held = c.seq;
  for (auto it = held.begin(); it != held.end(); ++it)
    if (it->g == &g) {
      first_held = it->first;
      held.erase(it);
      break;
    }
  send_open_message(g, c.rank, c.seq, fp, header, step0, first_held);
}

void MpiTransport::send_open_message(const Group& g, int member, std::uint64_t seq,
                                     const Fingerprint& fp, const CallHeader& header,
                                     std::span<const std::byte> step0, std::uint64_t first_held) {
  WireHead h;
  h.type = kOpen;
  h.generation = p_->run();
  h.group = g.wire_id;
  h.seq = seq;
  h.member = member;
  h.bytes = step0.size();
  OpenBody b;
  b.fp = fp;
  b.header = header;
  b.eager = step0.size() <= kEagerBytes ? 1 : 0;
  b.held = static_cast<std::uint32_t>(seq - first_held);
  const Slot& own = g.slots[static_cast<std::size_t>(member)];
  // At most kHeldOpens - 1 calls are held before one (hold flushes at kHeldOpens).
  if (seq - first_held >= kHeldOpens)
    throw std::logic_error("MPI transport: member " + std::to_string(member) + " held " +
                           std::to_string(seq - first_held) + " opens before call #" +
                           std::to_string(seq) + ", more than " + std::to_string(kHeldOpens - 1));
  // The held fingerprints as runs, written straight into the message: counted first, then written
  // (an array of kHeldOpens runs, built on every open though most hold none, cost ~220
  // instructions per open).
  auto held_fp = [&](std::uint64_t u) -> const Fingerprint& {
    return own.fps[u % (2 * kDescriptors)];
  };
  for (std::uint64_t u = first_held; u < seq; ++u)
    if (u == first_held || held_fp(u) != held_fp(u - 1)) ++b.runs;
  const std::size_t runs_bytes = b.runs * sizeof(HeldRun);
  std::vector<std::byte>& m = control_buffer();
  m.resize(sizeof h + sizeof b + runs_bytes + (b.eager ? step0.size() : 0));
  std::memcpy(m.data(), &h, sizeof h);
  std::memcpy(m.data() + sizeof h, &b, sizeof b);
  std::byte* at = m.data() + sizeof h + sizeof b;
  for (std::uint64_t u = first_held; u < seq;) {
    HeldRun run{held_fp(u), 0};
    for (; u < seq && held_fp(u) == run.fp; ++u) ++run.calls;
    std::memcpy(at, &run, sizeof run);
    at += sizeof run;
  }
  if (b.eager && !step0.empty()) std::memcpy(at, step0.data(), step0.size());
  p_->send_to_all(g.other_processes, m);
}

void MpiTransport::hold(CallState& c) {
  Group& g = c.comm->group();
  auto& held = held_of(*p_, c.comm->world_rank(c.rank));
  auto it = std::find_if(held.begin(), held.end(), [&](const auto& e) { return e.g == &g; });
  if (it == held.end()) {
    held.push_back(Progress::Held{&g, c.rank, c.seq, c.seq});
    it = held.end() - 1;
  }
  it->last = c.seq;
  if (it->last - it->first + 1 >= kHeldOpens) flush_held(c.comm->world_rank(c.rank));
}

void MpiTransport::flush_held(int world_rank) {
  auto& held = held_of(*p_, world_rank);
  for (const auto& e : held) {
    // The open of the last held call, from this rank's own descriptor of it (stable: written by
    // its enter); the rest travel as fingerprints. Its mirrors' descriptor is free: entering the
    // call waited for what wait_mirror_free waits for (shared_memory.hpp: Eager broadcast).
    const Slot& own = e.g->slots[static_cast<std::size_t>(e.member)];
    const Descriptor& d = own.desc[e.last % kDescriptors];
    send_open_message(*e.g, e.member, e.last, own.fps[e.last % (2 * kDescriptors)], d.header,
                      std::span<const std::byte>(d.data, d.eager ? d.step0.bytes : 0), e.first);
  }
  held.clear();
}

void MpiTransport::wait_mirror_free(CallState& c) {
  // Our open rewrites the mirrors of our descriptor c.seq % kDescriptors in the other processes,
  // as enter() rewrites it here, so it leaves on the same condition: every member entered
  // #seq + 1 - kDescriptors (shared_memory.hpp: Eager broadcast). A call after one that met every
  // member has it already.
  const Group& g = c.comm->group();
  if (g.slots[static_cast<std::size_t>(c.rank)].unmet_first == 0 || c.seq + 1 < kDescriptors)
    return;
  const std::uint64_t target = stage_value(c.seq + 1 - kDescriptors, step_stage(0));
  auto entered = [&](int r) {
    // seq_cst: as wait_stage's load (pairs with apply's store).
    return g.slots[static_cast<std::size_t>(r)].progress.load(std::memory_order_seq_cst) >= target;
  };
  if (pump_until([&] {
        for (int r = 0; r < c.size; ++r)
          if (remote(*c.comm, r) && !entered(r)) return false;
        return true;
      }))
    return;
  c.op.stage = "every member to enter";
  for (int r = 0; r < c.size; ++r)
    if (remote(*c.comm, r))
      wait_until(c.comm->self(), g.world_ranks[static_cast<std::size_t>(r)], c.op,
                 [&] { return entered(r); });
}

bool MpiTransport::open_rooted(CallState& c, const Fingerprint& fp, const CallHeader& header,
                               std::span<const std::byte> step0) {
  // The eager form as within one process: the root's open message carries the payload to every
  // other process's mirror of its slot (and its fingerprint to the mirror's Slot::fps ring, which
  // settling reads), so the root meets nobody and a receiver waits for the root alone.
  if (fp.count * dtype_size(fp.dtype) > kEagerBytes || fp.root < 0 || fp.root >= c.size) {
    open(c, fp, header, step0);
    return true;
  }
  Group& g = c.comm->group();
  if (c.rank == fp.root || g.other_processes.empty()) {
    wait_mirror_free(c);
    send_open(c, fp, header, step0);
    return SharedMemoryTransport::open_rooted(c, fp, header, step0);
  }
  // A receiver sends nothing now (hold): it checks the root's fingerprint of the call here, before
  // it enters, so a mismatch never waits for members whose opens are held back.
  const int self = c.comm->world_rank(c.rank);
  if (remote(*c.comm, fp.root) &&
      !pump_until([&] { return mirror_reached(c, fp.root, step_stage(0)); }))
    flush_held(self);  // parking: whoever waits for this rank's progress gets it first
  wait_stage(c, fp.root, step_stage(0));
  // The root's open (or, when it held this call as a receiver itself, its later open) wrote its
  // fingerprint of the call before publishing the progress wait_stage saw.
  const Fingerprint& theirs =
      g.slots[static_cast<std::size_t>(fp.root)].fps[c.seq % (2 * kDescriptors)];
  if (!(theirs == fp))
    raise(c.comm->self(),
          CollectiveMismatch("collective #" + std::to_string(c.seq) + " on group " +
                             c.comm->name() + ": rank " + std::to_string(c.rank) + " called " +
                             describe(fp) + " while rank " + std::to_string(fp.root) +
                             ", the root it names, called " + describe(theirs)));
  const bool met = SharedMemoryTransport::open_rooted(c, fp, header, step0);
  hold(c);
  return met;
}

void MpiTransport::settle(RankState& self) {
  // The held opens first: the members' settling waits for this rank's progress.
  flush_held(self.rank);
  SharedMemoryTransport::settle(self);
}

void MpiTransport::open(CallState& c, const Fingerprint& fp, const CallHeader& header,
                        std::span<const std::byte> step0) {
  wait_mirror_free(c);
  send_open(c, fp, header, step0);
  if (!c.comm->group().other_processes.empty())
    pump_until([&] { return mirrors_reached(c, step_stage(0)); });
  SharedMemoryTransport::open(c, fp, header, step0);
}

void MpiTransport::post(CallState& c, int step, std::span<const std::byte> data) {
  SharedMemoryTransport::post(c, step, data);
  notify(c, kPost, step, data.size());
}

void MpiTransport::post(CallState& c, int step, Pieces pieces) {
  if (pieces.size() == 1) return post(c, step, pieces[0]);
  SharedMemoryTransport::post(c, step, pieces);
  std::uint64_t bytes = 0;
  for (const auto& p : pieces) bytes += p.size();
  notify(c, kPost, step, bytes);
}

bool MpiTransport::start_fetch(CallState& c, int from, int step, std::size_t offset,
                               std::size_t stride, std::size_t row_bytes, std::size_t rows,
                               std::byte* dst, std::size_t dst_stride, Fetch& f) {
  Group& g = c.comm->group();
  // Step 0 was mirrored at the meet. A later step's read may leave before its post is mirrored
  // here (the descriptor is apply's to write until then): its owner's process holds it until the
  // owner posts (serve_read), and the range is checked once the post is here (check_read_range).
  if (step == 0 || mirror_reached(c, from, step_stage(step))) {
    check_read_range(c, from, step, offset, offset + (rows - 1) * stride + row_bytes);
    const Descriptor& d = g.slots[static_cast<std::size_t>(from)].desc[c.seq % kDescriptors];
    if (step == 0 && d.eager) {  // came with the open
      for (std::size_t i = 0; i < rows; ++i)
        std::memcpy(dst + i * dst_stride, d.data + offset + i * stride, row_bytes);
      return false;
    }
  }
  checked_int(row_bytes, "a row read from another process");
  checked_int(rows, "rows read from another process");
  f.dst = dst;
  f.rows = rows;
  f.row_bytes = row_bytes;
  f.dst_stride = dst_stride;
  request_read(c, from, step, offset, stride, row_bytes, rows, false, f);
  return true;
}

void MpiTransport::start_address_fetch(CallState& c, int from, int step, std::size_t offset,
                                       std::size_t bytes, std::byte* reply, Fetch& f) {
  checked_int(bytes, "a range read from another process");
  f.dst = reply;
  f.rows = 1;
  f.row_bytes = sizeof(AddressReply);
  f.dst_stride = sizeof(AddressReply);
  request_read(c, from, step, offset, bytes, bytes, 1, true, f);
}

void MpiTransport::request_read(CallState& c, int from, int step, std::size_t offset,
                                std::size_t stride, std::size_t row_bytes, std::size_t rows,
                                bool address_only, Fetch& f) {
  Group& g = c.comm->group();
  const int owner_world = g.world_ranks[static_cast<std::size_t>(from)];
  const int reader_world = c.comm->world_rank(c.rank);
  f.source = w_.process_of(owner_world);
  f.tag = reply_tag(p_->run(), reader_world, from);
  f.waiter = &c.comm->self();
  f.state.store(Fetch::kPending, std::memory_order_relaxed);  // not shared yet
  WireHead h;
  h.type = kRead;
  h.generation = p_->run();
  h.group = g.wire_id;
  h.seq = c.seq;
  h.member = from;
  h.step = step;
  ReadBody b;
  b.offset = offset;
  b.stride = stride;
  b.row_bytes = row_bytes;
  b.rows = rows;
  b.reader = reader_world;
  b.tag = f.tag;
  b.address_only = address_only ? 1 : 0;
  f.request = encode(h, b, {});
  Progress::Command cmd;
  cmd.kind = Progress::Command::kFetch;
  cmd.fetch = &f;
  p_->push(std::move(cmd), true);
}

void MpiTransport::check_read_range(const CallState& c, int from, int step, std::size_t offset,
                                    std::size_t end) const {
  const Descriptor& d =
      c.comm->group().slots[static_cast<std::size_t>(from)].desc[c.seq % kDescriptors];
  const std::uint64_t bytes = d.step(step).bytes;
  if (end > bytes)
    throw std::logic_error("rank " + std::to_string(c.comm->world_rank(c.rank)) + ": " + c.op.what +
                           " #" + std::to_string(c.seq) + " reads bytes [" +
                           std::to_string(offset) + ", " + std::to_string(end) + ") of member " +
                           std::to_string(from) + "'s step " + std::to_string(step) +
                           " message of " + std::to_string(bytes) + " bytes");
}

void MpiTransport::wait_fetch(CallState& c, int from, Fetch& f) {
  c.op.stage = "a member's data from another process";
  lower_reading_flag(c.comm->self());
  // seq_cst: pairs with the progress thread's store of `state` (Fetch::state).
  if (pump_until([&] { return f.state.load(std::memory_order_seq_cst) != Fetch::kPending; }))
    return;
  try {
    // seq_cst: pairs with the progress thread's store of `state` (Fetch::state).
    wait_until(c.comm->self(), c.comm->world_rank(from), c.op,
               [&] { return f.state.load(std::memory_order_seq_cst) != Fetch::kPending; });
  } catch (...) {
    cancel_fetch(f);  // unwinding: the receive into dst must end before dst may be freed
    throw;
  }
}

void MpiTransport::cancel_fetch(Fetch& f) {
  // seq_cst: pairs with the progress thread's store of `state` (Fetch::state).
  if (f.state.load(std::memory_order_seq_cst) != Fetch::kPending) return;
  Progress::Command cmd;
  cmd.kind = Progress::Command::kCancel;
  cmd.fetch = &f;
  p_->push(std::move(cmd));
  // seq_cst: as above. A cancelled receive completes promptly (MPI_Cancel is local).
  while (f.state.load(std::memory_order_seq_cst) == Fetch::kPending) std::this_thread::yield();
}

void MpiTransport::recv_each(CallState& c, int step, std::span<const BlockRead> reads) {
  if (c.comm->group().other_processes.empty()) return Transport::recv_each(c, step, reads);
  if (reads.size() > static_cast<std::size_t>(kMaxRanks))
    throw std::logic_error("recv_each of " + std::to_string(reads.size()) + " reads, more than " +
                           std::to_string(kMaxRanks));
  // Every read of another process's message in flight together, before their owners' posts are
  // mirrored here (each owner's process answers once its owner posted: the post's notice and the
  // read cross instead of following each other); then the local copies while they travel, and
  // the waits.
  // Blocks of processes of this node are copied in place (FetchSet). Measured with
  // mpi_runtime_bench, in place against over MPI alternated in one session, nothing else running
  // (2 cores): 4 MiB all_gather at P = 8, 25.0 against 27.6 ms per call (medians of 6 rounds), at
  // P = 4, 5.95 against 6.8 ms (3 rounds); a 4 MiB all_reduce (whose all-gather step this is)
  // 5-10% faster at P = 4, no different at P = 8 (its rounds spread 6.6-9.9 ms on both). On a
  // machine loaded by other tenants (load 28-32) in place measured slower at P = 8 (126-186 against
  // 83-96 ms): each owner must be scheduled to answer where its block lies.
  FetchSet fetches(*this, c, step, reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const BlockRead& r = reads[i];
    if (remote(*c.comm, r.from) && r.bytes > 0) fetches.start(i, r.from, r.offset, r.bytes, r.dst);
  }
  for (const BlockRead& r : reads)
    if (!remote(*c.comm, r.from))
      SharedMemoryTransport::recv(c, r.from, step, r.offset, {r.dst, r.bytes});
  for (std::size_t i = 0; i < reads.size(); ++i) fetches.wait(i);
  // A remote read of no bytes started nothing: its owner's post is still waited for.
  if (step > 0)
    for (const BlockRead& r : reads)
      if (remote(*c.comm, r.from) && r.bytes == 0) wait_stage(c, r.from, step_stage(step));
}

void MpiTransport::recv(CallState& c, int from, int step, std::size_t offset,
                        std::span<std::byte> dst) {
  if (!remote(*c.comm, from)) return SharedMemoryTransport::recv(c, from, step, offset, dst);
  // A small step 0 came with its owner's open into the mirror, which is a mailbox like a local
  // member's (apply): the shared-memory read takes it (an eager broadcast's receiver, every call).
  // Through recv_rows' general path (range check, rows, a Fetch) it cost twice the instructions.
  // A range past it goes on to recv_rows, which reports it.
  if (step == 0) {
    const Descriptor& d =
        c.comm->group().slots[static_cast<std::size_t>(from)].desc[c.seq % kDescriptors];
    if (d.eager && offset + dst.size() <= d.step0.bytes)
      return SharedMemoryTransport::recv(c, from, step, offset, dst);
  }
  recv_rows(c, from, step, offset, dst.size(), dst.size(), 1, dst.data(), dst.size());
}

void MpiTransport::recv_rows(CallState& c, int from, int step, std::size_t offset,
                             std::size_t stride, std::size_t row_bytes, std::size_t rows,
                             std::byte* dst, std::size_t dst_stride) {
  if (!remote(*c.comm, from))
    return SharedMemoryTransport::recv_rows(c, from, step, offset, stride, row_bytes, rows, dst,
                                            dst_stride);
  if (step > 0) {
    pump_until([&] { return mirror_reached(c, from, step_stage(step)); });
    wait_stage(c, from, step_stage(step));
  }
  if (rows == 0 || row_bytes == 0) return;
  Fetch f;
  if (start_fetch(c, from, step, offset, stride, row_bytes, rows, dst, dst_stride, f))
    wait_fetch(c, from, f);
}

void MpiTransport::recv_reduce(CallState& c, int step, std::size_t offset, std::size_t count,
                               Dtype dtype, std::byte* acc) {
  if (c.comm->group().other_processes.empty())
    return SharedMemoryTransport::recv_reduce(c, step, offset, count, dtype, acc);
  const int n = c.size;
  const std::size_t es = dtype_size(dtype);
  const std::size_t bytes = count * es;
  if (bytes == 0) {
    if (step > 0) {
      pump_until([&] { return mirrors_reached(c, step_stage(step)); });
      for (int i = 1; i < n; ++i) wait_stage(c, (c.rank + i) % n, step_stage(step));
    }
    return;
  }
  if (step == 0 && bytes <= kEagerBytes) {
    // A small step 0 came with the opens, in the mirrors' mailboxes, unless a member's was larger:
    // summed from there as one process sums its members' mailboxes (no set of reads, no copy).
    bool with_opens = true;
    const Group& g = c.comm->group();
    for (int r = 0; with_opens && r < n; ++r)
      with_opens = !remote(*c.comm, r) ||
                   g.slots[static_cast<std::size_t>(r)].desc[c.seq % kDescriptors].eager;
    if (with_opens) return sum_members(c, 0, offset, count, dtype, acc, nullptr);
  }
  // The range in chunks, kWindow chunks' reads in flight: a chunk's ranges of members in other
  // processes are copied to scratch by reads in flight together (leaving before their owners'
  // posts are mirrored here, as in recv_each), and each chunk is summed once its copies are in,
  // while the next one travels, so the sum reads them still in cache. The shared-memory sum reads
  // the local members' ranges in place (no copy) and the copies, in group-rank order: the same
  // sum_ranks_into as one process, so the result is bitwise the same. Measured (all_reduce 4 MiB,
  // mpi_runtime_bench, P = 8 on 2 cores, same-run ratio to OpenMPI, builds or chunk sizes
  // alternated, load 12-28): 64 KiB chunks 1.29 / 1.24 / 1.40, 128 KiB 1.56 / 1.59 / 1.35, 32 KiB
  // 1.36 / 1.55 / 1.37; a window of 16 chunks 1.86 / 2.44 against 1.32 / 1.48 with 2.
  constexpr std::size_t kChunk = std::size_t{64} << 10;
  constexpr std::size_t kWindow = 2;
  const std::size_t chunk = std::max(es, std::min(bytes, kChunk) / es * es);
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  const std::size_t window = std::min(chunks, kWindow);
  std::size_t remotes = 0;
  for (int r = 0; r < n; ++r) remotes += remote(*c.comm, r) ? 1 : 0;
  thread_local std::vector<std::byte> scratch;
  if (scratch.size() < window * remotes * chunk) scratch.resize(window * remotes * chunk);
  // A range past a message fails before any chunk is summed into acc (start_fetch checks a single
  // chunk's; a later step's, whose post may not be here yet, fails at its chunk's wait).
  for (int r = 0; step == 0 && chunks > 1 && r < n; ++r)
    if (remote(*c.comm, r)) check_read_range(c, r, 0, offset, offset + bytes);
  // Chunk k's copy of the j-th member in another process: scratch slot (k % window) * remotes + j,
  // read (k % window) * n + r of the set.
  const std::byte* copied[kMaxRanks];
  FetchSet fetches(*this, c, step, window * static_cast<std::size_t>(n));
  const auto start = [&](std::size_t k) {
    const std::size_t w = k % window, begin = k * chunk;
    std::byte* to = scratch.data() + w * remotes * chunk;
    for (int r = 0; r < n; ++r) {
      if (!remote(*c.comm, r)) continue;
      fetches.start(w * static_cast<std::size_t>(n) + static_cast<std::size_t>(r), r,
                    offset + begin, std::min(chunk, bytes - begin), to);
      to += chunk;
    }
  };
  for (std::size_t k = 0; k < window; ++k) start(k);
  // The local members' posts, while the first chunks travel (sum_members reads their buffers).
  for (int i = 1; step > 0 && i < n; ++i)
    if (!remote(*c.comm, (c.rank + i) % n)) wait_stage(c, (c.rank + i) % n, step_stage(step));
  for (std::size_t k = 0; k < chunks; ++k) {
    const std::size_t w = k % window, begin = k * chunk;
    const std::byte* from = scratch.data() + w * remotes * chunk;
    for (int r = 0; r < n; ++r) {
      copied[r] = nullptr;
      if (!remote(*c.comm, r)) continue;
      fetches.wait(w * static_cast<std::size_t>(n) + static_cast<std::size_t>(r));
      copied[r] = from;
      from += chunk;
    }
    // The waits lowered the reading flag sum_members raises for the in-place reads: it is never
    // up during one.
    sum_members(c, step, offset + begin, std::min(chunk, bytes - begin) / es, dtype, acc + begin,
                copied);
    if (k + window < chunks) start(k + window);  // into the slots just summed
  }
}

void MpiTransport::finish(CallState& c) {
  Group& g = c.comm->group();
  // An eager broadcast (open_rooted) exposes nothing and publishes no done.
  if (!g.other_processes.empty() && g.slots[static_cast<std::size_t>(c.rank)].unawaited != c.seq) {
    // Every read of ours has completed (each waited for its reply). Done goes only to processes
    // whose members exposed a buffer in this call: the others wait for nobody's done. A post that
    // exposes one and arrives after the check below is answered by owe_done. seq_cst store of our
    // progress (finish stores the same value again), then seq_cst loads of the mirrors': the
    // handshake with apply's store then owe_done's load.
    g.slots[static_cast<std::size_t>(c.rank)].progress.store(stage_value(c.seq, kDoneStage),
                                                             std::memory_order_seq_cst);
    for (int q : g.other_processes) {
      bool exposed = false;
      for (int r = 0; r < c.size && !exposed; ++r) {
        if (w_.process_of(g.world_ranks[static_cast<std::size_t>(r)]) != q) continue;
        const Slot& s = g.slots[static_cast<std::size_t>(r)];
        // Only the steps the mirror shows posted are read (the rest apply may be writing); a
        // member done with the call posted all it will (steps never posted read as empty). Done
        // says it finished reading, not that it stopped waiting for ours.
        const std::uint64_t reached = s.progress.load(std::memory_order_seq_cst);
        const Descriptor& d = s.desc[c.seq % kDescriptors];
        for (int step = 0; step < kMaxSteps && !exposed; ++step) {
          if (reached < stage_value(c.seq, step_stage(step))) break;
          exposed = step == 0 ? !d.eager : d.step(step).bytes > 0;
        }
      }
      if (!exposed) continue;
      WireHead h;
      h.type = kDone;
      h.generation = p_->run();
      h.group = g.wire_id;
      h.seq = c.seq;
      h.member = c.rank;
      std::vector<std::byte> m(sizeof h);
      std::memcpy(m.data(), &h, sizeof h);
      p_->send_to(q, std::move(m), true);
    }
    if (c.exposed) pump_until([&] { return mirrors_reached(c, kDoneStage); });
  }
  SharedMemoryTransport::finish(c);
}

void MpiTransport::abandon(CallState& c) noexcept {
  SharedMemoryTransport::abandon(c);
  if (!c.exposed || c.finished || c.comm->group().other_processes.empty()) return;
  // Replies already leaving from our buffers: wait for them (bounded: a reply whose reader
  // cancelled its receive may never complete; the run is failing, and the buffers stay mapped).
  const int me = c.comm->world_rank(c.rank);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  // seq_cst: pairs with the progress thread's seq_cst updates of serving.
  while (p_->serving[static_cast<std::size_t>(me)].load(std::memory_order_seq_cst) > 0 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
}

bool MpiTransport::send(Comm& comm, int dst, std::uint64_t index, const MessageHeader& header,
                        std::span<const std::byte> data, const OpRef& op) {
  if (!remote(comm, dst)) return SharedMemoryTransport::send(comm, dst, index, header, data, op);
  WireHead h;
  h.type = kMessage;
  h.generation = p_->run();
  h.group = comm.group().wire_id;
  h.member = comm.rank();
  MessageBody b;
  b.dst = dst;
  b.index = index;
  b.header = header;
  checked_int(sizeof h + sizeof b + data.size(), "a message to another process");
  const int process = w_.process_of(comm.world_rank(dst));
  // relaxed: see Progress::messages_to.
  p_->messages_to[static_cast<std::size_t>(process)].fetch_add(1, std::memory_order_relaxed);
  p_->send_to(process, encode(h, b, data), true);
  return true;  // copied: complete at once
}

void MpiTransport::wait_sent(Comm& comm, int dst, std::uint64_t index, const OpRef& op) {
  if (!remote(comm, dst)) SharedMemoryTransport::wait_sent(comm, dst, index, op);
}

bool MpiTransport::withdraw_send(Comm& comm, int dst, std::uint64_t index) noexcept {
  if (!remote(comm, dst)) return SharedMemoryTransport::withdraw_send(comm, dst, index);
  return true;  // copied at send: it will arrive
}

bool MpiTransport::arrived(const Comm& comm, int src, std::uint64_t index) const {
  if (!remote(comm, src)) return SharedMemoryTransport::arrived(comm, src, index);
  std::lock_guard lock(p_->incoming_mu);
  return p_->incoming.count({comm.group().wire_id, src, comm.rank(), index}) != 0;
}

const MessageHeader& MpiTransport::wait_message(Comm& comm, int src, std::uint64_t index,
                                                const OpRef& op) {
  if (!remote(comm, src)) return SharedMemoryTransport::wait_message(comm, src, index, op);
  const Progress::MessageKey key{comm.group().wire_id, src, comm.rank(), index};
  Progress::Incoming* in = nullptr;
  if (!pump_until([&] {
        std::lock_guard lock(p_->incoming_mu);
        return p_->incoming.count(key) != 0;
      }))
    flush_held(comm.world_rank(comm.rank()));  // parking (see hold)
  wait_until(comm.self(), comm.world_rank(src), op, [&] {
    std::lock_guard lock(p_->incoming_mu);
    auto it = p_->incoming.find(key);
    in = it == p_->incoming.end() ? nullptr : it->second.get();
    return in != nullptr;
  });
  return in->header;  // stays until take() (only this rank takes it)
}

void MpiTransport::take(Comm& comm, int src, std::uint64_t index, std::span<std::byte> dst,
                        const OpRef& op) {
  if (!remote(comm, src)) return SharedMemoryTransport::take(comm, src, index, dst, op);
  std::lock_guard lock(p_->incoming_mu);
  auto it = p_->incoming.find({comm.group().wire_id, src, comm.rank(), index});
  if (it == p_->incoming.end())
    throw std::logic_error("take of message " + std::to_string(index) + " from rank " +
                           std::to_string(src) + " before it arrived");
  if (!dst.empty()) std::memcpy(dst.data(), it->second->payload.data(), dst.size());
  p_->incoming.erase(it);
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

namespace {

// Every process's `mine` (sizes may differ) into every process, in process order; the offset of
// each process's part in `offsets` (P + 1 entries).
std::vector<std::byte> gather_all(MpiTransport::Progress& p, int processes,
                                  std::vector<std::byte> mine, std::vector<std::size_t>& offsets) {
  using Command = MpiTransport::Progress::Command;
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(processes));
  const std::uint64_t my_size = mine.size();
  {
    std::atomic<int> done{0};
    Command c;
    c.kind = Command::kGather;
    c.bytes.resize(sizeof my_size);
    std::memcpy(c.bytes.data(), &my_size, sizeof my_size);
    c.gathered = reinterpret_cast<std::byte*>(sizes.data());
    c.flag = &done;
    p.push(std::move(c));
    // acquire: pairs with the progress thread's release store when the gather completes.
    done.wait(0, std::memory_order_acquire);
  }
  offsets.assign(1, 0);
  Command c;
  c.kind = Command::kGatherv;
  for (std::uint64_t n : sizes) {
    c.counts.push_back(checked_int(n, "one process's part of a gather"));
    c.displs.push_back(checked_int(offsets.back(), "a gather"));
    offsets.push_back(offsets.back() + n);
  }
  std::vector<std::byte> all(offsets.back());
  std::atomic<int> done{0};
  c.bytes = std::move(mine);
  c.gathered = all.data();
  c.flag = &done;
  p.push(std::move(c));
  // acquire: as above.
  done.wait(0, std::memory_order_acquire);
  return all;
}

template <class T>
void put(std::vector<std::byte>& out, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <class T>
T get(const std::byte*& at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  at += sizeof v;
  return v;
}

// A trace event as sent: its name and group as indices into the sender's string table.
struct WireEvent {
  TraceEvent event;  // name and group_id not meaningful here
  std::uint32_t name = 0, group = 0;
};

// What every process learns of each rank hosted elsewhere at the end of a run.
struct RankSummary {
  TrafficCounters counters;
  SimStreams::Snapshot sim;
};
static_assert(std::is_trivially_copyable_v<RankSummary>, "RankSummary travels as raw bytes");

}  // namespace

void MpiTransport::share_traces() {
  // This process's events, whole (a receiver replaces a rank's copy, so Trace::clear() needs no
  // bookkeeping): [start_ns][names: count, then (length, bytes) each][per local rank: events,
  // dropped, WireEvent each].
  std::vector<std::string> names;
  std::map<std::string, std::uint32_t> index;
  auto name_of = [&](const std::string& n) {
    auto [it, made] = index.emplace(n, static_cast<std::uint32_t>(names.size()));
    if (made) names.push_back(n);
    return it->second;
  };
  std::vector<std::byte> events;
  {
    std::lock_guard lock(w_.groups_mu);  // group_names
    for (int r = w_.first_local; r < w_.first_local + w_.local_ranks; ++r) {
      const RankTrace& t = *w_.ranks[static_cast<std::size_t>(r)]->trace;
      put(events, static_cast<std::uint64_t>(t.events().size()));
      put(events, t.dropped());
      for (const TraceEvent& e : t.events()) {
        WireEvent we{e, name_of(e.name), 0};
        auto g = w_.group_names.find(e.group_id);
        we.group = name_of(g != w_.group_names.end() ? g->second : "group ?");
        we.event.name = nullptr;
        put(events, we);
      }
    }
  }
  std::vector<std::byte> mine;
  put(mine, p_->run_start_ns);
  put(mine, static_cast<std::uint64_t>(names.size()));
  for (const std::string& n : names) {
    put(mine, static_cast<std::uint64_t>(n.size()));
    const auto at = mine.size();
    mine.resize(at + n.size());
    std::memcpy(mine.data() + at, n.data(), n.size());
  }
  mine.insert(mine.end(), events.begin(), events.end());
  std::vector<std::size_t> offsets;
  const std::vector<std::byte> all = gather_all(*p_, w_.processes, std::move(mine), offsets);

  std::lock_guard lock(w_.groups_mu);
  for (int q = 0; q < w_.processes; ++q) {
    if (q == p_->process) continue;
    const std::byte* at = all.data() + offsets[static_cast<std::size_t>(q)];
    // Their clock started elsewhere: aligned at the run's opening barrier, which every process
    // leaves within a poll of the others (microseconds on one machine).
    const std::int64_t shift = p_->run_start_ns - get<std::int64_t>(at);
    std::vector<const char*> text;
    std::vector<std::uint64_t> group;
    const auto n_names = get<std::uint64_t>(at);
    for (std::uint64_t i = 0; i < n_names; ++i) {
      const auto len = get<std::uint64_t>(at);
      std::string n(reinterpret_cast<const char*>(at), len);
      at += len;
      // The same group has the same name in every process; its id here (ids are per process).
      std::uint64_t id = 0;
      auto g = std::find_if(w_.group_names.begin(), w_.group_names.end(),
                            [&](const auto& e) { return e.second == n; });
      if (g != w_.group_names.end()) {
        id = g->first;
      } else if (n.rfind("group ", 0) != 0) {
        id = w_.next_group_id++;
        w_.group_names[id] = n;
      }
      group.push_back(id);
      text.push_back(p_->trace_names.insert(std::move(n)).first->c_str());
    }
    for (int r = q * w_.local_ranks; r < (q + 1) * w_.local_ranks; ++r) {
      RankTrace& t = *w_.ranks[static_cast<std::size_t>(r)]->trace;
      t.clear();
      const auto count = get<std::uint64_t>(at);
      const auto dropped = get<std::uint64_t>(at);
      TraceEvent last;
      for (std::uint64_t i = 0; i < count; ++i) {
        const auto we = get<WireEvent>(at);
        last = we.event;
        last.name = text[we.name];
        last.group_id = group[we.group];
        last.begin_ns += shift;
        last.end_ns += shift;
        t.record(last);
      }
      // The sender's buffer was full (the same capacity as this one): each record now only
      // counts one more dropped event, as it did there.
      for (std::uint64_t i = 0; i < dropped; ++i) t.record(last);
    }
  }
}

void MpiTransport::end_run() {
  // Every rank's counters and simulated clock, and how many point-to-point messages went to each
  // process, to every process: World::counters(r) and simulated_seconds(r) then hold for every
  // rank in every process, and the next run starts every process's simulated clock at the same
  // latest time.
  const std::size_t local = static_cast<std::size_t>(w_.local_ranks);
  const std::size_t P = static_cast<std::size_t>(w_.processes);
  const std::size_t block = local * sizeof(RankSummary) + P * sizeof(std::uint64_t);
  std::vector<std::byte> mine(block);
  for (std::size_t i = 0; i < local; ++i) {
    const RankState& r = *w_.ranks[static_cast<std::size_t>(w_.first_local) + i];
    const RankSummary s{r.counters, r.sim.snapshot()};
    std::memcpy(mine.data() + i * sizeof s, &s, sizeof s);
  }
  for (std::size_t q = 0; q < P; ++q) {
    // relaxed: see Progress::messages_to.
    const std::uint64_t n = p_->messages_to[q].load(std::memory_order_relaxed);
    std::memcpy(mine.data() + local * sizeof(RankSummary) + q * sizeof n, &n, sizeof n);
  }
  std::vector<std::byte> all(P * block);
  {
    std::atomic<int> gathered{0};
    Progress::Command gather;
    gather.kind = Progress::Command::kGather;
    gather.bytes = std::move(mine);
    gather.gathered = all.data();
    gather.flag = &gathered;
    p_->push(std::move(gather));
    // acquire: pairs with the progress thread's release store when the gather completes.
    gathered.wait(0, std::memory_order_acquire);
  }
  for (std::size_t r = 0; r < w_.ranks.size(); ++r) {
    if (w_.hosts(static_cast<int>(r))) continue;
    const std::size_t q = static_cast<std::size_t>(w_.process_of(static_cast<int>(r)));
    RankSummary s;
    std::memcpy(&s, all.data() + q * block + (r - q * local) * sizeof s, sizeof s);
    w_.ranks[r]->counters = s.counters;
    w_.ranks[r]->sim.restore(s.sim);
  }
  auto failed_here = [&] {
    std::lock_guard lock(w_.failure_mu);
    return w_.failed_rank >= 0;
  };
  if (!failed_here()) check_messages_taken(all, block);
  if (w_.opts.trace) share_traces();
  int failed = failed_here() ? 1 : 0;
  {
    std::atomic<int> agreed{0};
    Progress::Command agree;
    agree.kind = Progress::Command::kAgree;
    agree.flag = &agreed;
    agree.value = &failed;
    p_->push(std::move(agree));
    // acquire: pairs with the progress thread's release store when the all-reduce completes.
    agreed.wait(0, std::memory_order_acquire);
  }
  if (failed == 0) return;
  // Some process failed: its abort message is on its way (sent before that process's ranks
  // returned). Wait for it, bounded, so this process reports the same first failure.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    if (failed_here()) return;
    if (std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  w_.fail(-1, "another process failed, and its failure did not arrive within 10 s of the run's end",
          std::make_exception_ptr(PeerFailure("another process failed")), true);
}

void MpiTransport::check_messages_taken(const std::vector<std::byte>& summaries,
                                        std::size_t block) {
  // Every message another process's ranks sent here has arrived (bounded: a sender's process is
  // past its run, so its messages are on the wire), then none may be left untaken: a message
  // nobody received is a schedule bug, reported as World::run reports one within a process.
  const std::size_t local = static_cast<std::size_t>(w_.local_ranks);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int q = 0; q < w_.processes; ++q) {
    std::uint64_t expected = 0;
    std::memcpy(&expected,
                summaries.data() + static_cast<std::size_t>(q) * block +
                    local * sizeof(RankSummary) +
                    static_cast<std::size_t>(p_->process) * sizeof expected,
                sizeof expected);
    // acquire: pairs with the progress thread's release increment (Progress::messages_from).
    while (p_->messages_from[static_cast<std::size_t>(q)].load(std::memory_order_acquire) <
           expected) {
      if (std::chrono::steady_clock::now() > until) {
        const Error error("process " + std::to_string(q) + " sent " + std::to_string(expected) +
                          " messages to process " + std::to_string(p_->process) +
                          "'s ranks in this run, and not all of them arrived within 10 s of its "
                          "end");
        w_.fail(q * w_.local_ranks, error.what(), std::make_exception_ptr(error));
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  std::lock_guard lock(p_->incoming_mu);
  if (p_->incoming.empty()) return;
  const auto& [key, message] = *p_->incoming.begin();
  const auto& [group_id, src, dst, index] = key;
  std::lock_guard groups_lock(p_->groups_mu);
  const auto g = p_->groups.find(group_id);
  std::ostringstream m;
  int sender = -1;
  if (g != p_->groups.end()) {
    const Group& group = *g->second;
    sender = group.world_ranks[static_cast<std::size_t>(src)];
    m << "unreceived message: rank " << sender << " sent message #" << index + 1 << " ("
      << message->payload.size() << " B) to rank "
      << group.world_ranks[static_cast<std::size_t>(dst)] << " on group " << group.name
      << ", which rank " << group.world_ranks[static_cast<std::size_t>(dst)]
      << " never received before the run ended";
  } else {
    m << "unreceived message: message #" << index + 1 << " from group rank " << src
      << " to group rank " << dst << " of a group no rank of process " << p_->process
      << " joined, never received before the run ended";
  }
  const CollectiveMismatch error(m.str());
  w_.fail(sender, error.what(), std::make_exception_ptr(error));
}

void MpiTransport::local_failure(int rank, const std::string& message,
                                 const std::exception_ptr& error) noexcept {
  if (w_.processes == 1) return;
  try {
    AbortBody b;
    b.rank = rank;
    try {
      std::rethrow_exception(error);
    } catch (const CollectiveMismatch&) {
      b.kind = kMismatch;
    } catch (const PeerFailure&) {
      b.kind = kPeer;
    } catch (const HangError&) {
      b.kind = kHang;
    } catch (const OutOfMemory&) {
      b.kind = kOom;
    } catch (...) {
      b.kind = kOther;
    }
    WireHead h;
    h.type = kAbort;
    h.generation = p_->run();
    const auto text = std::as_bytes(std::span<const char>(message.data(), message.size()));
    auto m = encode(h, b, text);
    for (int q = 0; q < w_.processes; ++q)
      if (q != p_->process) p_->send_to(q, m);
  } catch (...) {
    // Out of memory while reporting: the other processes see the hang timeout instead.
  }
}

}  // namespace tspemu::detail
