// PrecisionPolicy: the numeric type of every kind of tensor a training or inference run stores,
// computes in and sends, as data: tspemu's fp32 runs and Megatron-LM's bf16 mixed precision.
//
// What: one field per decision a mixed-precision run makes (../shared/BF16-NOTES.md §1, from
//   Megatron-LM's `--bf16` defaults): the storage of weights, activations and KV cache; GEMM
//   accumulation; the pointwise ops kept in fp32 (softmax, RMSNorm statistics, RoPE angles,
//   cross-entropy); the wire type of each family of collectives; the gradient accumulation
//   buffers; the master weights and the AdamW moments. The presets:
//   - fp32(): everything fp32, no master copy (AdamW updates the fp32 weights in place): what
//     tspemu computes today.
//   - megatron_bf16(): bf16 storage and TP/SP activation collectives (Megatron sends
//   `input.dtype`);
//     weight all-gather/broadcast/ring in bf16 (the param dtype); fp32 GEMM accumulation and
//     pointwise ops; fp32 gradient buffers reduced in fp32 (`--accumulate-allreduce-grads-in-fp32`,
//     automatic with bf16); context-parallel dK/dV in fp32 (ring-flash-attention); fp32 master
//     weights and moments.
//   with_grad_reduce(bf16) is Megatron's `--grad-reduce-in-bf16`: gradient buffers and their
//   reduction in bf16.
// Guarantees: conflict() is "" for every preset and names the fields that contradict each other
//   otherwise (a bf16 wire or buffer in a policy whose storage is fp32: that run would round fp32
//   values to bf16 in flight, which no anchor does). The byte counts per parameter
//   (weight_bytes ...) are the sizes of the fields' types, the figures the planner's
//   PrecisionModel states for the same policy (tests/plan/precision_policy_test.cpp).
// Cost: constexpr values; no allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace tspemu {

enum class NumType : std::uint8_t { fp32, bf16 };

constexpr int num_type_bytes(NumType t) {
  return t == NumType::fp32 ? 4 : 2;
}
constexpr const char* num_type_name(NumType t) {
  return t == NumType::fp32 ? "fp32" : "bf16";
}
// "fp32" or "bf16"; nullopt for anything else.
constexpr std::optional<NumType> parse_num_type(std::string_view s) {
  if (s == "fp32") return NumType::fp32;
  if (s == "bf16") return NumType::bf16;
  return std::nullopt;
}

struct PrecisionPolicy {
  const char* name = "fp32";
  NumType storage = NumType::fp32;           // weights the GEMMs read, activations, residual, KV
  NumType gemm_accumulate = NumType::fp32;   // a GEMM's sum of products
  NumType pointwise = NumType::fp32;         // softmax, lse, RMSNorm statistics, RoPE, loss
  NumType activation_wire = NumType::fp32;   // TP/SP fwd all-reduce/RS, dgrad, SP all-gather
  NumType weight_wire = NumType::fp32;       // weight broadcast, ring and all-gather
  NumType kv_wire = NumType::fp32;           // K/V all-gather and ring passes
  NumType dkdv_wire = NumType::fp32;         // context-parallel dK/dV reduction
  NumType main_grad = NumType::fp32;         // gradient accumulation buffers
  NumType grad_reduce_wire = NumType::fp32;  // weight-gradient reduce-scatter / all-reduce
  bool master_copy = false;                  // fp32 master weights apart from the stored ones
  NumType moments = NumType::fp32;           // AdamW m and v

  static constexpr PrecisionPolicy fp32() { return {}; }
  static constexpr PrecisionPolicy megatron_bf16() {
    PrecisionPolicy p;
    p.name = "bf16";
    p.storage = p.activation_wire = p.weight_wire = p.kv_wire = NumType::bf16;
    p.master_copy = true;
    return p;
  }
  // The policy with gradients accumulated and reduced in `t` (Megatron's --grad-reduce-in-bf16
  // for bf16).
  constexpr PrecisionPolicy with_grad_reduce(NumType t) const {
    PrecisionPolicy p = *this;
    p.main_grad = p.grad_reduce_wire = t;
    return p;
  }

  // Bytes per parameter and per activation element.
  constexpr int weight_bytes() const { return num_type_bytes(storage); }
  constexpr int gradient_bytes() const { return num_type_bytes(main_grad); }
  constexpr int master_bytes() const { return master_copy ? 4 : 0; }
  constexpr int moment_bytes() const { return 2 * num_type_bytes(moments); }
  constexpr int activation_bytes() const { return num_type_bytes(storage); }

  // "" when consistent; otherwise which fields contradict which, e.g. "grad_reduce_wire bf16 with
  // storage fp32".
  std::string conflict() const {
    if (storage == NumType::bf16) {
      if (gemm_accumulate != NumType::fp32 || pointwise != NumType::fp32)
        return "bf16 storage needs fp32 GEMM accumulation and pointwise ops";
      if (!master_copy) return "bf16 storage needs an fp32 master copy of the weights";
      return "";
    }
    for (const auto& [field, t] :
         {std::pair<const char*, NumType>{"activation_wire", activation_wire},
          {"weight_wire", weight_wire},
          {"kv_wire", kv_wire},
          {"dkdv_wire", dkdv_wire},
          {"main_grad", main_grad},
          {"grad_reduce_wire", grad_reduce_wire},
          {"gemm_accumulate", gemm_accumulate},
          {"pointwise", pointwise},
          {"moments", moments}})
      if (t == NumType::bf16) return std::string(field) + " bf16 with storage fp32";
    return "";
  }
};

}  // namespace tspemu
