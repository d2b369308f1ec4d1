#include "tspemu/runtime/flight_recorder.hpp"

#include <algorithm>
#include <cstdio>

#include "state.hpp"
#include "tspemu/runtime/arena.hpp"

namespace tspemu {

std::vector<OpRecord> FlightRecorder::last(std::size_t limit) const {
  const std::uint64_t n = std::min<std::uint64_t>({limit, ring_.size(), next_});
  std::vector<OpRecord> out;
  out.reserve(n);
  for (std::uint64_t id = next_ - n; id < next_; ++id) out.push_back(ring_[id % ring_.size()]);
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
    const OpRecord& r = ring_[id % ring_.size()];
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

namespace tspemu::detail {

namespace {

// One record per operation: a collective from entry to exit, a send from isend to its completion
// (at isend when copied eagerly), a receive from irecv to its completion.
class FlightObserver final : public Observer {
 public:
  unsigned hooks(const WorldOptions& opts) const override {
    return opts.flight_recorder_depth > 0 ? kHookBegin | kHookEnd : 0u;
  }
  unsigned kinds(ObserverHook hook) const override {
    using K = OpInfo::Kind;
    // A record opens at a collective, an isend or an irecv and closes at the operation that
    // completes it (anything but an irecv's post).
    return hook == kHookBegin
               ? OpInfo::bit(K::collective) | OpInfo::bit(K::send) | OpInfo::bit(K::recv_post)
               : ~OpInfo::bit(K::recv_post);
  }
  void on_begin(RankState& self, OpInfo& op) override {
    if (self.flight.depth() == 0) return;
    switch (op.kind) {
      case OpInfo::Kind::collective:
      case OpInfo::Kind::send:
      case OpInfo::Kind::recv_post:
        op.record = self.flight.begin(op.what, op.seq, &op.group->name, op.peer, op.root, op.bytes,
                                      self.world->now_ns());
        return;
      default:
        return;
    }
  }
  void on_end(RankState& self, OpInfo& op, bool ok) override {
    if (self.flight.depth() == 0) return;
    if (op.kind == OpInfo::Kind::send && !op.completes_record) return;  // ends at its wait
    if (op.kind == OpInfo::Kind::recv_post) return;                     // ends at its wait
    self.flight.end(op.record, self.world->now_ns(), ok);
  }
};

}  // namespace

std::unique_ptr<Observer> make_flight_observer() {
  return std::make_unique<FlightObserver>();
}

}  // namespace tspemu::detail
