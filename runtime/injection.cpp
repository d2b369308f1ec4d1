#include "tspemu/runtime/injection.hpp"

#include <cstdio>
#include <optional>
#include <sstream>

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
