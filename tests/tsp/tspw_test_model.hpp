// The small GQA models the TSP-W decoder tests run at D = 2, 3, 4, 8 (g = 2, L = 2, F = V = 96,
// D | NH, NKV, F, V): NH = 8, NKV = 4 at D = 2 and 4; NH = 6, NKV = 3 at D = 3; NH = 16, NKV = 8
// at D = 8. Test-only.
#pragma once

#include "tspemu/reference/model_config.hpp"

namespace tspemu::tsp::testing {

inline ref::ModelConfig tspw_test_model(int D) {
  ref::ModelConfig c;
  c.vocab = 96;
  c.n_layers = 2;
  c.ffn = 96;
  c.rope_base = 500.0;
  c.n_heads = D == 3 ? 6 : (D == 8 ? 16 : 8);
  c.n_kv_heads = c.n_heads / 2;
  c.hidden = D == 3 ? 48 : 64;
  return c;
}

}  // namespace tspemu::tsp::testing
