#include "tspemu/runtime/flight_recorder.hpp"

#include <algorithm>
#include <cstdio>

#include "tspemu/runtime/arena.hpp"

namespace tspemu {

OpRecord FlightRecorder::record(const Entry& e) const {
  OpRecord r;
  r.what = e.what;
  r.seq = e.seq;
  r.group = e.group;
  r.peer = e.peer;
  r.root = e.root;
  r.bytes = e.bytes;
  r.begin_ns = clock_->ns_of(e.begin_ticks);
  r.outcome = e.outcome;
  r.end_ns = e.outcome == OpRecord::Outcome::running ? 0 : clock_->ns_of(e.end_ticks);
  return r;
}

std::vector<OpRecord> FlightRecorder::last(std::size_t limit) const {
  const std::uint64_t n = std::min<std::uint64_t>({limit, ring_.size(), next_});
  std::vector<OpRecord> out;
  out.reserve(n);
  for (std::uint64_t id = next_ - n; id < next_; ++id)
    out.push_back(record(ring_[id % ring_.size()]));
  return out;
}

std::string describe(const OpRecord& r) {
  std::string s = std::string(r.what) + " #" + std::to_string(r.seq);
  if (r.peer >= 0)
    s += std::string(std::string_view(r.what) == "recv" ? " from" : " to") + " rank " +
         std::to_string(r.peer);
  if (r.root >= 0) s += " root " + std::to_string(r.root);
  if (r.group != nullptr) s += " on group " + *r.group;
  if (r.bytes > 0) s += ", " + format_bytes(r.bytes);
  return s;
}

std::string FlightRecorder::format(std::size_t limit, std::int64_t now_ns) const {
  std::string s;
  const std::uint64_t n = std::min<std::uint64_t>({limit, ring_.size(), next_});
  for (std::uint64_t id = next_ - n; id < next_; ++id) {
    const OpRecord r = record(ring_[id % ring_.size()]);
    const bool running = r.outcome == OpRecord::Outcome::running;
    char when[96];
    std::snprintf(when, sizeof when, " at %.3f ms, %s %.3f ms",
                  static_cast<double>(r.begin_ns) * 1e-6, running ? "running for" : "took",
                  static_cast<double>((running ? now_ns : r.end_ns) - r.begin_ns) * 1e-6);
    s += "\n  " + describe(r) + when +
         (running                                ? ""
          : r.outcome == OpRecord::Outcome::done ? ", done"
                                                 : ", failed");
  }
  return s;
}

}  // namespace tspemu
