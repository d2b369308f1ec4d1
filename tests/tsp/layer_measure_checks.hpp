// Test helpers for measure_layer (layer_measure.hpp): a dry measurement against a real one, and a
// rank's counters against the cost model's closed-form traffic (one type: compared with ==).
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "tspemu/plan/cost_model.hpp"
#include "tspemu/tsp/layer_measure.hpp"

namespace tspemu {

// How GoogleTest prints traffic when EXPECT_EQ(got, want) fails: every kind with a call, as
// "all_gather: 4 calls, sent 96 B, received 96 B".
inline void PrintTo(const TrafficCounters& t, std::ostream* os) {
  *os << "{";
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    const TrafficCounters::Entry& e = t.by_kind[k];
    if (e.calls == 0 && e.bytes_sent == 0 && e.bytes_received == 0) continue;
    *os << " " << collective_name(static_cast<CollectiveKind>(k)) << ": " << e.calls
        << " calls, sent " << e.bytes_sent << " B, received " << e.bytes_received << " B;";
  }
  *os << " }";
}

}  // namespace tspemu

namespace tspemu::tsp::testing {

// Every rank's counters of both passes against cost::layer_traffic for that rank.
inline void expect_closed_form_traffic(const LayerMeasure& got, const cost::ModelShape& m,
                                       const cost::Strategy& st,
                                       const cost::CostOptions& opt = {}) {
  for (int r = 0; r < st.ranks(); ++r) {
    const cost::LayerTraffic t =
        cost::layer_traffic(m, st, cost::ElementSizes::fp32_emulator(), opt, r);
    const RankLayerMeasure& g = got.ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(g.forward_traffic, t.forward) << "rank " << r << " forward";
    EXPECT_EQ(g.backward_traffic, t.backward) << "rank " << r << " backward";
  }
}

// Every field of a dry measurement equals the real one, rank by rank: the blocks' bytes after
// construction, each pass's category peaks, end state, overall and phase peaks, and the counters.
inline void expect_dry_equals_real(const LayerMeasure& dry, const LayerMeasure& real) {
  ASSERT_EQ(dry.ranks.size(), real.ranks.size());
  for (std::size_t r = 0; r < dry.ranks.size(); ++r) {
    const RankLayerMeasure& d = dry.ranks[r];
    const RankLayerMeasure& w = real.ranks[r];
    const std::string what = "rank " + std::to_string(r);
    EXPECT_EQ(d.resident, w.resident) << what << " resident after construction";
    const std::pair<const ArenaStats*, const ArenaStats*> passes[] = {{&d.forward, &w.forward},
                                                                      {&d.backward, &w.backward}};
    for (const auto& [got, want] : passes) {
      const std::string pass = what + (got == &d.forward ? " forward" : " backward");
      for (std::size_t c = 0; c < kCategoryCount; ++c) {
        const char* cat = category_name(static_cast<Category>(c));
        EXPECT_EQ(got->category_peak[c], want->category_peak[c]) << pass << " peak " << cat;
        EXPECT_EQ(got->category_current[c], want->category_current[c]) << pass << " end " << cat;
      }
      EXPECT_EQ(got->peak, want->peak) << pass << " overall peak";
    }
    EXPECT_EQ(d.forward_phases, w.forward_phases) << what << " forward phase peaks";
    EXPECT_EQ(d.backward_phases, w.backward_phases) << what << " backward phase peaks";
    EXPECT_EQ(d.forward_traffic, w.forward_traffic) << what << " forward traffic";
    EXPECT_EQ(d.backward_traffic, w.backward_traffic) << what << " backward traffic";
    EXPECT_GT(d.forward.peak, 0u) << what;
  }
}

}  // namespace tspemu::tsp::testing
