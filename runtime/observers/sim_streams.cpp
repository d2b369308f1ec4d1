#include "tspemu/runtime/sim_streams.hpp"

#include <algorithm>
#include <iterator>

namespace tspemu {

void SimStreams::start_at(std::int64_t t) {
  idle_.clear();  // transfers do not outlive a run: nothing asks about earlier times
  now_ = t;
  comm_free_ = std::max(comm_free_, t);
}

void SimStreams::restore(const Snapshot& s) {
  idle_.clear();
  now_ = s.now;
  comm_free_ = s.comm_free;
  compute_ = s.compute;
  exposed_ = s.exposed;
  overlapped_ = s.overlapped;
}

void SimStreams::idle_until(std::int64_t end_ns) {
  if (end_ns <= now_) return;
  const std::int64_t before = idle_.empty() ? 0 : idle_.back().total_to_end;
  idle_.push_back({now_, end_ns, before + (end_ns - now_)});
}

std::int64_t SimStreams::idle_before(std::int64_t t) const {
  // The first interval ending after t; those before it are idle in full, it in part.
  const auto it = std::upper_bound(idle_.begin(), idle_.end(), t,
                                   [](std::int64_t v, const Idle& i) { return v < i.end; });
  const std::int64_t full = it == idle_.begin() ? 0 : std::prev(it)->total_to_end;
  return it == idle_.end() ? full : full + std::max<std::int64_t>(0, t - it->begin);
}

void SimStreams::compute_until(std::int64_t end_ns) {
  if (end_ns <= now_) return;
  compute_ += end_ns - now_;
  now_ = end_ns;
}

SimStreams::Transfer SimStreams::blocking(std::int64_t ready_ns, std::int64_t duration_ns) {
  const std::int64_t begin = std::max({ready_ns, comm_free_, now_});
  const Transfer t{begin, begin + duration_ns};
  comm_free_ = t.end_ns;
  exposed_ += t.end_ns - now_;  // waiting for the peers, the queue and the transfer itself
  idle_until(t.end_ns);
  now_ = t.end_ns;
  return t;
}

SimStreams::Transfer SimStreams::issue(std::int64_t duration_ns) {
  const std::int64_t begin = std::max(now_, comm_free_);
  const Transfer t{begin, begin + duration_ns};
  comm_free_ = t.end_ns;
  return t;
}

void SimStreams::wait(const Transfer& t) {
  // Overlapped: the compute stream's busy time within the part of t that ran before this wait.
  const std::int64_t ran_until = std::min(t.end_ns, now_);
  if (ran_until > t.begin_ns)
    overlapped_ += (ran_until - t.begin_ns) - (idle_before(ran_until) - idle_before(t.begin_ns));
  exposed_ += std::max<std::int64_t>(0, t.end_ns - now_);
  idle_until(t.end_ns);
  now_ = std::max(now_, t.end_ns);
}

}  // namespace tspemu
