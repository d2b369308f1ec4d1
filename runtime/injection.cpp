#include "tspemu/runtime/injection.hpp"

#include <cstdio>
#include <optional>
#include <sstream>

#include "state.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu {

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
  static void delay(RankState& self) {
    const auto& inj = self.world->opts.inject;
    if (!inj) return;
    const double draw = self.inject.uniform(), length = self.inject.uniform();
    if (draw >= inj->probability) return;
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(
        length * static_cast<double>(inj->max_delay.count())));
  }
};

}  // namespace

std::unique_ptr<Observer> make_injection_observer() {
  return std::make_unique<InjectionObserver>();
}

}  // namespace tspemu::detail
