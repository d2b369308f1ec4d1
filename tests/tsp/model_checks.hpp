// The whole-model tests' one check (tsp_model_test.cpp, mesh_model_test.cpp): a parallel model's
// loss and every parameter gradient against the dense reference model run on the same batch in
// float and in double (the fp64 oracle), by the oracle rule of reference/numerics.hpp.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"

namespace tspemu::tsp::testing {

// loss: the parallel model's (rank 0's); grads: its gradients gathered into full-size tensors.
// The reference runs w32 and its exact double copy on tokens/targets [B, S].
inline void expect_model_passes_oracle_rule(double loss, const ref::ModelWeights<float>& grads,
                                            const ref::ModelWeights<float>& w32, int B, int S,
                                            const std::vector<std::int32_t>& tokens,
                                            const std::vector<std::int32_t>& targets, double k) {
  const auto w64 = ref::convert_weights<double>(w32);
  const ref::Batch batch{B, S, tokens, targets, {}};
  ref::ModelCache<double> c64;
  ref::ModelCache<float> c32;
  ref::ModelWeights<double> g64;
  ref::ModelWeights<float> g32;
  const double loss64 = ref::model_forward(w64, batch, c64);
  const double loss32 = ref::model_forward(w32, batch, c32);
  ref::model_backward(w64, batch, c64, g64);
  ref::model_backward(w32, batch, c32, g32);
  const auto v = ref::check_close("loss", std::vector<float>{static_cast<float>(loss)},
                                  std::vector<float>{static_cast<float>(loss32)},
                                  std::vector<double>{loss64}, k);
  EXPECT_TRUE(v) << v.report;
  const auto cand = ref::parameters(grads);
  const auto r32 = ref::parameters(static_cast<const ref::ModelWeights<float>&>(g32));
  const auto o64 = ref::parameters(static_cast<const ref::ModelWeights<double>&>(g64));
  ASSERT_EQ(cand.size(), o64.size());
  for (std::size_t i = 0; i < cand.size(); ++i) {
    const auto vi = ref::check_close(cand[i].name, *cand[i].data, *r32[i].data, *o64[i].data, k);
    EXPECT_TRUE(vi) << vi.report;
  }
}

}  // namespace tspemu::tsp::testing
