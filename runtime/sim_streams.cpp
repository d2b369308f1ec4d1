#include "tspemu/runtime/sim_streams.hpp"

#include <algorithm>

namespace tspemu {

void SimStreams::start_at(std::int64_t t) {
  now_ = t;
  comm_free_ = std::max(comm_free_, t);
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
  const std::int64_t exposed = std::max<std::int64_t>(0, t.end_ns - now_);
  exposed_ += exposed;
  overlapped_ += std::max<std::int64_t>(0, (t.end_ns - t.begin_ns) - exposed);
  now_ = std::max(now_, t.end_ns);
}

}  // namespace tspemu
