// Kernel and model properties other than gradients: attention against a scalar definition and
// under query sharding, matmul wrappers against loops, RoPE identities, initialisation, and
// determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"
#include "tspemu/reference/rope.hpp"

namespace tspemu::ref {
namespace {

using testing::random_vector;

// The definition, one query at a time, no blocking: softmax over visible keys, then weights · V.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v,
                                    const std::vector<std::int64_t>& qpos,
                                    const std::vector<std::int64_t>& kpos, const AttentionDims& d) {
  std::vector<double> out(q.size(), 0.0);
  const int group = d.NH / d.NKV;
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.NH; ++h) {
      const int g = h / group;
      for (int i = 0; i < d.Tq; ++i) {
        const double* qi = &q[((std::size_t(b) * d.Tq + i) * d.NH + h) * d.hs];
        std::vector<double> s(d.Tk, -std::numeric_limits<double>::infinity());
        double m = s[0];
        for (int j = 0; j < d.Tk; ++j) {
          if (kpos[j] > qpos[i]) continue;
          const double* kj = &k[((std::size_t(b) * d.Tk + j) * d.NKV + g) * d.hs];
          double acc = 0;
          for (int c = 0; c < d.hs; ++c) acc += qi[c] * kj[c];
          s[j] = acc / std::sqrt(double(d.hs));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int j = 0; j < d.Tk; ++j) z += kpos[j] <= qpos[i] ? std::exp(s[j] - m) : 0.0;
        double* oi = &out[((std::size_t(b) * d.Tq + i) * d.NH + h) * d.hs];
        for (int j = 0; j < d.Tk; ++j) {
          if (kpos[j] > qpos[i]) continue;
          const double p = std::exp(s[j] - m) / z;
          const double* vj = &v[((std::size_t(b) * d.Tk + j) * d.NKV + g) * d.hs];
          for (int c = 0; c < d.hs; ++c) oi[c] += p * vj[c];
        }
      }
    }
  }
  return out;
}

TEST(Attention, BlockedGemmForwardMatchesScalarDefinitionWithGqa) {
  const AttentionDims d{2, 260, 260, 4, 2, 8};
  std::vector<std::int64_t> pos(d.Tk);
  for (int t = 0; t < d.Tk; ++t) pos[t] = t;
  const auto q = random_vector(d.B * d.Tq * d.NH * d.hs, 1);
  const auto k = random_vector(d.B * d.Tk * d.NKV * d.hs, 2);
  const auto v = random_vector(d.B * d.Tk * d.NKV * d.hs, 3);
  std::vector<double> out(q.size()), lse(d.B * d.NH * d.Tq);
  causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), pos.data(),
                           pos.data(), d);
  const auto expect = naive_attention(q, k, v, pos, pos, d);
  const Verdict verdict = check_close64("attention out", out, expect, 1e-13);
  EXPECT_TRUE(verdict) << verdict.report;
}

// A rank holding a zigzag shard of the queries and the full gathered K/V must get exactly the
// rows the full computation gets for those tokens (up to GEMM blocking), forward and backward.
TEST(Attention, ZigzagQueryShardAgainstFullKeysEqualsFullAttentionRows) {
  const int Tfull = 16, D = 2, chunk = Tfull / (2 * D);
  const AttentionDims full{1, Tfull, Tfull, 2, 1, 4};
  std::vector<std::int64_t> pos(Tfull);
  for (int t = 0; t < Tfull; ++t) pos[t] = t;
  const auto q = random_vector(Tfull * full.NH * full.hs, 4);
  const auto k = random_vector(Tfull * full.NKV * full.hs, 5);
  const auto v = random_vector(Tfull * full.NKV * full.hs, 6);
  const auto dout = random_vector(q.size(), 7);
  std::vector<double> out(q.size()), lse(full.NH * Tfull);
  causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), pos.data(),
                           pos.data(), full);
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  causal_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                            v.data(), lse.data(), pos.data(), pos.data(), full);

  std::vector<double> dk_sum(k.size(), 0.0), dv_sum(v.size(), 0.0);
  const int row = full.NH * full.hs;
  for (int r = 0; r < D; ++r) {
    // zigzag: chunks r and 2D-1-r
    std::vector<std::int64_t> qpos;
    for (int i = 0; i < chunk; ++i) qpos.push_back(r * chunk + i);
    for (int i = 0; i < chunk; ++i) qpos.push_back((2 * D - 1 - r) * chunk + i);
    const int Tq = int(qpos.size());
    std::vector<double> ql(Tq * row), dol(Tq * row);
    for (int i = 0; i < Tq; ++i) {
      for (int c = 0; c < row; ++c) {
        ql[i * row + c] = q[qpos[i] * row + c];
        dol[i * row + c] = dout[qpos[i] * row + c];
      }
    }
    const AttentionDims local{1, Tq, Tfull, full.NH, full.NKV, full.hs};
    std::vector<double> ol(ql.size()), lsel(full.NH * Tq);
    causal_attention_forward(ol.data(), lsel.data(), ql.data(), k.data(), v.data(), qpos.data(),
                             pos.data(), local);
    std::vector<double> dql(ql.size()), dkl(k.size()), dvl(v.size());
    causal_attention_backward(dql.data(), dkl.data(), dvl.data(), dol.data(), ql.data(), k.data(),
                              v.data(), lsel.data(), qpos.data(), pos.data(), local);
    for (int i = 0; i < Tq; ++i) {
      for (int c = 0; c < row; ++c) {
        EXPECT_NEAR(ol[i * row + c], out[qpos[i] * row + c], 1e-13) << "rank " << r;
        EXPECT_NEAR(dql[i * row + c], dq[qpos[i] * row + c], 1e-13) << "rank " << r;
      }
    }
    for (std::size_t i = 0; i < dk.size(); ++i) {
      dk_sum[i] += dkl[i];
      dv_sum[i] += dvl[i];
    }
  }
  // The full dK, dV are the sum over ranks of their partial dK, dV (what a reduce-scatter does).
  for (std::size_t i = 0; i < dk.size(); ++i) {
    EXPECT_NEAR(dk_sum[i], dk[i], 1e-13);
    EXPECT_NEAR(dv_sum[i], dv[i], 1e-13);
  }
}

TEST(Attention, QueryThatSeesNoKeyGetsZeroOutputAndNoGradient) {
  const AttentionDims d{1, 1, 2, 1, 1, 2};
  const std::vector<std::int64_t> qpos = {0}, kpos = {1, 2};
  const std::vector<double> q = {1, 2}, k = {1, 1, 1, 1}, v = {3, 4, 5, 6}, dout = {1, 1};
  std::vector<double> out(2, 9.0), lse(1);
  causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), qpos.data(),
                           kpos.data(), d);
  EXPECT_EQ(out, (std::vector<double>{0, 0}));
  EXPECT_EQ(lse[0], -std::numeric_limits<double>::infinity());
  std::vector<double> dq(2, 9.0), dk(4, 9.0), dv(4, 9.0);
  causal_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                            v.data(), lse.data(), qpos.data(), kpos.data(), d);
  for (double x : dq) EXPECT_EQ(x, 0.0);
  for (double x : dk) EXPECT_EQ(x, 0.0);
  for (double x : dv) EXPECT_EQ(x, 0.0);
}

TEST(Matmul, WrappersMatchLoopsWithStridesAndAccumulate) {
  const int M = 5, N = 4, K = 3, ld = 7;  // operands embedded in wider rows
  const auto A = random_vector(std::size_t(std::max(M, K)) * ld, 8);
  const auto Bm = random_vector(std::size_t(std::max(N, K)) * ld, 9);
  const auto C0 = random_vector(std::size_t(M) * ld, 10);
  auto at = [&](const std::vector<double>& X, int r, int c) { return X[std::size_t(r) * ld + c]; };
  for (bool acc : {false, true}) {
    std::vector<double> nt = C0, nn = C0, tn = C0;
    matmul_nt(nt.data(), A.data(), Bm.data(), M, N, K, acc, ld, ld, ld);
    matmul_nn(nn.data(), A.data(), Bm.data(), M, N, K, acc, ld, ld, ld);
    matmul_tn(tn.data(), A.data(), Bm.data(), M, N, K, acc, ld, ld, ld);
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < N; ++j) {
        double e_nt = acc ? at(C0, i, j) : 0, e_nn = e_nt, e_tn = e_nt;
        for (int p = 0; p < K; ++p) {
          e_nt += at(A, i, p) * at(Bm, j, p);
          e_nn += at(A, i, p) * at(Bm, p, j);
          e_tn += at(A, p, i) * at(Bm, p, j);
        }
        EXPECT_NEAR(nt[i * ld + j], e_nt, 1e-14) << "nt " << i << "," << j;
        EXPECT_NEAR(nn[i * ld + j], e_nn, 1e-14) << "nn " << i << "," << j;
        EXPECT_NEAR(tn[i * ld + j], e_tn, 1e-14) << "tn " << i << "," << j;
      }
    }
    // Columns past N in each row are untouched.
    for (int i = 0; i < M; ++i) {
      for (int j = N; j < ld; ++j) EXPECT_EQ(nt[i * ld + j], C0[i * ld + j]);
    }
  }
}

TEST(Matmul, CountersRecordCallsAndFlops) {
  gemm_counters() = {};
  std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4);
  matmul_nt(c.data(), a.data(), b.data(), 2, 2, 3);
  EXPECT_EQ(gemm_counters().calls, 1);
  EXPECT_EQ(gemm_counters().flops, 2.0 * 2 * 2 * 3);
  EXPECT_EQ(c, (std::vector<float>{3, 3, 3, 3}));
}

TEST(Rope, PositionZeroIsIdentityAndBackwardInvertsForward) {
  const int B = 1, T = 3, NH = 2, hs = 8;
  const std::vector<std::int64_t> pos = {0, 5, 4096};
  const auto x = random_vector(B * T * NH * hs, 11);
  std::vector<double> y = x;
  rope_forward(y.data(), pos.data(), B, T, NH, hs, 10000.0);
  for (int i = 0; i < NH * hs; ++i) EXPECT_EQ(y[i], x[i]) << "position 0 must not rotate";
  rope_backward(y.data(), pos.data(), B, T, NH, hs, 10000.0);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14);
}

TEST(Rope, RotatesHalvesNotInterleavedPairs) {
  // hs = 4: dims (0, 2) rotate by pos * base^0, dims (1, 3) by pos * base^(-1/2).
  const std::vector<std::int64_t> pos = {1};
  std::vector<double> x = {1, 0, 0, 0};
  rope_forward(x.data(), pos.data(), 1, 1, 1, 4, 100.0);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-15);
  EXPECT_NEAR(x[2], std::sin(1.0), 1e-15);
  EXPECT_EQ(x[1], 0.0);
  EXPECT_EQ(x[3], 0.0);
  std::vector<double> y = {0, 1, 0, 0};
  rope_forward(y.data(), pos.data(), 1, 1, 1, 4, 100.0);
  EXPECT_NEAR(y[1], std::cos(0.1), 1e-15);
  EXPECT_NEAR(y[3], std::sin(0.1), 1e-15);
}

// The per-thread cos/sin table is reused only for the same positions, head size and base: any
// call's rotation equals that of a fresh thread, whatever came before.
TEST(Rope, EachCallRotatesByItsOwnPositionsHeadSizeAndBase) {
  const int T = 3, NH = 2;
  const std::vector<std::int64_t> a = {0, 5, 9}, b = {0, 5, 10}, shorter = {0, 5};
  const auto x = random_vector(T * NH * 8, 12);
  auto rotated = [&](const std::vector<std::int64_t>& pos, int hs, double base) {
    std::vector<double> y(x.begin(), x.begin() + std::ptrdiff_t(pos.size()) * NH * hs);
    rope_forward(y.data(), pos.data(), 1, int(pos.size()), NH, hs, base);
    return y;
  };
  auto on_fresh_thread = [&](const std::vector<std::int64_t>& pos, int hs, double base) {
    std::vector<double> y;
    std::thread([&] { y = rotated(pos, hs, base); }).join();
    return y;
  };
  const auto ya = rotated(a, 8, 100.0);
  EXPECT_EQ(rotated(b, 8, 100.0), on_fresh_thread(b, 8, 100.0));
  EXPECT_NE(rotated(b, 8, 100.0), ya);
  EXPECT_EQ(rotated(shorter, 8, 100.0), on_fresh_thread(shorter, 8, 100.0));
  EXPECT_EQ(rotated(a, 4, 100.0), on_fresh_thread(a, 4, 100.0));
  EXPECT_EQ(rotated(a, 8, 500.0), on_fresh_thread(a, 8, 500.0));
  EXPECT_EQ(rotated(a, 8, 100.0), ya);
}

TEST(Init, FloatAndDoubleModelsHoldTheSameValuesUpToOneRounding) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto wf = init_weights<float>(cfg, 123);
  const auto wd = init_weights<double>(cfg, 123);
  const auto pf = parameters(wf);
  const auto pd = parameters(wd);
  ASSERT_EQ(pf.size(), pd.size());
  for (std::size_t i = 0; i < pf.size(); ++i) {
    for (std::size_t j = 0; j < pf[i].data->size(); ++j) {
      ASSERT_EQ((*pf[i].data)[j], float((*pd[i].data)[j])) << pf[i].name << "[" << j << "]";
    }
  }
}

TEST(Init, SeedDeterminesModelAndTensorsDependOnlyOnSeedAndName) {
  ModelConfig cfg = testing::tiny_gqa_config();
  const auto a = init_weights<double>(cfg, 5);
  const auto b = init_weights<double>(cfg, 5);
  const auto c = init_weights<double>(cfg, 6);
  EXPECT_EQ(a.layers[1].wq, b.layers[1].wq);
  EXPECT_NE(a.layers[1].wq, c.layers[1].wq);
  EXPECT_NE(a.layers[0].wq, a.layers[1].wq);
  cfg.n_layers = 3;
  const auto deeper = init_weights<double>(cfg, 5);
  EXPECT_EQ(deeper.layers[1].w_up, a.layers[1].w_up);
  EXPECT_EQ(deeper.embed, a.embed);
  // The documented scale: N(0, 1/in) for Linear weights.
  double ss = 0;
  for (double x : a.layers[0].w_gate) ss += x * x;
  const double var = ss / double(a.layers[0].w_gate.size());
  EXPECT_NEAR(var * cfg.hidden, 1.0, 0.25);
}

TEST(Init, SplitMix64MatchesPublishedSequence) {
  // First outputs of splitmix64 seeded with 1234567 (Vigna's reference splitmix64.c).
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.next(), 6457827717110365317ULL);
  EXPECT_EQ(rng.next(), 3203168211198807973ULL);
}

TEST(Model, ForwardAndBackwardAreBitwiseDeterministic) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto w = init_weights<float>(cfg, 3);
  const auto tokens = testing::random_tokens(10, cfg.vocab, 1);
  const auto targets = testing::random_tokens(10, cfg.vocab, 2);
  const Batch batch{2, 5, tokens, targets, {}};
  ModelCache<float> c1, c2;
  ModelWeights<float> g1, g2;
  EXPECT_EQ(model_forward(w, batch, c1), model_forward(w, batch, c2));
  model_backward(w, batch, c1, g1);
  model_backward(w, batch, c2, g2);
  EXPECT_EQ(c1.logits, c2.logits);
  EXPECT_EQ(g1.layers[0].wk, g2.layers[0].wk);
  EXPECT_EQ(g1.embed, g2.embed);
}

TEST(Model, RejectsTokensOutsideTheVocabulary) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto w = init_weights<double>(cfg, 3);
  std::vector<std::int32_t> tokens = {0, 1, cfg.vocab}, targets = {0, 1, 2};
  ModelCache<double> c;
  EXPECT_THROW(model_forward(w, Batch{1, 3, tokens, targets, {}}, c), std::invalid_argument);
  tokens[2] = 0;
  targets[1] = -1;
  EXPECT_THROW(model_forward(w, Batch{1, 3, tokens, targets, {}}, c), std::invalid_argument);
}

// The fp32 reference is close to its own fp64 oracle: a sanity bound, the acceptance rule for
// parallel schedules is checked in the conformance test against PyTorch's fp32 as well.
TEST(Model, Fp32ReferenceTracksFp64OracleWithinFewUlpsOfScale) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto wd = init_weights<double>(cfg, 9);
  const auto wf = convert_weights<float>(wd);
  const auto tokens = testing::random_tokens(16, cfg.vocab, 1);
  const auto targets = testing::random_tokens(16, cfg.vocab, 2);
  const Batch batch{2, 8, tokens, targets, {}};
  ModelCache<double> cd;
  ModelCache<float> cf;
  const double ld = model_forward(wd, batch, cd), lf = model_forward(wf, batch, cf);
  EXPECT_NEAR(lf, ld, 1e-5 * std::fabs(ld));
  ModelWeights<double> gd;
  ModelWeights<float> gf;
  model_backward(wd, batch, cd, gd);
  model_backward(wf, batch, cf, gf);
  const auto s = measure(cf.logits, cd.logits);
  EXPECT_LT(s.max_abs, 64 * 0x1.0p-23 * s.oracle_max) << s.to_string();
  const auto pf = parameters(gf);
  const auto pd = parameters(gd);
  for (std::size_t i = 0; i < pf.size(); ++i) {
    const auto e = measure(*pf[i].data, *pd[i].data);
    EXPECT_LT(e.max_abs, 256 * 0x1.0p-23 * e.oracle_max) << pf[i].name << ": " << e.to_string();
  }
}

}  // namespace
}  // namespace tspemu::ref
