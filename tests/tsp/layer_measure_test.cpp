// measure_layer (layer_measure.hpp) at real sizes: the paper's 7B-class model, D = 8, S = 16K and
// 128K — the real blocks run dry; their bytes per collective equal the cost model's closed-form
// traffic formulas exactly on every rank, and the run takes no memory. (At small sizes a dry run
// equals a real run field by field: cost_model_test.cpp.)
#include "tspemu/tsp/layer_measure.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "layer_measure_checks.hpp"

namespace tspemu::tsp::testing {
namespace {

ref::ModelConfig paper_7b_config() {
  const cost::ModelShape m = cost::paper_7b(1, 1);
  ref::ModelConfig c;
  c.hidden = static_cast<int>(m.hidden);
  c.n_heads = static_cast<int>(m.n_heads);
  c.n_kv_heads = static_cast<int>(m.n_kv_heads);
  c.ffn = static_cast<int>(m.ffn);
  c.n_layers = 1;
  c.vocab = static_cast<int>(m.vocab);
  return c;
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

TEST(LayerMeasure, ThePaper7bModelsDryTrafficEqualsTheClosedFormsAtRealSizes) {
  const ref::ModelConfig model = paper_7b_config();
  const std::vector<cost::Strategy> strategies = {
      cost::Strategy::tsp(8),     cost::Strategy::tp(8),       cost::Strategy::megatron_sp(8),
      cost::Strategy::sp(8),      cost::Strategy::tp_sp(2, 4), cost::Strategy::tp_sp(4, 2),
      cost::Strategy::ulysses(8), cost::Strategy::ring(8)};
  const std::size_t before = resident_bytes();
  for (int S : {16 * 1024, 128 * 1024})
    for (const cost::Strategy& st : strategies) {
      SCOPED_TRACE(st.name() + " S=" + std::to_string(S));
      const LayerMeasure got = measure_layer(model, 1, S, st);
      expect_closed_form_traffic(got, cost::ModelShape::from(model, 1, S), st);
      // At least the rank's share of the layer input, in floats: the run measured the blocks.
      const std::size_t input = std::size_t{4} * S / st.ranks() * model.hidden;
      for (const RankLayerMeasure& r : got.ranks) EXPECT_GT(r.backward.peak, input);
    }
  EXPECT_LT(resident_bytes(), before + (std::size_t{256} << 20))
      << "dry runs of terabytes of buffers took memory";
}

}  // namespace
}  // namespace tspemu::tsp::testing
