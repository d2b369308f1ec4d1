// The simulated clock of pipeline schedules (plan/pipeline_clock.hpp): the bubble of every rank,
// measured by running the generated tables with uniform stage costs, equals the closed forms
// exactly as rationals — (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) for interleaved with
// chunk costs, (p−1)/(3m+p−1) for ZB-H1 at F = I = W — and the activations each stage holds at
// its peak are min(p−s, m) for 1F1B and m for GPipe.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "tspemu/plan/pipeline_check.hpp"
#include "tspemu/plan/pipeline_clock.hpp"
#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {
namespace {

constexpr int kRanks[] = {1, 2, 3, 4, 5, 8};

// Every rank of `s` idles exactly `expected` of the makespan.
void expect_bubble(const Schedule& s, const Costs& c, const Fraction& expected,
                   const std::string& what) {
  const Timeline t = simulate(s, c);
  for (int r = 0; r < s.ranks; ++r)
    EXPECT_EQ(t.idle_fraction(r), expected)
        << what << " rank " << r << ": " << to_string(t.idle_fraction(r)) << " measured, "
        << to_string(expected) << " expected";
}

std::string label(Kind k, int p, int m, int v) {
  return std::string(kind_name(k)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
         " v=" + std::to_string(v);
}

TEST(PipelineClock, GpipeAnd1f1bBubbleIsPMinus1OverMPlusPMinus1) {
  for (const Costs c : {Costs{1, 2, 1, 1, 0}, Costs{2, 3, 1, 2, 0}})
    for (const int p : kRanks)
      for (int m = 1; m <= 4 * p; ++m)
        for (const Kind k : {Kind::gpipe, Kind::one_f_one_b}) {
          const Fraction want = Fraction::of(p - 1, m + p - 1);
          ASSERT_EQ(closed_form_bubble(k, p, m, 1, c), want);
          expect_bubble(make_schedule({k, p, m, 1, {}}), c, want,
                        label(k, p, m, 1) + " F=" + std::to_string(c.forward));
        }
}

TEST(PipelineClock, InterleavedBubbleIsPMinus1OverVMPlusPMinus1FromMEqualsP) {
  const Costs c;  // F = 1, B = 2 per chunk: each chunk is 1/v of the rank's layers
  int measured = 0;
  for (const int p : kRanks)
    for (int m = 1; m <= 4 * p; ++m)
      for (const int v : {2, 3, 4}) {
        const ScheduleSpec spec{Kind::interleaved_1f1b, p, m, v, {}};
        if (refusal(spec)) continue;
        const Fraction formula = Fraction::of(p - 1, static_cast<std::int64_t>(v) * m + p - 1);
        const auto closed = closed_form_bubble(Kind::interleaved_1f1b, p, m, v, c);
        if (m >= p) {
          ASSERT_EQ(closed, formula);
          expect_bubble(make_schedule(spec), c, formula, label(spec.kind, p, m, v));
          ++measured;
        } else {
          // Fewer microbatches than ranks: a chunk's first microbatch comes back to rank 0 before
          // its forwards of the chunk are done, so the bubble is larger; no closed form claimed.
          EXPECT_FALSE(closed);
          const Timeline t = simulate(make_schedule(spec), c);
          const Fraction idle = t.idle_fraction(0);
          EXPECT_GT(idle.num * formula.den, formula.num * idle.den)
              << label(spec.kind, p, m, v) << ": " << to_string(idle);
        }
      }
  EXPECT_GT(measured, 150);
}

TEST(PipelineClock, ZbH1BubbleAtEqualCostsIsPMinus1Over3MPlusPMinus1) {
  const Costs c{1, 2, 1, 1, 0};
  for (const int p : kRanks)
    for (int m = p; m <= 4 * p; ++m) {
      const Fraction want = Fraction::of(p - 1, 3 * m + p - 1);
      ASSERT_EQ(closed_form_bubble(Kind::zb_h1, p, m, 1, c), want);
      expect_bubble(make_schedule({Kind::zb_h1, p, m, 1, {}}), c, want,
                    label(Kind::zb_h1, p, m, 1));
    }
  // Below m = p no closed form is claimed; ZB-H1 still beats 1F1B there.
  EXPECT_FALSE(closed_form_bubble(Kind::zb_h1, 4, 3, 1, c));
  const Timeline zb = simulate(make_schedule({Kind::zb_h1, 4, 3, 1, {}}), c);
  const Timeline fb = simulate(make_schedule({Kind::one_f_one_b, 4, 3, 1, {}}), c);
  EXPECT_LT(zb.makespan, fb.makespan);
}

TEST(PipelineClock, PeakActivationsPerStage) {
  for (const int p : kRanks)
    for (int m = 1; m <= 4 * p; ++m) {
      const Timeline fb = simulate(make_schedule({Kind::one_f_one_b, p, m, 1, {}}));
      const Timeline gp = simulate(make_schedule({Kind::gpipe, p, m, 1, {}}));
      const Timeline zb = simulate(make_schedule({Kind::zb_h1, p, m, 1, {}}));
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(fb.peak_in_flight[s], std::min(p - s, m)) << "1f1b p=" << p << " m=" << m;
        EXPECT_EQ(gp.peak_in_flight[s], m) << "gpipe p=" << p << " m=" << m;
        // ZB-H1 holds an activation until its W: 1F1B's largest peak (stage 0's) on every stage.
        EXPECT_EQ(zb.peak_in_flight[s], std::min(p, m)) << "zb-h1 p=" << p << " m=" << m;
      }
    }
}

TEST(PipelineClock, InterleavedRankPeakIsItsWarmUpPlusOne) {
  int checked = 0;
  for (const int p : kRanks)
    for (int m = 1; m <= 4 * p; ++m)
      for (const int v : {2, 3, 4}) {
        const ScheduleSpec spec{Kind::interleaved_1f1b, p, m, v, {}};
        if (refusal(spec)) continue;
        const int g = m / std::max(1, m / p);
        const Timeline t = simulate(make_schedule(spec));
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(t.rank_peak_in_flight[r], std::min((v - 1) * g + 2 * (p - 1 - r) + 1, v * m))
              << label(spec.kind, p, m, v) << " rank " << r;
          ++checked;
        }
      }
  EXPECT_GT(checked, 500);
  // One stage per rank: the rank's peak is its stage's.
  const Timeline fb = simulate(make_schedule({Kind::one_f_one_b, 4, 6, 1, {}}));
  EXPECT_EQ(fb.rank_peak_in_flight, fb.peak_in_flight);
}

TEST(PipelineClock, MessageLatencyDelaysTheConsumerExactly) {
  // GPipe, p = 2, m = 1, F = 1, B = 2, latency 5: 0F0 [0, 1]; 1F0 [6, 7]; 1B0 [7, 9];
  // 0B0 [14, 16].
  const Timeline t = simulate(make_schedule({Kind::gpipe, 2, 1, 1, {}}), {1, 2, 1, 1, 5});
  EXPECT_EQ(t.makespan, 16);
  EXPECT_EQ(t.finish, (std::vector<std::int64_t>{16, 9}));
  EXPECT_EQ(t.busy, (std::vector<std::int64_t>{3, 3}));
  EXPECT_EQ(t.idle_fraction(0), Fraction::of(13, 16));
}

TEST(PipelineClock, RefusesAScheduleTheCheckerRejects) {
  Schedule s = make_schedule({Kind::gpipe, 2, 2, 1, {}});
  s.actions[1].pop_back();
  const auto e = check_schedule(s);
  ASSERT_TRUE(e);
  try {
    simulate(s);
    ADD_FAILURE();
  } catch (const std::invalid_argument& x) {
    EXPECT_EQ(std::string(x.what()), e->message);
  }
}

TEST(PipelineClock, FractionsAreReduced) {
  EXPECT_EQ(Fraction::of(6, 21), (Fraction{2, 7}));
  EXPECT_EQ(Fraction::of(0, 5), (Fraction{0, 1}));
  EXPECT_EQ(to_string(Fraction::of(3, 9)), "1/3");
  EXPECT_THROW(Fraction::of(1, 0), std::invalid_argument);
}

}  // namespace
}  // namespace tspemu::pipeline
