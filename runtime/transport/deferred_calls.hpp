// DeferredCalls: one rank's non-blocking collectives on one Comm (nonblocking.hpp) that have been
// issued and not yet run, in issue order.
//
// What: issuing records the operation (a callable that runs the blocking algorithm) and a digest
// of its buffers; run_through(id) runs every pending operation up to `id`, in issue order, each as
// one collective call marked non-blocking (Fingerprint::nonblocking). Call's constructor runs all
// pending ones before any other collective on the Comm opens, so every member makes its mailbox
// calls in issue order whatever order it waits in, and each operation takes the sequence number
// predicted at issue (the Comm's calls so far + the operations pending before it + 1).
// Requirements: the owning rank's thread only (no synchronization).
// Guarantees: an operation whose buffers changed between issue and run (digest_of: every byte of
// buffers up to 16 KiB, 256 lines spread over larger ones) is not run: the rank raises
// std::logic_error naming it. Once one fails, the failure is rethrown by every later run_through
// that needs an operation after it, and the operations behind it never run. A dropped operation
// (its handle destroyed unwaited) never runs: its buffers may be gone, so its early exposure
// (DeferredCall::exposure) is closed before drop() returns. Cost: the digest at issue
// and at run (at most 16 KiB read per buffer, whatever its size); no copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <span>

#include "tspemu/runtime/comm.hpp"

namespace tspemu::detail {

class EarlyExposure;

struct DeferredCall {
  const char* what = "";  // the non-blocking operation's name, e.g. "iall_gather"
  std::uint64_t seq = 0;  // the collective number it takes on the Comm
  std::function<void(Comm&)> run;
  std::span<const std::byte> buffers[2];  // what it reads and writes (may alias)
  std::uint64_t digest = 0;
  // The buffers published at issue to the members (early_exposure.hpp), or null. Closed before
  // the digest check, which then also asks it whether the receive blocks it still owns changed
  // (buffers[1] is left empty), and closed at once when the call is dropped; its destruction,
  // with the call's, closes it on every other way out (a failure discarding the queue).
  std::shared_ptr<EarlyExposure> exposure;
};

class DeferredCalls {
 public:
  // Records `call` (digest computed here) and returns its id (1, 2, ... in issue order).
  std::uint64_t add(Comm& comm, DeferredCall call);
  // Runs every pending call with id <= `id` in issue order; throws what the first failing one
  // threw (again on later calls).
  void run_through(Comm& comm, std::uint64_t id);
  void run_all(Comm& comm) { run_through(comm, next_id_ - 1); }
  bool pending() const { return !pending_.empty(); }
  std::size_t pending_count() const { return pending_.size() - dropped_; }
  // True while a deferred call runs: its Call is the non-blocking form and must not drain.
  bool running() const { return running_; }
  // The call completed (ran without failing).
  bool done(std::uint64_t id) const { return id <= completed_; }
  // The call will never run (its handle is gone).
  void drop(std::uint64_t id);

 private:
  struct Entry {
    std::uint64_t id;
    bool dropped;
    DeferredCall call;
  };
  std::deque<Entry> pending_;
  std::size_t dropped_ = 0;
  std::uint64_t next_id_ = 1;
  std::uint64_t completed_ = 0;  // every id up to it ran (or was dropped)
  bool running_ = false;
  std::exception_ptr failure_;
};

// A 64-bit digest of the bytes (dry-run memory, never backed, counts as empty): of every byte up
// to kWholeDigestBytes; of a larger buffer, of kDigestLines 64-byte spans ("lines", not
// necessarily cache-aligned) spread evenly over it, its first and last 64 bytes always among them.
// A write that changes a sampled line changes the digest (barring a 64-bit collision); a write
// elsewhere goes unnoticed: the check costs a bounded number of lines, not a pass.
inline constexpr std::size_t kDigestLines = 256;
inline constexpr std::size_t kWholeDigestBytes = kDigestLines * 64;
std::uint64_t digest_of(std::span<const std::byte> bytes);

}  // namespace tspemu::detail
