// The precision policy (core/precision.hpp): the presets' fields as Megatron-LM's defaults state
// them, the refused combinations, and bytes per parameter equal to the planner's PrecisionModel
// for the same policy (so memory measured under a policy can be held to the planner's figure).
#include <gtest/gtest.h>

#include "tspemu/core/precision.hpp"
#include "tspemu/plan/cost_model.hpp"

namespace tspemu {
namespace {

using plan_precision = tsp::cost::PrecisionModel;

void expect_bytes(const PrecisionPolicy& p, const plan_precision& m) {
  EXPECT_EQ(p.weight_bytes(), m.weight) << p.name;
  EXPECT_EQ(p.gradient_bytes(), m.gradient) << p.name;
  EXPECT_EQ(p.master_bytes(), m.master) << p.name;
  EXPECT_EQ(p.moment_bytes(), m.moments) << p.name;
  EXPECT_EQ(p.activation_bytes(), m.activation) << p.name;
}

TEST(PrecisionPolicy, BytesPerParameterEqualThePlannersModel) {
  expect_bytes(PrecisionPolicy::fp32(), plan_precision::fp32_emulator());           // 4+4+0+8
  expect_bytes(PrecisionPolicy::megatron_bf16(), plan_precision::megatron_bf16());  // 2+4+4+8
  // --grad-reduce bf16: bf16 gradient buffers, as ZeRO's 2 + 2 + 12.
  expect_bytes(PrecisionPolicy::megatron_bf16().with_grad_reduce(NumType::bf16),
               plan_precision::mixed_bf16());
}

TEST(PrecisionPolicy, MegatronBf16KeepsAccumulationPointwiseAndGradientsInFp32) {
  constexpr PrecisionPolicy p = PrecisionPolicy::megatron_bf16();
  static_assert(p.storage == NumType::bf16 && p.activation_wire == NumType::bf16 &&
                p.weight_wire == NumType::bf16 && p.kv_wire == NumType::bf16);
  static_assert(p.gemm_accumulate == NumType::fp32 && p.pointwise == NumType::fp32);
  static_assert(p.main_grad == NumType::fp32 && p.grad_reduce_wire == NumType::fp32);
  static_assert(p.dkdv_wire == NumType::fp32 && p.master_copy && p.moments == NumType::fp32);
  constexpr PrecisionPolicy wire = p.with_grad_reduce(NumType::bf16);
  static_assert(wire.main_grad == NumType::bf16 && wire.grad_reduce_wire == NumType::bf16);
  EXPECT_EQ(p.conflict(), "");
  EXPECT_EQ(wire.conflict(), "");
  EXPECT_EQ(PrecisionPolicy::fp32().conflict(), "");
}

TEST(PrecisionPolicy, Bf16InAnFp32PolicyIsAConflictNamingTheField) {
  EXPECT_EQ(PrecisionPolicy::fp32().with_grad_reduce(NumType::bf16).conflict(),
            "main_grad bf16 with storage fp32");
  PrecisionPolicy p = PrecisionPolicy::fp32();
  p.kv_wire = NumType::bf16;
  EXPECT_EQ(p.conflict(), "kv_wire bf16 with storage fp32");
  p = PrecisionPolicy::megatron_bf16();
  p.gemm_accumulate = NumType::bf16;
  EXPECT_EQ(p.conflict(), "bf16 storage needs fp32 GEMM accumulation and pointwise ops");
  p = PrecisionPolicy::megatron_bf16();
  p.master_copy = false;
  EXPECT_EQ(p.conflict(), "bf16 storage needs an fp32 master copy of the weights");
}

TEST(PrecisionPolicy, NumTypeNamesParseBack) {
  for (NumType t : {NumType::fp32, NumType::bf16}) EXPECT_EQ(parse_num_type(num_type_name(t)), t);
  EXPECT_EQ(parse_num_type("fp16"), std::nullopt);
  EXPECT_EQ(parse_num_type("FP32"), std::nullopt);
  EXPECT_EQ(num_type_bytes(NumType::bf16), 2);
  EXPECT_EQ(num_type_bytes(NumType::fp32), 4);
}

}  // namespace
}  // namespace tspemu
