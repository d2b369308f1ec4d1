#include "tspemu/runtime/injection.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "../world/world_state.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu {

std::chrono::microseconds max_injection_delay(std::chrono::milliseconds hang_timeout) {
  return std::chrono::duration_cast<std::chrono::microseconds>(hang_timeout) / 4;
}

void Injection::validate(std::chrono::milliseconds hang_timeout) const {
  if (!(probability >= 0 && probability <= 1))
    throw std::invalid_argument("injection: probability " + std::to_string(probability) +
                                " must be in [0, 1]");
  const auto bound = max_injection_delay(hang_timeout);
  if (max_delay.count() < 0 || max_delay > bound)
    throw std::invalid_argument("injection: max_delay " + std::to_string(max_delay.count()) +
                                " us must be in [0, " + std::to_string(bound.count()) +
                                "] us (a quarter of the hang timeout, " +
                                std::to_string(hang_timeout.count()) + " ms)");
}

std::string Injection::describe() const {
  std::ostringstream s;
  s << "injection seed " << seed << " (delay p=" << probability << ", at most " << max_delay.count()
    << " us)";
  return s.str();
}

namespace {

std::string byte_hex(std::byte b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned>(b));
  return buf;
}

// Restores a world's injection setting on every exit path.
class InjectionScope {
 public:
  explicit InjectionScope(World& w) : world_(w), saved_(w.options().inject) {}
  ~InjectionScope() { world_.set_injection(saved_); }
  InjectionScope(const InjectionScope&) = delete;
  InjectionScope& operator=(const InjectionScope&) = delete;

 private:
  World& world_;
  std::optional<Injection> saved_;
};

}  // namespace

void check_deterministic(World& world, const Injection& base, int seeds,
                         const std::function<std::vector<std::byte>()>& run) {
  InjectionScope restore(world);
  world.set_injection(std::nullopt);
  const std::vector<std::byte> expected = run();
  for (int i = 0; i < seeds; ++i) {
    Injection inj = base;
    inj.seed = base.seed + static_cast<std::uint64_t>(i);
    world.set_injection(inj);
    const std::vector<std::byte> got = run();
    if (got == expected) continue;
    std::ostringstream m;
    m << "nondeterministic schedule: under " << inj.describe()
      << " the result differs from the run without injection";
    if (got.size() != expected.size()) {
      m << " in size (" << got.size() << " bytes, expected " << expected.size() << ")";
    } else {
      std::size_t k = 0;
      while (got[k] == expected[k]) ++k;
      m << " first at byte " << k << " of " << got.size() << " (" << byte_hex(got[k])
        << ", expected " << byte_hex(expected[k]) << ")";
    }
    m << "; rerun with this seed to reproduce the event order";
    throw NondeterminismError(inj.seed, m.str());
  }
}

}  // namespace tspemu

namespace tspemu::detail {

namespace {

// With the run's probability, sleeps up to max_delay at the start of a collective, a send (one
// draw for the rank, one for the message) and a receive's completion. Draws from the rank's own
// stream, so the decisions are a function of (seed, rank, operation index) only.
class InjectionObserver final : public Observer {
 public:
  unsigned hooks(const WorldOptions& opts) const override { return opts.inject ? kHookBegin : 0u; }
  void on_begin(RankState& self, OpInfo& op) override {
    switch (op.kind) {
      case OpInfo::Kind::send:
        delay(self);  // the rank
        delay(self);  // the message
        return;
      case OpInfo::Kind::collective:
      case OpInfo::Kind::recv:
        delay(self);
        return;
      default:
        return;
    }
  }

 private:
  // Sleeps on the rank's parker in slices of at most 20 ms, so a failure elsewhere (whose
  // WorldShared::fail unparks every rank) ends the delay at once instead of after up to
  // max_delay; the operation that follows then reports the abort. Without a failure it sleeps at
  // least the drawn length, as sleep_for would.
  static void delay(RankState& self) {
    const auto& inj = self.world->opts.inject;
    if (!inj) return;
    const double draw = self.inject.uniform(), length = self.inject.uniform();
    if (draw >= inj->probability) return;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double, std::micro>(
                               length * static_cast<double>(inj->max_delay.count())));
    for (;;) {
      self.parker.prepare();
      // seq_cst: pairs with the seq_cst store in WorldShared::fail, which unparks after it; with
      // prepare() above (the Dekker pair of parker.hpp) either this load sees the abort or the
      // unpark sees this rank sleeping and wakes it.
      if (self.world->aborted.load(std::memory_order_seq_cst)) break;
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) break;
      self.parker.park(std::min<std::chrono::nanoseconds>(until - now, kDelaySlice));
    }
    self.parker.cancel();
  }
  static constexpr std::chrono::milliseconds kDelaySlice{20};
};

}  // namespace

std::unique_ptr<Observer> make_injection_observer() {
  return std::make_unique<InjectionObserver>();
}

}  // namespace tspemu::detail
