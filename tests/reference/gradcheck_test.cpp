// Finite-difference gradient checks, in double, for every kernel, every block, and the whole model
// (every parameter kind and the inputs).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/cross_entropy.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/reference/silu_mul.hpp"

namespace tspemu::ref {
namespace {

using testing::dot;
using testing::GradCheck;
using testing::random_vector;

TEST(GradCheck, RmsnormInputAndWeight) {
  const int N = 3, C = 7;
  std::vector<double> x = random_vector(N * C, 1), w = random_vector(C, 2, 0.3);
  for (double& v : w) v += 1;
  const std::vector<double> r = random_vector(N * C, 3);
  auto loss = [&] {
    std::vector<double> y(N * C), rstd(N);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    return dot(y, r);
  };
  std::vector<double> y(N * C), rstd(N), dx(N * C), dw(C, 0.0);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  GradCheck{}.run("x", x, dx, loss);
  GradCheck{}.run("w", w, dw, loss);
}

TEST(GradCheck, RopeBackwardIsTheAdjointAtArbitraryPositions) {
  const int B = 2, T = 3, NH = 2, hs = 6;
  const std::vector<std::int64_t> pos = {7, 0, 123456};
  std::vector<double> x = random_vector(B * T * NH * hs, 4);
  const std::vector<double> r = random_vector(x.size(), 5);
  auto loss = [&] {
    std::vector<double> y = x;
    rope_forward(y.data(), pos.data(), B, T, NH, hs, 10000.0);
    return dot(y, r);
  };
  std::vector<double> dx = r;
  rope_backward(dx.data(), pos.data(), B, T, NH, hs, 10000.0);
  GradCheck{}.run("x", x, dx, loss);
}

TEST(GradCheck, SiluMulBothInputs) {
  const std::size_t n = 11;
  std::vector<double> g = random_vector(n, 6, 2.0), u = random_vector(n, 7);
  const std::vector<double> r = random_vector(n, 8);
  auto loss = [&] {
    std::vector<double> h(n);
    silu_mul_forward(h.data(), g.data(), u.data(), n);
    return dot(h, r);
  };
  std::vector<double> dg(n), du(n);
  silu_mul_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n);
  GradCheck{}.run("gate", g, dg, loss);
  GradCheck{}.run("up", u, du, loss);
}

TEST(GradCheck, CrossEntropyLogits) {
  const int N = 4, V = 5;
  std::vector<double> logits = random_vector(N * V, 9, 2.0);
  const std::vector<std::int32_t> targets = {0, 4, 2, 2};
  auto loss = [&] { return cross_entropy_forward(logits.data(), targets.data(), N, V); };
  std::vector<double> d(N * V);
  cross_entropy_backward(d.data(), logits.data(), targets.data(), N, V);
  GradCheck{}.run("logits", logits, d, loss);
}

// Local queries at scattered global positions against keys in a shuffled order, GQA, Tq != Tk,
// and one query (position 1) that precedes every key and so sees none.
TEST(GradCheck, AttentionLocalQueriesAgainstGatheredKeysWithGqa) {
  const AttentionDims d{2, 4, 6, 4, 2, 4};
  const std::vector<std::int64_t> qpos = {9, 4, 1, 6};
  const std::vector<std::int64_t> kpos = {5, 2, 9, 3, 8, 4};
  std::vector<double> q = random_vector(d.B * d.Tq * d.NH * d.hs, 10);
  std::vector<double> k = random_vector(d.B * d.Tk * d.NKV * d.hs, 11);
  std::vector<double> v = random_vector(d.B * d.Tk * d.NKV * d.hs, 12);
  const std::vector<double> r = random_vector(q.size(), 13);
  std::vector<double> out(q.size()), lse(d.B * d.NH * d.Tq);
  auto loss = [&] {
    causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), qpos.data(),
                             kpos.data(), d);
    return dot(out, r);
  };
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  causal_attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(),
                            lse.data(), qpos.data(), kpos.data(), d);
  GradCheck{}.run("q", q, dq, loss);
  GradCheck{}.run("k", k, dk, loss);
  GradCheck{}.run("v", v, dv, loss);
}

// More queries than one GEMM block (128), so the block loop and key-prefix skipping are covered.
TEST(GradCheck, AttentionAcrossSeveralQueryBlocks) {
  const AttentionDims d{1, 300, 300, 2, 1, 4};
  std::vector<std::int64_t> pos(300);
  for (int t = 0; t < 300; ++t) pos[t] = t;
  std::vector<double> q = random_vector(d.Tq * d.NH * d.hs, 14);
  std::vector<double> k = random_vector(d.Tk * d.NKV * d.hs, 15);
  std::vector<double> v = random_vector(d.Tk * d.NKV * d.hs, 16);
  const std::vector<double> r = random_vector(q.size(), 17);
  std::vector<double> out(q.size()), lse(d.NH * d.Tq);
  auto loss = [&] {
    causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), pos.data(),
                             pos.data(), d);
    return dot(out, r);
  };
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  causal_attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(),
                            lse.data(), pos.data(), pos.data(), d);
  const GradCheck check{.max_checks = 40};
  check.run("q", q, dq, loss);
  check.run("k", k, dk, loss);
  check.run("v", v, dv, loss);
}

// Every parameter of a layer plus the block input, through attention, MLP, and the whole layer.
// Positions are a shuffled, offset set so RoPE and the mask use them, not the row index.
class BlockGradCheck : public ::testing::Test {
 protected:
  ModelConfig cfg = testing::tiny_gqa_config();
  static constexpr int B = 2, T = 5;
  std::vector<std::int64_t> pos = {12, 10, 14, 11, 13};
  LayerWeights<double> w = init_weights<double>(cfg, 42).layers[0];
  std::vector<double> x = random_vector(B * T * cfg.hidden, 18);
  std::vector<double> r = random_vector(B * T * cfg.hidden, 19);

  template <class Fwd, class Bwd>
  void check_all(Fwd forward, Bwd backward, bool attention, bool mlp) {
    auto loss = [&] {
      std::vector<double> y(x.size());
      forward(y);
      return dot(y, r);
    };
    std::vector<double> dx(x.size());
    LayerWeights<double> g = LayerWeights<double>::zeros(cfg);
    backward(dx, g);
    GradCheck{}.run("x", x, dx, loss);
    if (attention) {
      GradCheck{}.run("input_layernorm", w.input_norm, g.input_norm, loss);
      GradCheck{}.run("q_proj", w.wq, g.wq, loss);
      GradCheck{}.run("k_proj", w.wk, g.wk, loss);
      GradCheck{}.run("v_proj", w.wv, g.wv, loss);
      GradCheck{}.run("o_proj", w.wo, g.wo, loss);
    }
    if (mlp) {
      GradCheck{}.run("post_attention_layernorm", w.post_norm, g.post_norm, loss);
      GradCheck{}.run("gate_proj", w.w_gate, g.w_gate, loss);
      GradCheck{}.run("up_proj", w.w_up, g.w_up, loss);
      GradCheck{}.run("down_proj", w.w_down, g.w_down, loss);
    }
  }
};

TEST_F(BlockGradCheck, AttentionBlockParametersAndInput) {
  check_all(
      [&](std::vector<double>& y) {
        AttentionCache<double> c;
        attention_block_forward(cfg, w, x.data(), y.data(), pos.data(), B, T, c);
      },
      [&](std::vector<double>& dx, LayerWeights<double>& g) {
        AttentionCache<double> c;
        std::vector<double> y(x.size());
        attention_block_forward(cfg, w, x.data(), y.data(), pos.data(), B, T, c);
        attention_block_backward(cfg, w, x.data(), r.data(), dx.data(), pos.data(), B, T, c, g);
      },
      true, false);
}

TEST_F(BlockGradCheck, MlpBlockParametersAndInput) {
  check_all(
      [&](std::vector<double>& y) {
        MlpCache<double> c;
        mlp_block_forward(cfg, w, x.data(), y.data(), B, T, c);
      },
      [&](std::vector<double>& dx, LayerWeights<double>& g) {
        MlpCache<double> c;
        std::vector<double> y(x.size());
        mlp_block_forward(cfg, w, x.data(), y.data(), B, T, c);
        mlp_block_backward(cfg, w, x.data(), r.data(), dx.data(), B, T, c, g);
      },
      false, true);
}

TEST_F(BlockGradCheck, LayerParametersAndInput) {
  check_all(
      [&](std::vector<double>& y) {
        LayerCache<double> c;
        layer_forward(cfg, w, x.data(), y.data(), pos.data(), B, T, c);
      },
      [&](std::vector<double>& dx, LayerWeights<double>& g) {
        LayerCache<double> c;
        std::vector<double> y(x.size());
        layer_forward(cfg, w, x.data(), y.data(), pos.data(), B, T, c);
        layer_backward(cfg, w, x.data(), r.data(), dx.data(), pos.data(), B, T, c, g);
      },
      true, true);
}

// The whole model: every named parameter (embedding, all layers, final norm, head) for an untied
// GQA config and a tied config, plus the gradient w.r.t. the embedding output.
void check_model(const ModelConfig& cfg) {
  const int B = 2, T = 5;
  ModelWeights<double> w = init_weights<double>(cfg, 7);
  const auto tokens = testing::random_tokens(B * T, cfg.vocab, 20);
  const auto targets = testing::random_tokens(B * T, cfg.vocab, 21);
  const Batch batch{B, T, tokens, targets, {}};
  ModelCache<double> cache;
  auto loss = [&] { return model_forward(w, batch, cache); };
  loss();
  ModelWeights<double> g;
  std::vector<double> d_embedded;
  model_backward(w, batch, cache, g, &d_embedded);
  auto params = parameters(w);
  auto grads = parameters(g);
  ASSERT_EQ(params.size(), grads.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i].name);
    GradCheck{}.run(params[i].name, *params[i].data, *grads[i].data, loss);
  }
  // The input gradient d_embedded ([B, T, C], w.r.t. the embedding output) has no perturbable
  // input of its own; it is checked through the embedding gradient verified above: scattering
  // its rows by token must give exactly that gradient (untied, where the head adds nothing).
  std::vector<double> from_rows(w.embed.size(), 0.0);
  for (int n = 0; n < B * T; ++n) {
    for (int c = 0; c < cfg.hidden; ++c) {
      from_rows[std::size_t(tokens[n]) * cfg.hidden + c] +=
          d_embedded[std::size_t(n) * cfg.hidden + c];
    }
  }
  if (cfg.tie_embeddings) return;  // the tied embedding gradient also holds the head's share
  for (std::size_t i = 0; i < from_rows.size(); ++i) EXPECT_NEAR(from_rows[i], g.embed[i], 1e-14);
}

TEST(GradCheck, ModelUntiedGqaEveryParameter) {
  check_model(testing::tiny_gqa_config());
}
TEST(GradCheck, ModelTiedEmbeddingEveryParameter) {
  check_model(testing::tiny_tied_config());
}

}  // namespace
}  // namespace tspemu::ref
