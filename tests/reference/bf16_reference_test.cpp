// The bf16 reference (StorageRounding::bf16(), storage_rounding.hpp): one layer's forward and
// backward store bf16 at the listed points and keep fp32 weight gradients; fp32 storage is the
// reference without a policy, bit for bit; the rounding is visible in the error against the fp64
// oracle (double on the same bf16-rounded weights and inputs).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "test_util.hpp"
#include "tspemu/core/bf16.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"

namespace tspemu::ref {
namespace {

// One layer's results under a storage policy.
struct Bf16RefLayerRun {
  std::vector<float> y, dx;
  LayerWeights<float> grads;
  LayerCache<float> cache;
};

struct Bf16RefProblem {
  ModelConfig cfg = testing::tiny_gqa_config();
  int B = 2, T = 40;
  std::vector<std::int64_t> positions;
  LayerWeights<float> w;  // bf16-representable (a bf16 copy of the master)
  std::vector<float> x, dy;

  Bf16RefProblem() {
    for (int t = 0; t < T; ++t) positions.push_back(t);
    w = convert_weights<float>(init_weights<double>(cfg, 71)).layers[0];
    for (auto& [name, v] : w.named()) StorageRounding::bf16().store(*v);
    const std::size_t n = std::size_t(B) * T * cfg.hidden;
    for (const char* which : {"x", "dy"}) {
      std::vector<float>& to = std::string(which) == "x" ? x : dy;
      for (double d : normal_stream(72, which, n)) to.push_back(round_to_bf16(float(d)));
    }
  }

  Bf16RefLayerRun run(StorageRounding s) const {
    Bf16RefLayerRun r;
    r.y.resize(x.size());
    r.dx.resize(x.size());
    r.grads = LayerWeights<float>::zeros(cfg);
    layer_forward(cfg, w, x.data(), r.y.data(), positions.data(), B, T, r.cache, s);
    layer_backward(cfg, w, x.data(), dy.data(), r.dx.data(), positions.data(), B, T, r.cache,
                   r.grads, s);
    return r;
  }
};

bool holds_only_bf16(const std::vector<float>& v) {
  for (float f : v)
    if (round_to_bf16(f) != f) return false;
  return true;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Bf16Reference, Fp32StorageIsTheReferenceWithoutAPolicyBitForBit) {
  const Bf16RefProblem p;
  Bf16RefLayerRun plain;
  plain.y.resize(p.x.size());
  plain.dx.resize(p.x.size());
  plain.grads = LayerWeights<float>::zeros(p.cfg);
  layer_forward(p.cfg, p.w, p.x.data(), plain.y.data(), p.positions.data(), p.B, p.T, plain.cache);
  layer_backward(p.cfg, p.w, p.x.data(), p.dy.data(), plain.dx.data(), p.positions.data(), p.B, p.T,
                 plain.cache, plain.grads);
  const Bf16RefLayerRun fp32 = p.run(StorageRounding::fp32());
  EXPECT_TRUE(same_bits(plain.y, fp32.y));
  EXPECT_TRUE(same_bits(plain.dx, fp32.dx));
  for (std::size_t i = 0; i < 9; ++i)
    EXPECT_TRUE(same_bits(*plain.grads.named()[i].second, *fp32.grads.named()[i].second))
        << kLayerTensors[i].name;
  // And fp32 storage stores nothing bf16: the fp32 layer's activations carry more than 8 bits.
  EXPECT_FALSE(holds_only_bf16(fp32.y));
  EXPECT_FALSE(holds_only_bf16(fp32.cache.attn.q));
}

TEST(Bf16Reference, StoresBf16AtTheRoundingPointsAndKeepsFp32Statistics) {
  const Bf16RefLayerRun r = Bf16RefProblem().run(StorageRounding::bf16());
  const auto& a = r.cache.attn;
  const auto& m = r.cache.mlp;
  for (const auto* t :
       {&r.y, &r.dx, &r.cache.mid, &a.xn, &a.q, &a.k, &a.v, &a.att, &m.xn, &m.gate, &m.up, &m.h})
    EXPECT_TRUE(holds_only_bf16(*t));
  // Statistics and weight gradients stay fp32.
  EXPECT_FALSE(holds_only_bf16(a.lse));
  EXPECT_FALSE(holds_only_bf16(a.rstd));
  for (const auto& [name, g] : r.grads.named()) EXPECT_FALSE(holds_only_bf16(*g)) << name;
}

TEST(Bf16Reference, RoundingShowsAgainstTheOracleOnEveryTensor) {
  // The oracle: double on the same bf16 weights and inputs, no intermediate rounding.
  const Bf16RefProblem p;
  LayerWeights<double> w64;
  for (std::size_t i = 0; i < 9; ++i) {
    const auto& src = *p.w.named()[i].second;
    w64.named()[i].second->assign(src.begin(), src.end());
  }
  const std::vector<double> x64(p.x.begin(), p.x.end()), dy64(p.dy.begin(), p.dy.end());
  std::vector<double> y64(x64.size()), dx64(x64.size());
  LayerWeights<double> g64 = LayerWeights<double>::zeros(p.cfg);
  LayerCache<double> c64;
  layer_forward(p.cfg, w64, x64.data(), y64.data(), p.positions.data(), p.B, p.T, c64,
                StorageRounding::bf16());  // ignored for double
  layer_backward(p.cfg, w64, x64.data(), dy64.data(), dx64.data(), p.positions.data(), p.B, p.T,
                 c64, g64, StorageRounding::bf16());
  const Bf16RefLayerRun r32 = p.run(StorageRounding::fp32());
  const Bf16RefLayerRun r16 = p.run(StorageRounding::bf16());
  // bf16 storage keeps 8 significant bits against fp32's 24: its error is orders of magnitude
  // above the fp32 reference's (2^16 in unit roundoff; at least 2^6 asserted, per tensor).
  auto ratio = [](const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<double>& o) {
    return measure(a, o).max_abs / measure(b, o).max_abs;
  };
  EXPECT_GT(ratio(r16.y, r32.y, y64), 64.0);
  EXPECT_GT(ratio(r16.dx, r32.dx, dx64), 64.0);
  for (std::size_t i = 0; i < 9; ++i)
    EXPECT_GT(
        ratio(*r16.grads.named()[i].second, *r32.grads.named()[i].second, *g64.named()[i].second),
        64.0)
        << kLayerTensors[i].name;
  // The double instantiation ignores the policy: it is the oracle either way.
  std::vector<double> y64b(x64.size());
  LayerCache<double> c64b;
  layer_forward(p.cfg, w64, x64.data(), y64b.data(), p.positions.data(), p.B, p.T, c64b);
  EXPECT_EQ(std::memcmp(y64.data(), y64b.data(), y64.size() * sizeof(double)), 0);
}

}  // namespace
}  // namespace tspemu::ref
