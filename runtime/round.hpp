// Round: one collective call in progress on one rank, over the group's mailbox (state.hpp).
//
// The algorithms (broadcast.cpp, all_gather.cpp, ...) are written as a few verbs on a Round:
// construct (publish and meet every member, fingerprints checked), peer(r) (read a member's
// descriptor), read(...) (copy from a member's buffer under the abort-safe reading flag),
// advance/wait_stage (an extra step, e.g. all_reduce's reduce-then-gather), finish().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "state.hpp"
#include "tspemu/runtime/comm.hpp"

namespace tspemu::detail {

class Round {
 public:
  // Publishes this rank's call #seq and waits until every member has published #seq. `payload` is
  // this rank's contribution (what peers read); it is copied eagerly when it fits kEagerBytes.
  // Throws CollectiveMismatch (every member, same message) when the fingerprints disagree.
  Round(Comm& comm, Fingerprint fp, std::span<const std::byte> payload, std::byte* recv,
        bool fingerprint_counts_must_match = true);
  // Fix: a Round left by an exception between construction and finish() (a failed wait_stage,
  // begin_read seeing the abort, all_gatherv's late argument check) used to return while peers
  // could still be copying from this rank's exposed buffers, which the caller then frees
  // (use-after-free). Every such path has raised the world's abort first, so wait as finish does.
  ~Round() {
    if (exposed_ && !finished_) wait_all_done_after_abort();
    if (!recorded_end_) record_end(self_, record_, false);
  }
  Round(const Round&) = delete;
  Round& operator=(const Round&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::uint64_t seq() const { return seq_; }
  const Descriptor& peer(int r) const { return *peers_[static_cast<std::size_t>(r)]; }
  // Where member r's contribution can be read now: its eager copy or its own buffer.
  const std::byte* payload(int r) const {
    const Descriptor& d = peer(r);
    return d.eager ? d.data : d.send;
  }

  // Brackets reads of other ranks' buffers (the abort-safe reading flag, state.hpp).
  void begin_read();
  void end_read();

  void advance(std::uint64_t stage);
  void wait_stage(int r, std::uint64_t stage);
  // Marks this rank done; if its own buffers were exposed, waits until every member is done.
  void finish();
  const OpRef& op() const { return op_; }

 private:
  void wait_all_done_after_abort();
  Comm& comm_;
  RankState& self_;
  Group& group_;
  int rank_;
  int size_;
  std::uint64_t seq_;
  bool exposed_;
  bool finished_ = false;
  bool recorded_end_ = false;
  std::uint64_t record_ = 0;  // flight recorder id
  int root_ = -1;
  std::int64_t trace_begin_ns_ = 0;  // when tracing
  std::int64_t sim_begin_ns_ = -1;   // with a simulated clock
  std::int64_t sim_end_ns_ = -1;
  OpRef op_;
  const Descriptor* peers_[kMaxRanks];
};

// Scoped reading flag for a Round.
class ReadScope {
 public:
  explicit ReadScope(Round& r) : r_(r) { r_.begin_read(); }
  ~ReadScope() { r_.end_read(); }
  ReadScope(const ReadScope&) = delete;
  ReadScope& operator=(const ReadScope&) = delete;

 private:
  Round& r_;
};

// Adds `count` elements of `src` into `acc` (acc += src), typed by dtype. Used by every reduction,
// always in group-rank order, so results are bitwise reproducible.
void add_into(Dtype dtype, std::byte* acc, const std::byte* src, std::size_t count);
// acc = sum over r in [0, n) of srcs[r][0..count), rank order, safe when acc aliases one source.
void sum_ranks_into(Dtype dtype, std::byte* acc, const std::byte* const* srcs, int n,
                    std::size_t count);

}  // namespace tspemu::detail
