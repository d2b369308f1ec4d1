// What a pipelined step costs, measured on the ranks: with the simulated clock charging every F,
// B, I and W uniform units (Costs: F = 1, B = 2, I = W = 1, free messages), each rank's idle
// fraction equals pipeline_clock's exact rational — (p−1)/(m+p−1) for GPipe and 1F1B,
// (p−1)/(v·m+p−1) for interleaved 1F1B — and the activations each rank's arena holds at its peak
// equal the schedule's activations in flight times one microbatch's [B_mb, T, C], to the byte:
// min(p−s, m) for 1F1B, m for GPipe.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "pipeline_test_support.hpp"

namespace tspemu::pipeline::testing {
namespace {

constexpr std::int64_t kNsPerUnit = 100'000'000;  // flops_per_unit 1e8 at 1 GFLOP/s: 0.1 s

// One FLOP per ns; messages free (no latency, unbounded bandwidth).
WorldOptions unit_clock_world() {
  SimClockModel m;
  m.name = "pipeline-units";
  m.peak_flops = 1e9;
  m.mfu = 1.0;
  m.alpha_s = 0;
  m.beta_bytes_s = 1e30;
  m.inter_alpha_s = 0;
  m.inter_beta_bytes_s = 1e30;
  WorldOptions o;
  o.sim_clock = m;
  return o;
}

// The simulated clock counts whole nanoseconds; World reports seconds (ns · 1e-9, exact to well
// under a nanosecond at these magnitudes).
std::int64_t units(double seconds) {
  const std::int64_t ns = std::llround(seconds * 1e9);
  EXPECT_EQ(ns % kNsPerUnit, 0) << "the clock charged a fraction of a unit: " << ns << " ns";
  return ns / kNsPerUnit;
}

struct Measured {
  std::vector<Fraction> idle;            // pp rank -> idle fraction
  std::vector<std::size_t> activations;  // pp rank -> peak activation bytes
  std::size_t microbatch_bytes = 0;      // one [B_mb, T, C] activation, as the arena charges it
  Timeline model;
};

Measured measure(const PipeSetup& s) {
  const ref::ModelConfig cfg = small_config(s);
  const auto w = ref::init_weights<float>(cfg, 3);
  const Data data = make_data(s, cfg.vocab);
  const Schedule schedule = make(s);
  const StepResult got = run_step(s, schedule, w, data, unit_clock_world(), Costs{});
  for (const std::string& f : got.failures) EXPECT_EQ(f, "");
  Measured out;
  std::int64_t makespan = 0;
  for (double t : got.sim_seconds) makespan = std::max(makespan, units(t));
  for (int r = 0; r < s.p; ++r) {
    const std::int64_t busy = units(got.sim_compute[std::size_t(r)]);
    out.idle.push_back(Fraction::of(makespan - busy, makespan));
    out.activations.push_back(
        got.arena[std::size_t(r)].category_peak[std::size_t(Category::activations)]);
  }
  const std::size_t bytes = std::size_t(s.micro_batch * s.seq * cfg.hidden) * sizeof(float);
  out.microbatch_bytes = (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
  out.model = simulate(schedule, Costs{});
  return out;
}

TEST(PipelineBubble, GPipeAndOneFOneBIdleFractionIsExactlyPMinusOneOverMPlusPMinusOne) {
  for (Kind kind : {Kind::gpipe, Kind::one_f_one_b}) {
    for (int p : {2, 4}) {
      for (int m : {1, 2, p, 2 * p}) {
        const PipeSetup s{.kind = kind, .p = p, .m = m};
        SCOPED_TRACE(s.label());
        const Measured got = measure(s);
        const Fraction want = Fraction::of(p - 1, m + p - 1);
        ASSERT_EQ(closed_form_bubble(kind, p, m, 1), want);
        for (int r = 0; r < p; ++r)
          EXPECT_EQ(to_string(got.idle[std::size_t(r)]), to_string(want)) << "pp rank " << r;
      }
    }
  }
}

TEST(PipelineBubble, InterleavedIdleFractionIsExactlyPMinusOneOverVMPlusPMinusOne) {
  for (int p : {2, 4}) {
    for (int m : {p, 2 * p}) {
      const PipeSetup s{.kind = Kind::interleaved_1f1b, .p = p, .m = m, .v = 2};
      SCOPED_TRACE(s.label());
      const Measured got = measure(s);
      const Fraction want = Fraction::of(p - 1, 2 * m + p - 1);
      ASSERT_EQ(closed_form_bubble(Kind::interleaved_1f1b, p, m, 2), want);
      for (int r = 0; r < p; ++r)
        EXPECT_EQ(to_string(got.idle[std::size_t(r)]), to_string(want)) << "pp rank " << r;
    }
  }
}

// Where no closed form is claimed (interleaved with m < p) and for ZB-H1, the measured fraction
// equals the planner's event simulation of the same table.
TEST(PipelineBubble, IdleFractionEqualsThePlannersSimulationWhereNoClosedFormIsClaimed) {
  for (const PipeSetup& s : {PipeSetup{.kind = Kind::interleaved_1f1b, .p = 4, .m = 2, .v = 2},
                             PipeSetup{.kind = Kind::zb_h1, .p = 4, .m = 4},
                             PipeSetup{.kind = Kind::zb_h1, .p = 2, .m = 1}}) {
    SCOPED_TRACE(s.label());
    const Measured got = measure(s);
    for (int r = 0; r < s.p; ++r) {
      EXPECT_EQ(to_string(got.idle[std::size_t(r)]), to_string(got.model.idle_fraction(r)))
          << "pp rank " << r;
    }
  }
}

TEST(PipelineMemory, OneFOneBHoldsMinOfPMinusSAndMActivationsPerStageToTheByte) {
  for (int p : {2, 4}) {
    for (int m : {1, 2, p, 2 * p}) {
      const PipeSetup s{.kind = Kind::one_f_one_b, .p = p, .m = m};
      SCOPED_TRACE(s.label());
      const Measured got = measure(s);
      for (int st = 0; st < p; ++st) {
        EXPECT_EQ(got.activations[std::size_t(st)],
                  std::size_t(std::min(p - st, m)) * got.microbatch_bytes)
            << "stage " << st;
      }
    }
  }
}

TEST(PipelineMemory, GPipeHoldsAllMActivationsOnEveryStageToTheByte) {
  for (int m : {1, 3, 8}) {
    const PipeSetup s{.kind = Kind::gpipe, .p = 4, .m = m};
    SCOPED_TRACE(s.label());
    const Measured got = measure(s);
    for (int st = 0; st < 4; ++st)
      EXPECT_EQ(got.activations[std::size_t(st)], std::size_t(m) * got.microbatch_bytes)
          << "stage " << st;
  }
}

// Every schedule's rank peak equals the planner's count of activations in flight per rank.
TEST(PipelineMemory, EveryRanksPeakEqualsThePlannersActivationsInFlight) {
  for (const PipeSetup& s : {PipeSetup{.kind = Kind::interleaved_1f1b, .p = 2, .m = 4, .v = 2},
                             PipeSetup{.kind = Kind::interleaved_1f1b, .p = 4, .m = 8, .v = 2},
                             PipeSetup{.kind = Kind::zb_h1, .p = 4, .m = 8}}) {
    SCOPED_TRACE(s.label());
    const Measured got = measure(s);
    for (int r = 0; r < s.p; ++r) {
      EXPECT_EQ(got.activations[std::size_t(r)],
                std::size_t(got.model.rank_peak_in_flight[std::size_t(r)]) * got.microbatch_bytes)
          << "pp rank " << r;
    }
  }
}

}  // namespace
}  // namespace tspemu::pipeline::testing
