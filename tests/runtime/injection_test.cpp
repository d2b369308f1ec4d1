// Injection (injection.hpp): correct schedules are bitwise identical under every seed; a schedule
// whose sum follows arrival order is caught with its seed named; a seed reproduces the event
// order; failures under injection name the seed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/runtime/injection.hpp"
#include "tspemu/runtime/send_recv.hpp"
#include "tspemu/runtime/trace.hpp"

namespace tspemu::test {
namespace {

constexpr int kRanks = 4;
const int kSeeds = kUnderTsan ? 8 : 40;

std::vector<float> random_floats(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// A correct schedule touching every kind the injection perturbs: reductions of random floats
// (whose sums depend on order), a ring of sendrecvs, and receives completed by wait_any whose
// payloads land in slots by source. Returns every rank's results, concatenated.
std::vector<std::byte> correct_schedule(World& world) {
  std::vector<std::vector<float>> out(kRanks);
  world.run([&](Rank& r) {
    Comm& c = r.comm();
    const int p = r.id(), n = r.size();
    const auto x = random_floats(static_cast<std::uint64_t>(p) + 10, 1000);
    std::vector<float> sum(x.size()), part(x.size() / static_cast<std::size_t>(n));
    all_reduce<float>(c, x, sum);
    reduce_scatter<float>(c, x, part);
    std::vector<float> ring(part.size());
    sendrecv<float>(c, part, (p + 1) % n, ring, (p + n - 1) % n);
    std::vector<float> slots(static_cast<std::size_t>(n) * 4, 0.f);
    std::vector<RecvHandle> hs;
    std::vector<SendHandle> ss;
    for (int q = 0; q < n; ++q) {
      if (q == p) continue;
      ss.push_back(isend<float>(c, std::span<const float>(x.data(), 4), q));
      hs.push_back(irecv<float>(c, std::span<float>(slots.data() + 4 * q, 4), q));
    }
    for (std::size_t k = 0; k < hs.size(); ++k) wait_any(hs);
    for (auto& s : ss) s.wait();
    auto& o = out[static_cast<std::size_t>(p)];
    o = sum;
    o.insert(o.end(), ring.begin(), ring.end());
    o.insert(o.end(), slots.begin(), slots.end());
  });
  std::vector<std::byte> bytes;
  for (const auto& o : out) append_bytes<float>(bytes, o);
  return bytes;
}

// Planted bug: rank 0 adds the other ranks' values in the order wait_any delivers them. In fp32
// (1 + 1e8) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1, so the result depends on the delivery order.
float order_dependent_sum(World& world) {
  float result = 0;
  world.run([&](Rank& r) {
    Comm& c = r.comm();
    const float mine[kRanks] = {0.f, 1.f, 1e8f, -1e8f};
    if (r.id() != 0) {
      send<float>(c, std::span<const float>(&mine[r.id()], 1), 0);
      return;
    }
    float in[kRanks] = {};
    std::vector<RecvHandle> hs;
    for (int q = 1; q < kRanks; ++q) hs.push_back(irecv<float>(c, std::span<float>(&in[q], 1), q));
    float acc = 0;
    for (int k = 1; k < kRanks; ++k) acc += in[1 + wait_any(hs)];
    result = acc;
  });
  return result;
}

std::vector<std::byte> bytes_of(float f) {
  std::vector<std::byte> b;
  append_bytes<float>(b, std::span<const float>(&f, 1));
  return b;
}

TEST(Injection, CorrectScheduleIsBitwiseIdenticalUnderEverySeed) {
  World world({.ranks = kRanks});
  EXPECT_NO_THROW(check_deterministic(world, {.seed = 1, .probability = 0.5}, kSeeds,
                                      [&] { return correct_schedule(world); }));
  EXPECT_FALSE(world.options().inject.has_value()) << "the world's setting is restored";
}

TEST(Injection, PlantedOrderingBugFailsLoudlyNamingTheSeed) {
  World world({.ranks = kRanks});
  // Injected runs are a function of the seed: seeds 1..40 give both results (checked below), so
  // whichever result the run without injection gives, some seed differs from it.
  std::set<float> results;
  for (std::uint64_t s = 1; s <= 40; ++s) {
    world.set_injection(Injection{.seed = s, .max_delay = std::chrono::microseconds(20)});
    results.insert(order_dependent_sum(world));
  }
  ASSERT_EQ(results, (std::set<float>{0.f, 1.f}));
  try {
    check_deterministic(world, {.seed = 1, .max_delay = std::chrono::microseconds(20)}, 40,
                        [&] { return bytes_of(order_dependent_sum(world)); });
    FAIL() << "the order-dependent sum was not caught";
  } catch (const NondeterminismError& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("nondeterministic schedule: under injection seed " + std::to_string(e.seed())),
        std::string::npos)
        << what;
    EXPECT_NE(what.find("rerun with this seed"), std::string::npos) << what;
    EXPECT_GE(e.seed(), 1u);
    EXPECT_LE(e.seed(), 40u);
  }
}

// The (peer, message) order of rank 0's completed receives in the last run.
std::vector<int> recv_order(const World& world) {
  std::vector<int> order;
  for (const TraceEvent& e : world.trace().events(0))
    if (e.type == TraceEvent::Type::recv) order.push_back(e.peer);
  return order;
}

TEST(Injection, SameSeedReproducesTheEventOrderAndTheResult) {
  World world({.ranks = kRanks, .trace = true});
  std::set<std::vector<int>> orders;
  for (std::uint64_t s = 1; s <= 12; ++s) {
    world.set_injection(Injection{.seed = s, .max_delay = std::chrono::microseconds(50)});
    world.trace().clear();
    const float first = order_dependent_sum(world);
    const std::vector<int> order = recv_order(world);
    world.trace().clear();
    const float again = order_dependent_sum(world);
    EXPECT_EQ(bytes_of(first), bytes_of(again)) << "seed " << s;
    EXPECT_EQ(order, recv_order(world)) << "seed " << s;
    ASSERT_EQ(order.size(), 3u);
    orders.insert(order);
  }
  EXPECT_GE(orders.size(), 3u) << "the seeds should reorder the deliveries";
}

// The delays rank 0's stream draws for `barriers` barriers under `inj`, in microseconds (two
// draws per operation: whether, how long).
double planned_delay_us(const Injection& inj, int barriers) {
  InjectionStream replay;
  replay.reset(inj.seed, 0);
  double planned_us = 0;
  for (int i = 0; i < barriers; ++i) {
    const double draw = replay.uniform(), length = replay.uniform();
    if (draw < inj.probability)
      planned_us += length * std::chrono::duration<double, std::micro>(inj.max_delay).count();
  }
  return planned_us;
}

double run_barriers_us(World& world, int barriers) {
  const auto t0 = std::chrono::steady_clock::now();
  world.run([barriers](Rank& r) {
    for (int i = 0; i < barriers; ++i) barrier(r.comm());
  });
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

constexpr int kBarriers = 20;
const Injection kDelaying{
    .seed = 5, .probability = 0.5, .max_delay = std::chrono::microseconds(2000)};

TEST(Injection, DelaysFollowTheRanksSeededStream) {
  // sleep_for sleeps at least as long as asked, so a run of barriers lasts at least the sum of
  // the delays rank 0's stream draws for them.
  const double planned_us = planned_delay_us(kDelaying, kBarriers);
  ASSERT_GT(planned_us, 2000) << "seed 5 should delay some barriers";
  World world({.ranks = 2});
  world.set_injection(kDelaying);
  EXPECT_GE(run_barriers_us(world, kBarriers), planned_us);
}

TEST(Injection, TurnedOnBetweenRunsDelaysTheNextRun) {
  // The observers a run calls are chosen at its start: a world that ran without injection
  // must still inject once it is set.
  const double planned_us = planned_delay_us(kDelaying, kBarriers);
  ASSERT_GT(planned_us, 2000) << "seed 5 should delay some barriers";
  World world({.ranks = 2});
  run_barriers_us(world, kBarriers);
  world.set_injection(kDelaying);
  EXPECT_GE(run_barriers_us(world, kBarriers), planned_us);
}

TEST(Injection, DelaysLongerThanAQuarterOfTheHangTimeoutAreRefusedNamingTheBound) {
  const Injection too_long{.max_delay = std::chrono::seconds(3)};
  try {
    World world({.ranks = 2, .hang_timeout = std::chrono::seconds(10), .inject = too_long});
    FAIL() << "World accepted a 3 s delay under a 10 s hang timeout";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_delay 3000000 us must be in [0, 2500000] us"),
              std::string::npos)
        << e.what();
  }
  World world({.ranks = 2, .hang_timeout = std::chrono::seconds(10)});
  world.set_injection(kDelaying);
  EXPECT_THROW(world.set_injection(too_long), std::invalid_argument);
  EXPECT_THROW(world.set_injection(Injection{.probability = 1.5}), std::invalid_argument);
  EXPECT_EQ(world.options().inject->max_delay, kDelaying.max_delay) << "a refused setting is kept";
}

TEST(Injection, AFailureElsewhereEndsAnInjectedDelayPromptly) {
  // Rank 0's first draw delays its barrier by `planned` (seed chosen so it is over a second);
  // rank 1 fails at once. The delay must end on the abort, not sleep out: the run returns well
  // within half the planned delay.
  Injection inj{.seed = 1, .probability = 1.0, .max_delay = std::chrono::seconds(2)};
  double planned_us = 0;
  for (; inj.seed < 64 && (planned_us = planned_delay_us(inj, 1)) < 1e6; ++inj.seed) {
  }
  ASSERT_GE(planned_us, 1e6) << "no seed below 64 delays rank 0's first barrier by 1 s";
  World world({.ranks = 2, .inject = inj});
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(world.run([](Rank& r) {
    if (r.id() == 1) throw std::runtime_error("planted failure");
    barrier(r.comm());
  }),
               RankFailure);
  const double took_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took_us, planned_us / 2) << "planned delay " << planned_us << " us";
}

TEST(Injection, FailureUnderInjectionNamesTheSeed) {
  World world({.ranks = kRanks});
  world.set_injection(Injection{.seed = 77});
  try {
    world.run([](Rank& r) {
      barrier(r.comm());
      if (r.id() == 2) throw std::runtime_error("planted failure");
      barrier(r.comm());
    });
    FAIL() << "World::run did not throw";
  } catch (const RankFailure& f) {
    const std::string what = f.what();
    EXPECT_EQ(f.rank(), 2);
    EXPECT_NE(what.find("planted failure"), std::string::npos) << what;
    EXPECT_NE(what.find("under injection seed 77"), std::string::npos) << what;
  }
}

TEST(WaitAny, CompletesEachReceiveOnceAndRejectsAnEmptySet) {
  World world({.ranks = 3});
  world.run([](Rank& r) {
    Comm& c = r.comm();
    if (r.id() != 0) {
      const int v = 10 * r.id();
      send<int>(c, std::span<const int>(&v, 1), 0);
      return;
    }
    int in[2] = {};
    std::vector<RecvHandle> hs;
    hs.push_back(irecv<int>(c, std::span<int>(&in[0], 1), 1));
    hs.push_back(irecv<int>(c, std::span<int>(&in[1], 1), 2));
    std::set<std::size_t> seen{wait_any(hs), wait_any(hs)};
    EXPECT_EQ(seen, (std::set<std::size_t>{0, 1}));
    EXPECT_EQ(in[0], 10);
    EXPECT_EQ(in[1], 20);
    EXPECT_TRUE(hs[0].done() && hs[1].done());
    EXPECT_THROW(wait_any(hs), std::invalid_argument);
  });
}

}  // namespace
}  // namespace tspemu::test
