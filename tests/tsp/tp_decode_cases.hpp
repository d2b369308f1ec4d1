// The shapes the TP-style decoders' tests run (tp_decoder_test.cpp, megatron_sp_decoder_test.cpp):
// small GQA models (L = 2, F = V = 96) with T | NKV — T = 2 and 4 on NH=8, NKV=4, T = 3 on NH=6,
// NKV=3, T = 8 on NH=16, NKV=8 — and KV duplication, T > NKV with NKV | T — T = 4 and 8 on NH=8,
// NKV=2 (2 and 4 copies of each KV head), T = 3 on NH=6, NKV=1 (MQA, 3 copies); the decode shape
// of a case and the planner's KV bytes of its ranks (every position of the B sequences, TP's
// cache). Test-only.
#pragma once

#include <cstdint>
#include <string>

#include "decode_test_support.hpp"
#include "tspemu/plan/decode_cost.hpp"
#include "tspemu/tsp/tspw_decoder.hpp"

namespace tspemu::tsp::testing {

struct TpCase {
  int T, NH, NKV, hidden;
  ref::ModelConfig model() const { return small_gqa_model(NH, NKV, hidden); }
};

inline std::string tp_case_name(const ::testing::TestParamInfo<TpCase>& i) {
  return "T" + std::to_string(i.param.T) + "_NH" + std::to_string(i.param.NH) + "_NKV" +
         std::to_string(i.param.NKV);
}

inline const TpCase kTpCases[] = {{2, 8, 4, 64}, {3, 6, 3, 48}, {4, 8, 4, 64}, {8, 16, 8, 64},
                                  {4, 8, 2, 64}, {8, 8, 2, 64}, {3, 6, 1, 48}};

inline DecodeShape tp_shape_for(const TpCase& c, int B, std::int64_t max_context) {
  return DecodeShape{
      .model = c.model(), .D = c.T, .batch = B, .max_context = max_context, .interleave = 1};
}

// The planner's KV cache bytes of a rank of `strategy` (TP's cache: one token shard): every
// position below max_context of the B sequences.
inline std::uint64_t tp_planner_kv_bytes(const TpCase& c, const cost::DecodeStrategy& strategy,
                                         const Prompts& prompts, std::int64_t max_context,
                                         std::uint64_t beta) {
  return planned_kv_bytes(c.model(), strategy, prompts, max_context, 1, 1, 0, beta);
}

}  // namespace tspemu::tsp::testing
