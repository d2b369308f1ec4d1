// The MPI transport's wire format: tags, the control messages' heads and bodies, their
// encoding, and the checks on MPI calls and message sizes (docs/design/mpi-transport.md).
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../shared_memory.hpp"

namespace tspemu::detail {

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
// summed time per message bounds a broadcast (docs/benchmarks.md).
constexpr std::uint64_t kHeldOpens = 31;
static_assert(kHeldOpens < kDescriptors / 2);
constexpr int kReplyTagBase = 16;
constexpr int kReplyTagLimit = kReplyTagBase + (64 << 16);
inline int reply_tag(std::uint32_t generation, int reader_world_rank, int member) {
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
inline int control_tag(std::size_t bytes) {
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
inline std::vector<std::byte>& control_buffer() {
  thread_local std::vector<std::byte> buffer;
  return buffer;
}

inline int checked_int(std::uint64_t n, const char* what) {
  if (n > static_cast<std::uint64_t>(INT_MAX))
    throw std::length_error(std::string("MPI transport: ") + what + " of " + std::to_string(n) +
                            " bytes exceeds one MPI message (" + std::to_string(INT_MAX) + ")");
  return static_cast<int>(n);
}

inline void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw std::runtime_error(std::string(call) + " failed: " + std::string(text, len));
  }
}

}  // namespace tspemu::detail
