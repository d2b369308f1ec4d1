// MpiTransport: the transport of a world spanning the processes of MPI_COMM_WORLD
// (WorldOptions::mpi; built only with MPI, TSPEMU_HAVE_MPI). The design (mirrors, reads pulled from
// the owner's process, held opens of eager broadcasts, the poller, control rings) and its costs:
// docs/design/mpi-transport.md. Sources: runtime/transport/mpi/, one concept per file.
//
// What: the shared-memory transport (shared_memory.hpp) for members hosted by this process; for
// members hosted by another process, every process keeps a mirror of their slots current by
// control messages (open, post, done), reads of their messages are pulled from the owner's
// process, and point-to-point messages to another process are copied at send.
// Requirements: every process constructs its World with the same options and makes the same
// run() calls in the same order; P (MPI processes) divides ranks; one executable (messages are
// the in-memory layout of the structures: a homogeneous cluster); a World is destroyed before the
// program's own MPI_Finalize, if it calls one.
// Guarantees: those of transport.hpp; results bitwise those of a one-process world. A failure
// raised in one process ends the run of every process with the same first failure (the first one
// this process learns of). At the end of each run every process has every rank's counters,
// simulated clock and (tracing) events; a point-to-point message to this process's ranks never
// taken fails the run in every process. The communicator is freed with the world once every
// message sent on it has been taken in.
// Cost: per call, per other process hosting members: one message at open, one per post, one done
// if that process exposed a buffer; a read of another process's message is one request and one
// reply (a reduction's: one per 64 KiB chunk).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "../world/world_state.hpp"
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

  struct Fetch;     // one read of another process's message (mpi/progress.hpp)
  struct FetchSet;  // reads of one verb in flight together (mpi/progress.hpp)
  struct Progress;  // the progress thread and what it owns (mpi/progress.hpp)

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
  // of it in place; the answer (an AddressReply, mpi/wire.hpp) lands in `reply`.
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
