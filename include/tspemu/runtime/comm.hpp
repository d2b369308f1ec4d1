// Comm: one rank's handle on a group of ranks (the world, or a sub-group made by split).
//
// What: the communicator the collectives take. Ranks inside a Comm are numbered 0..size()-1 in
// the order of the split key; world_rank(r) maps back.
// Requirements: a Comm is used by the thread of the rank that owns it; every member calls the
// group's collectives in the same order (that order is the sequence number in error messages).
// Guarantees: each Comm has its own sequence numbers and mailboxes, so collectives on different
// groups never interfere; a Comm is move-only (copying would fork its sequence numbers). A Comm
// with non-blocking collectives outstanding (nonblocking.hpp) must neither move nor die before
// their handles complete: the handles refer to it.
// Transport: the collectives are free functions on Comm (broadcast.hpp, all_gather.hpp, ...), so
// schedules never see the shared-memory mailbox behind them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tspemu {

namespace detail {
struct Group;
struct RankState;
class DeferredCalls;
}  // namespace detail

class Comm {
 public:
  Comm();
  Comm(Comm&&) noexcept;
  Comm& operator=(Comm&&) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  bool valid() const { return group_ != nullptr; }
  int rank() const { return rank_; }
  // Inline: every collective and message asks (the group's size and members never change).
  int size() const { return group_ ? size_ : 0; }
  int world_rank(int group_rank) const {
    if (group_rank < 0 || group_rank >= size()) throw_not_member(group_rank);
    return world_ranks_[group_rank];
  }
  const std::string& name() const;

  // Collective over this Comm: ranks passing the same color form one new group, ordered by
  // (key, rank). A negative color returns an invalid Comm (the rank joins no group). `name`
  // labels the group in error messages and traces (default "<parent>/<color>").
  Comm split(int color, int key, const std::string& name = {});

  // For the collective algorithms (runtime/), not for schedules.
  detail::Group& group() const { return *group_; }
  detail::RankState& self() const { return *self_; }
  std::uint64_t next_seq() { return ++seq_; }
  std::uint64_t seq() const { return seq_; }  // collectives called so far
  // This rank's non-blocking collectives issued on the group and not yet run (null until the
  // first; transport/deferred_calls.hpp).
  detail::DeferredCalls* deferred() const { return deferred_.get(); }
  detail::DeferredCalls& make_deferred();
  std::uint64_t& sends_to(int peer) { return sends_[static_cast<std::size_t>(peer)]; }
  std::uint64_t& recvs_from(int peer) { return recvs_[static_cast<std::size_t>(peer)]; }

  Comm(std::shared_ptr<detail::Group> group, int rank, detail::RankState* self);

 private:
  [[noreturn]] void throw_not_member(int group_rank) const;
  std::shared_ptr<detail::Group> group_;
  int rank_ = -1;
  int size_ = 0;                      // group_->size(), cached
  const int* world_ranks_ = nullptr;  // group_->world_ranks.data(), cached
  detail::RankState* self_ = nullptr;
  std::uint64_t seq_ = 0;             // collectives called on this group
  std::vector<std::uint64_t> sends_;  // messages sent to each group rank
  std::vector<std::uint64_t> recvs_;  // messages received from each group rank
  std::unique_ptr<detail::DeferredCalls> deferred_;
};

}  // namespace tspemu
