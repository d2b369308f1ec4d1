// MpiTransport: the transport of a world spanning the processes of MPI_COMM_WORLD
// (WorldOptions::mpi; built only with MPI, TSPEMU_HAVE_MPI).
//
// What: the shared-memory transport (shared_memory.hpp) for members hosted by this process, and
// for members hosted by another process:
//   - mirrors: every process keeps each group's mailbox with one slot per member; a remote
//     member's slot is a mirror its process keeps current by messages — open (fingerprint, header,
//     step-0 size, and step 0 itself when it is at most kEagerBytes), post (a step's size) and
//     done. So the meet, the fingerprint check (call.hpp) and finish's wait for every member run
//     unchanged over mirrors, and every process reaches the same verdict on a mismatch of a call
//     that meets;
//   - pull: posts have no receiver, so a reader asks the owner's process for (group, call, step,
//     byte range, row layout); that process's poller sends the range straight from the owner's
//     posted buffer (no copy unless the message is made of pieces). The owner may not reuse the
//     buffer before finish, and finish waits for every member's done, which a reader sends only
//     after its reads completed, as the shared-memory transport waits for its readers. Done goes
//     only to processes whose members exposed a buffer (step 0 above kEagerBytes, or a later step
//     with bytes): a call whose messages all travelled with the open (every 8 B collective) has
//     no done round. A post that exposes a buffer after a reader already finished the call is
//     answered with that reader's done by the reader's process on arrival (Progress::owe_done);
//   - the eager broadcast (open_rooted, at most kEagerBytes) as within one process: the root's
//     open carries the payload and the fingerprint to every mirror of its slot and the root
//     returns; a receiver waits for the root's open alone, compares the root's fingerprint with
//     its own where it runs (CollectiveMismatch naming both calls), and sends nothing: it holds
//     its open back (hold) and sends the open of the last call it held, carrying the fingerprints
//     of the others, every kHeldOpens (31) calls, before its next open, before it parks in a wait
//     and at settle(). The mirrors thus learn every member's fingerprint of every call, late:
//     they are compared, as within one process, when a later call meets or at settle(). Held
//     back, a receiver's progress shows at most 30 calls late; a root waits for the progress of
//     the members kDescriptors - 1 calls back (below), so it does not wait for the hold. Measured
//     (mpi_runtime_bench, same run alternating with the every-member open, loaded machine): 8 B
//     broadcast 0.43 -> 0.31 us at P = 2, 6.0 -> 2.7 us at P = 4, 18 -> 7-9 us at P = 8; messages
//     per call in all P (P - 1) -> (P - 1)(1 + (P - 1) / kHeldOpens) (counted with 16: 56 -> 10.2
//     at P = 8; 31 makes it 8.6, computed). An open leaves only once the descriptor its mirrors
//     rewrite is free (every member entered #seq + 1 - kDescriptors), the rule enter() keeps
//     locally; a held open satisfies it when it leaves, since its call entered after that wait;
//   - point-to-point messages to another process are copied at send (complete at once) and kept
//     by the receiving process until taken, in per-pair order;
//   - recv_reduce goes through its range in chunks of 64 KiB: it copies a chunk's ranges of
//     members in other processes to scratch (their reads in flight together, the next chunk's
//     leaving before this one is summed), then sums them with the local members' ranges read in
//     place (no copy: SharedMemoryTransport::sum_members) in group-rank order with
//     sum_ranks_into, so results are bitwise those of a one-process world, and the sum reads
//     copies still in cache; recv_each (all_reduce's all-gather step, all_gather) has every read
//     of another process's message in flight together, not one round trip after another, and
//     copies the blocks of this node's processes in place as recv_reduce does. A read
//     of a step after 0 leaves without waiting for the owner's post to be mirrored: the owner's
//     process holds it until the owner posts, then answers (an empty reply when the range is
//     past the message; the reader checks the range against the post once it is mirrored).
// Threads: MPI is driven by whichever thread holds Progress::poll_mu. With one rank per process
// the rank thread itself executes its sends and, while it waits (meet, read, done, message),
// polls MPI: it takes in the control messages, serves peers' reads of its own buffers and
// completes its transfers, with the progress thread parked; after 500 us without traffic (20 ms
// at most) it hands over (one unpark) and parks in the usual wait, and the progress thread serves
// what must be served while the owner computes (reads, aborts, messages). Measured at 8 B, P = 2
// (bench/mpi_runtime_bench, same run): 100 us per call when every MPI call went through the
// progress thread (rank -> progress thread -> MPI -> remote progress thread -> remote rank: four
// hand-offs and a done round per call) against 0.75 us now (OpenMPI's own: 0.25 us). With several
// ranks per process the ranks execute their commands themselves when the mutex is free but park
// to wait, and the progress thread polls: an MPI completion cannot wake a parked thread, and one
// poller per process costs less than N ranks spinning on MPI's global lock on oversubscribed
// cores. A polling thread yields between idle polls when this node's processes outnumber its
// cores, as OpenMPI's own waits do then (mpi_yield_when_idle).
// Receiving: every control message of at most 2 KiB (open, post, done, read request: all of a
// group's, so they keep their order) lands in one of 16 receives posted in advance on its tag
// and taken in posting order (persistent: MPI_Start posts one again, no request made and freed
// per message); longer ones (a point-to-point payload, an abort's text) go on a
// second tag, probed on one poll in 8. Measured at 8 B all_reduce, P = 2: callgrind, 700 calls,
// instructions per call in the rank thread (polling while it waits included) 12.9k / 10.5k in
// the two processes with every message probed for (MPI_Improbe + MPI_Mrecv: ~1340 per message,
// matched as unexpected and copied twice) against 6.8k / 8.2k; 0.92 -> 0.74 us per call
// (mpi_runtime_bench, medians of 3 runs alternating the builds; OpenMPI's own 0.38 us).
// On one node whose processes fit its cores, control messages of at most 2 KiB go through
// shared-memory rings instead (mpi.cpp: ControlRing, map_control_rings), in the same order.
// Sending: a message to every other process hosting members (open, post) is built in a buffer
// the rank thread reuses and, with one rank per process, sent by it to each (Progress::isend_all):
// a send OpenMPI completes within MPI_Isend (a small one is copied out) keeps nothing, so nothing
// is allocated, tracked or tested later; only one still in flight keeps the buffer. Measured
// (callgrind, 8 B broadcast, 2800 calls): the root's sending of its open 3194 -> 2419 instructions
// per call at P = 4, 7253 -> 4840 at P = 8, against a shared copy kept for each send and completed
// by a later MPI_Testsome.
// Requirements: every process constructs its World with the same options and makes the same
// run() calls in the same order; P (MPI processes) divides ranks; one executable (messages are
// the in-memory layout of the structures: a homogeneous cluster); a World is destroyed before the
// program's own MPI_Finalize, if it calls one.
// Guarantees: those of transport.hpp. A failure raised in one process ends the run of every
// process with the same first failure (the first one this process learns of: two processes
// failing at once may each name their own). So a small broadcast's receiver that disagrees with
// its root is reported by the first process to see it (the receiver's), and the others fail with
// that same CollectiveMismatch carried by the abort; a disagreement no receiver sees against its
// root (two self-named roots) is found in every process when the fingerprints meet; a hang error in
// one process carries, in every process that receives it, that process's ranks' pending operations.
// A process killed outright is OpenMPI's to report: mpirun ends every process of the job. At the
// end of each run every process has every rank's counters and simulated clock, and (tracing) every
// rank's events with names and groups as text and times shifted to this process's clock at the
// run's opening barrier; a point-to-point message to this process's ranks never taken fails the run
// in every process (counted: the receiving process waits for every message sent to it, then
// checks). The communicator is freed with the world once every message sent on it has been taken in
// (drain). Cost: per call, per other process hosting members: one message at open (the fingerprint,
// the header and step 0 when at most kEagerBytes), one per post, one done if that process exposed a
// buffer; a read of another process's message is one request and one reply (a reduction's: one per
// 64 KiB chunk). So an 8 B collective is P - 1 messages per rank, and the fingerprint check adds no
// message to the all-reduce, all-gather or reduce-scatter: its 24 bytes ride in the open that
// carries the data.
// A small broadcast is P - 1 messages from the root, as OpenMPI's, plus each receiver's held open
// every 31 calls (P - 1 messages) with 24 bytes per run of held calls with one fingerprint (one
// run for a loop's broadcast, so the open stays within OpenMPI's 256-byte inline send). Per
// run: a barrier, an all-gather of every rank's counters, an all-reduce of the verdict, and with
// tracing an all-gather of every process's whole trace (all of it each run: a receiver replaces
// its copy).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "../state.hpp"
#include "shared_memory.hpp"

namespace tspemu::detail {

class MpiTransport final : public SharedMemoryTransport, public ProcessLink {
 public:
  // Initializes MPI if needed and sets the world's process layout (first_local, local_ranks,
  // processes). Throws std::invalid_argument when P does not divide opts.ranks.
  explicit MpiTransport(WorldShared& w);
  ~MpiTransport() override;

  void open(CallState& call, const Fingerprint& fp, const CallHeader& header,
            std::span<const std::byte> step0) override;
  bool open_rooted(CallState& call, const Fingerprint& fp, const CallHeader& header,
                   std::span<const std::byte> step0) override;
  void post(CallState& call, int step, Pieces pieces) override;
  void post(CallState& call, int step, std::span<const std::byte> data) override;
  void recv(CallState& call, int from, int step, std::size_t offset,
            std::span<std::byte> dst) override;
  void recv_each(CallState& call, int step, std::span<const BlockRead> reads) override;
  void recv_rows(CallState& call, int from, int step, std::size_t offset, std::size_t stride,
                 std::size_t row_bytes, std::size_t rows, std::byte* dst,
                 std::size_t dst_stride) override;
  void recv_reduce(CallState& call, int step, std::size_t offset, std::size_t count, Dtype dtype,
                   std::byte* acc) override;
  void settle(RankState& self) override;
  void finish(CallState& call) override;
  void abandon(CallState& call) noexcept override;

  bool send(Comm& comm, int dst, std::uint64_t index, const MessageHeader& header,
            std::span<const std::byte> data, const OpRef& op) override;
  void wait_sent(Comm& comm, int dst, std::uint64_t index, const OpRef& op) override;
  bool withdraw_send(Comm& comm, int dst, std::uint64_t index) noexcept override;
  bool arrived(const Comm& comm, int src, std::uint64_t index) const override;
  const MessageHeader& wait_message(Comm& comm, int src, std::uint64_t index,
                                    const OpRef& op) override;
  void take(Comm& comm, int src, std::uint64_t index, std::span<std::byte> dst,
            const OpRef& op) override;

  void add_group(Group& group) override;
  void start_run(std::uint32_t generation) override;
  void end_run() override;
  void local_failure(int rank, const std::string& message,
                     const std::exception_ptr& error) noexcept override;

  struct Fetch;     // one read of another process's message (mpi.cpp)
  struct FetchSet;  // reads of one verb in flight together (mpi.cpp)
  struct Progress;  // the progress thread and what it owns (mpi.cpp)

 private:
  bool remote(const Comm& comm, int member) const;
  // The processes of this node whose memory this one may read in place (Progress::direct_pid);
  // a node is named by its lowest world rank. Collective over the world.
  void find_direct_peers(int first_on_node);
  // Waits until the open of this call may rewrite the other processes' mirror of its descriptor.
  void wait_mirror_free(CallState& c);
  // The open message of the call to every other process hosting members, with the fingerprints of
  // the calls this rank held back before it.
  void send_open(const CallState& c, const Fingerprint& fp, const CallHeader& header,
                 std::span<const std::byte> step0);
  void send_open_message(const Group& g, int member, std::uint64_t seq, const Fingerprint& fp,
                         const CallHeader& header, std::span<const std::byte> step0,
                         std::uint64_t first_held);
  // A receiver of an eager broadcast holds its open back; every kHeldOpens calls, before it parks
  // and at settle() it sends the open of the last one held (flush_held), carrying them all.
  void hold(CallState& c);
  void flush_held(int world_rank);
  // One rank per process: polls MPI on this thread until ready() or a short budget passes
  // (then the progress thread takes over and the caller parks in its usual wait). Whether ready.
  template <class Ready>
  bool pump_until(Ready&& ready);
  // Whether every member in another process (or `member`) reached `stage` of the call.
  bool mirrors_reached(const CallState& c, std::uint64_t stage) const;
  bool mirror_reached(const CallState& c, int member, std::uint64_t stage) const;
  // Starts reading rows of member `from`'s step message into dst; false when it was read already
  // (from the mirror's copy of a small step 0).
  bool start_fetch(CallState& c, int from, int step, std::size_t offset, std::size_t stride,
                   std::size_t row_bytes, std::size_t rows, std::byte* dst, std::size_t dst_stride,
                   Fetch& fetch);
  // Starts asking where member `from`'s step message lies, to read bytes [offset, offset + bytes)
  // of it in place; the answer (an AddressReply, mpi.cpp) lands in `reply`.
  void start_address_fetch(CallState& c, int from, int step, std::size_t offset, std::size_t bytes,
                           std::byte* reply, Fetch& fetch);
  // Sends the request of a read whose destination `fetch` names, its reply's receive first.
  void request_read(CallState& c, int from, int step, std::size_t offset, std::size_t stride,
                    std::size_t row_bytes, std::size_t rows, bool address_only, Fetch& fetch);
  void wait_fetch(CallState& c, int from, Fetch& fetch);
  // Throws std::logic_error when bytes [offset, end) exceed member `from`'s step message (its
  // descriptor mirrored here: step 0 after the meet, a later step once its post arrived).
  void check_read_range(const CallState& c, int from, int step, std::size_t offset,
                        std::size_t end) const;
  // Ends a receive still in flight (an unwinding reader) before its destination may be freed.
  void cancel_fetch(Fetch& fetch);
  // After a run (end_run): every process's trace events, into every process's copy of the
  // ranks it does not host (Trace shows every rank everywhere).
  void share_traces();
  // After a run that did not fail here: every message sent to this process's ranks arrived and
  // was taken, or the run fails naming the first one left (as World::run does within a process).
  void check_messages_taken(const std::vector<std::byte>& summaries, std::size_t block);
  // Tells the other processes hosting members of the call's group of a post or of done.
  void notify(const CallState& c, int type, int step, std::uint64_t bytes);

  WorldShared& w_;
  std::unique_ptr<Progress> p_;
};

}  // namespace tspemu::detail
