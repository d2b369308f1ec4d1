#include "tspemu/runtime/comm.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include "../transport/call.hpp"
#include "../transport/deferred_calls.hpp"
#include "world_state.hpp"

namespace tspemu {

namespace {

// The same in every process (Group::wire_id): splitmix64 over the parent's id, the split call's
// number and the color. Distinct groups of one run collide with probability ~2^-64 per pair.
std::uint64_t split_wire_id(std::uint64_t parent, std::uint64_t seq, int color) {
  std::uint64_t x = parent;
  for (std::uint64_t v : {seq, static_cast<std::uint64_t>(static_cast<std::uint32_t>(color))}) {
    x += v + 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
  }
  return x == 0 ? 1 : x;  // 0 is the world group
}

}  // namespace

Comm::Comm(std::shared_ptr<detail::Group> group, int rank, detail::RankState* self)
    : group_(std::move(group)),
      rank_(rank),
      size_(group_->size()),
      world_ranks_(group_->world_ranks.data()),
      self_(self),
      sends_(static_cast<std::size_t>(group_->size()), 0),
      recvs_(static_cast<std::size_t>(group_->size()), 0) {}

Comm::Comm() = default;
Comm::Comm(Comm&&) noexcept = default;
Comm& Comm::operator=(Comm&&) noexcept = default;
Comm::~Comm() = default;

detail::DeferredCalls& Comm::make_deferred() {
  if (!deferred_) deferred_ = std::make_unique<detail::DeferredCalls>();
  return *deferred_;
}

void Comm::throw_not_member(int group_rank) const {
  throw std::invalid_argument("Comm::world_rank: rank " + std::to_string(group_rank) +
                              " is not in group " + name() + " of size " + std::to_string(size()));
}

const std::string& Comm::name() const {
  static const std::string invalid = "<no group>";
  return group_ ? group_->name : invalid;
}

Comm Comm::split(int color, int key, const std::string& group_name) {
  if (!valid()) throw std::invalid_argument("Comm::split on an invalid Comm");
  const std::int64_t mine[2] = {color, key};
  detail::Call rd(*this, {CollectiveKind::split, Dtype::i64, -1, 2},
                  std::as_bytes(std::span<const std::int64_t>(mine)));
  // (key, parent rank) of every member with my color, sorted: the new group's order.
  std::vector<std::pair<std::int64_t, int>> members;
  for (int r = 0; r < rd.size(); ++r) {
    std::int64_t theirs[2];
    rd.recv(r, 0, 0, std::as_writable_bytes(std::span(theirs)));
    if (color >= 0 && theirs[0] == color) members.emplace_back(theirs[1], r);
  }
  const std::uint64_t seq = rd.seq();
  rd.finish();
  self_->counters[CollectiveKind::split].calls++;
  if (color < 0) return Comm();

  std::sort(members.begin(), members.end());
  std::vector<int> world_ranks;
  int my_index = -1;
  for (auto& [k, r] : members) {
    if (r == rank_) my_index = static_cast<int>(world_ranks.size());
    world_ranks.push_back(group_->world_ranks[static_cast<std::size_t>(r)]);
  }
  auto& w = *group_->world;
  // Only the members hosted by this process look the group up here (all of them in one process).
  int local_members = 0;
  for (int r : world_ranks) local_members += w.hosts(r) ? 1 : 0;
  std::shared_ptr<detail::Group> g;
  {
    std::lock_guard lock(w.groups_mu);
    const auto key =
        std::make_tuple(w.generation.load(std::memory_order_relaxed), group_->id, seq, color);
    auto it = w.split_groups.find(key);
    if (it == w.split_groups.end()) {
      std::string n = group_name.empty() ? group_->name + "/" + std::to_string(color) : group_name;
      auto made = std::make_shared<detail::Group>(&w, w.next_group_id++, n, world_ranks);
      made->wire_id = split_wire_id(group_->wire_id, seq, color);
      if (w.link != nullptr) w.link->add_group(*made);
      it =
          w.split_groups.emplace(key, detail::WorldShared::PendingGroup{made, local_members}).first;
    }
    g = it->second.group;
    if (it->second.lookups_left == local_members) {
      w.run_groups.push_back(g);
      if (w.opts.trace) w.group_names[g->id] = g->name;
    }
    if (--it->second.lookups_left == 0) w.split_groups.erase(it);
  }
  return Comm(std::move(g), my_index, self_);
}

}  // namespace tspemu
