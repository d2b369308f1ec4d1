// Reference decoding (decode.hpp, kv_cache.hpp) against the cache-free forward (model_forward over
// the whole sequence), batch independence, and input errors.
//
// Tolerance of cached vs cache-free in double: both run the same kernels on the same values; what
// differs is only how the GEMMs are blocked (M = one row per sequence in decode vs M = the whole
// sequence in the forward, the attention's key range per call), which may reorder the sums of a
// dot product of length n <= max(C, F, S). Two orders of one dot product differ by at most
// 2·γ_n·Σ|a_i b_i| (γ_n = n·u/(1 - n·u), u = 2^-53; Higham, Accuracy and Stability, §3.1); with
// n <= 64 and Σ|a b| within a few times the result's magnitude for these O(1) activations, one
// GEMM differs by <= ~1e-14 relative. The pass chains ~6 such products per layer over L = 2 layers
// plus the head, and RMSNorm/softmax/RoPE have O(1) condition numbers at these sizes, so the
// logits may differ by ~1e-13 of their largest magnitude: the rtol below. (Measured: printed with
// TSPEMU_VERBOSE=1; see the report of issue 36.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/reference/numerics.hpp"

namespace tspemu::ref {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr double kCachedRtol = 1e-13;  // derived above
constexpr int kNew = 9;                // new tokens per sequence

using Prompts = std::vector<std::vector<std::int32_t>>;

ModelConfig shape(int NH, int NKV) {
  ModelConfig c;
  c.vocab = 29;
  c.hidden = 4 * NH;  // hs = 4
  c.n_layers = 2;
  c.n_heads = NH;
  c.n_kv_heads = NKV;
  c.ffn = 40;
  c.rope_base = 500.0;
  return c;
}

// Prompt lengths 1, 7 (prime) and 4: different lengths in one batch, a one-token prompt.
Prompts prompts_for(const ModelConfig& cfg) {
  Prompts p;
  int seed = 70;
  for (const int len : {1, 7, 4}) p.push_back(testing::random_tokens(len, cfg.vocab, seed++));
  return p;
}

// model_forward over one whole sequence; returns its logits [T, V] and fills `cache`.
template <class T>
std::vector<T> full_forward(const ModelWeights<T>& w, const std::vector<std::int32_t>& seq,
                            ModelCache<T>& cache) {
  const std::vector<std::int32_t> targets(seq.size(), 0);
  model_forward(w, Batch{1, int(seq.size()), seq, targets, {}}, cache);
  return cache.logits;
}

template <class T>
std::vector<T> row(const std::vector<T>& m, std::size_t r, std::size_t n) {
  return std::vector<T>(m.begin() + r * n, m.begin() + (r + 1) * n);
}

// The prompt of sequence b followed by its first `i` generated tokens.
std::vector<std::int32_t> sequence_upto(const Prompts& prompts, const Generation<double>& g, int b,
                                        int i) {
  std::vector<std::int32_t> s = prompts[b];
  s.insert(s.end(), g.tokens[b].begin(), g.tokens[b].begin() + i);
  return s;
}

// A greedy double run of the (NH, NKV) shape on prompts_for's batch.
class DecodeShapes : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  const ModelConfig cfg = shape(GetParam().first, GetParam().second);
  const ModelWeights<double> w = init_weights<double>(cfg, 11);
  const Prompts prompts = prompts_for(cfg);
  Generation<double> run() const {
    Sampler greedy = Sampler::greedy();
    return generate(w, prompts, kNew, greedy);
  }
};

TEST_P(DecodeShapes, EveryStepsLogitsEqualTheCacheFreeForwardInDouble) {
  const Generation<double> g = run();
  ASSERT_EQ(g.logits.size(), std::size_t(kNew));
  const std::size_t V = cfg.vocab;
  double worst = 0;
  for (int b = 0; b < int(prompts.size()); ++b) {
    // One forward over the prompt and every fed token gives each step's logits at its row.
    ModelCache<double> fc;
    const auto seq = sequence_upto(prompts, g, b, kNew - 1);
    const auto full = full_forward(w, seq, fc);
    for (int i = 0; i < kNew; ++i) {
      const std::size_t pos = prompts[b].size() - 1 + i;
      const auto oracle = row(full, pos, V);
      const auto cached = row(g.logits[i], b, V);
      const Verdict v =
          check_close64("seq " + std::to_string(b) + " step " + std::to_string(i) + " logits",
                        cached, oracle, kCachedRtol);
      EXPECT_TRUE(v) << v.report;
      worst = std::max(worst, v.candidate.max_abs / v.candidate.oracle_max);
      EXPECT_EQ(g.tokens[b][i], argmax_first(oracle.data(), int(V)))
          << "seq " << b << " step " << i;
    }
  }
  if (std::getenv("TSPEMU_VERBOSE"))
    std::printf("%s: max |cached - full| / max|full| = %.3g\n", cfg.to_string().c_str(), worst);
}

TEST_P(DecodeShapes, CacheHoldsTheRotatedKeysAndValuesOfEveryPosition) {
  const Generation<double> g = run();
  const std::size_t kvd = cfg.kv_dim();
  for (int b = 0; b < int(prompts.size()); ++b) {
    const auto seq = sequence_upto(prompts, g, b, kNew - 1);
    ASSERT_EQ(g.cache.length(b), std::int64_t(seq.size()));
    ModelCache<double> fc;
    full_forward(w, seq, fc);
    for (int l = 0; l < cfg.n_layers; ++l) {
      ASSERT_EQ(g.cache.length(l, b), std::int64_t(seq.size()));
      for (std::size_t p = 0; p < seq.size(); ++p) {
        const auto k = g.cache.k(l, b, std::int64_t(p)), v = g.cache.v(l, b, std::int64_t(p));
        const std::string at = "layer " + std::to_string(l) + " seq " + std::to_string(b) +
                               " pos " + std::to_string(p);
        const Verdict vk = check_close64(at + " k", {k.begin(), k.end()},
                                         row(fc.layers[l].attn.k, p, kvd), kCachedRtol);
        const Verdict vv = check_close64(at + " v", {v.begin(), v.end()},
                                         row(fc.layers[l].attn.v, p, kvd), kCachedRtol);
        EXPECT_TRUE(vk) << vk.report;
        EXPECT_TRUE(vv) << vv.report;
      }
    }
  }
  EXPECT_EQ(g.cache.bytes(),
            2 * cfg.n_layers * kvd * sizeof(double) *
                std::size_t(g.cache.length(0) + g.cache.length(1) + g.cache.length(2)));
}

// MHA, GQA with groups of 2 and of 3, MQA (one K/V head).
INSTANTIATE_TEST_SUITE_P(Gqa, DecodeShapes,
                         ::testing::Values(std::pair{4, 4}, std::pair{4, 2}, std::pair{6, 2},
                                           std::pair{4, 1}),
                         [](const auto& info) {
                           return "NH" + std::to_string(info.param.first) + "_NKV" +
                                  std::to_string(info.param.second);
                         });

// fp32 decode against the fp64 oracle under the project's rule (numerics.hpp), teacher-forced on
// the oracle's tokens so that a token flip cannot compound: candidate = fp32 cached decode,
// reference = fp32 cache-free forward, oracle = fp64 cache-free forward.
TEST(DecodeFloat, EveryStepsLogitsPassTheFp32RuleAgainstTheOracle) {
  const ModelConfig cfg = shape(4, 2);
  const auto w64 = init_weights<double>(cfg, 13);
  const auto w32 = convert_weights<float>(w64);
  const Prompts prompts = prompts_for(cfg);
  Sampler greedy = Sampler::greedy();
  const Generation<double> g = generate(w64, prompts, kNew, greedy);
  const std::size_t V = cfg.vocab;
  const int B = int(prompts.size());
  Prefill<float> pre = prefill(w32, prompts);
  std::vector<std::vector<float>> steps{pre.logits};
  for (int i = 1; i < kNew; ++i) {
    std::vector<std::int32_t> fed(B);
    for (int b = 0; b < B; ++b) fed[b] = g.tokens[b][i - 1];
    steps.push_back(decode_step(w32, pre.cache, std::span<const std::int32_t>(fed)));
  }
  for (int b = 0; b < B; ++b) {
    const auto seq = sequence_upto(prompts, g, b, kNew - 1);
    ModelCache<double> c64;
    ModelCache<float> c32;
    const auto oracle = full_forward(w64, seq, c64);
    const auto ref32 = full_forward(w32, seq, c32);
    for (int i = 0; i < kNew; ++i) {
      const std::size_t pos = prompts[b].size() - 1 + i;
      const Verdict v =
          check_close("fp32 seq " + std::to_string(b) + " step " + std::to_string(i) + " logits",
                      row(steps[i], b, V), row(ref32, pos, V), row(oracle, pos, V), /*k=*/2.0);
      EXPECT_TRUE(v) << v.report;
    }
  }
}

TEST(DecodeBatch, ASequencesTokensAndLogitsDoNotDependOnItsBatchMates) {
  const ModelConfig cfg = shape(6, 2);
  const auto w = init_weights<double>(cfg, 14);
  const Prompts prompts = prompts_for(cfg);
  Sampler greedy = Sampler::greedy();
  const Generation<double> together = generate(w, prompts, kNew, greedy);
  const Prompts reversed(prompts.rbegin(), prompts.rend());
  const Generation<double> rev = generate(w, reversed, kNew, greedy);
  const int B = int(prompts.size());
  const std::size_t V = cfg.vocab;
  for (int b = 0; b < B; ++b) {
    const Generation<double> alone = generate(w, Prompts{prompts[b]}, kNew, greedy);
    EXPECT_EQ(alone.tokens[0], together.tokens[b]) << "seq " << b;
    EXPECT_EQ(rev.tokens[B - 1 - b], together.tokens[b]) << "seq " << b;
    for (int i = 0; i < kNew; ++i) {
      // Bitwise: the same doubles, not merely close.
      EXPECT_EQ(alone.logits[i], row(together.logits[i], b, V)) << "seq " << b << " step " << i;
      EXPECT_EQ(row(rev.logits[i], B - 1 - b, V), row(together.logits[i], b, V))
          << "seq " << b << " step " << i;
    }
  }
}

TEST(DecodeBatch, RepeatedRunsAreBitwiseIdentical) {
  const ModelConfig cfg = shape(4, 2);
  const auto w = init_weights<float>(cfg, 15);
  Sampler a = Sampler::greedy(), b = Sampler::greedy();
  const auto ga = generate(w, prompts_for(cfg), kNew, a);
  const auto gb = generate(w, prompts_for(cfg), kNew, b);
  EXPECT_EQ(ga.tokens, gb.tokens);
  EXPECT_EQ(ga.logits, gb.logits);
}

// ---- input errors: each names the offending value

class DecodeErrors : public ::testing::Test {
 protected:
  ModelConfig cfg = shape(4, 2);
  ModelWeights<double> w = init_weights<double>(cfg, 16);
};

TEST_F(DecodeErrors, AnEmptyPromptNamesItsSequence) {
  EXPECT_THAT(
      [&] {
        prefill(w, Prompts{{1, 2}, {}});
      },
      ThrowsMessage<std::invalid_argument>(HasSubstr("prompt of sequence 1 is empty")));
  EXPECT_THAT([&] { prefill(w, Prompts{}); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("no prompts (B=0)")));
}

TEST_F(DecodeErrors, ATokenOutsideTheVocabularyNamesSequencePositionAndValue) {
  EXPECT_THAT(
      [&] {
        prefill(w, Prompts{{1}, {3, 29}});
      },
      ThrowsMessage<std::invalid_argument>(
          HasSubstr("sequence 1 position 1 has token 29 outside [0, 29)")));
  EXPECT_THAT([&] { prefill(w, Prompts{{-1}}); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("has token -1 outside")));
  Prefill<double> p = prefill(w, Prompts{{1}, {3, 4}});
  const std::vector<std::int32_t> bad{2, 100};
  EXPECT_THAT([&] { decode_step(w, p.cache, std::span<const std::int32_t>(bad)); },
              ThrowsMessage<std::invalid_argument>(
                  HasSubstr("sequence 1 position 2 has token 100 outside [0, 29)")));
  EXPECT_EQ(p.cache.length(0), 1) << "a refused step writes nothing";
  EXPECT_EQ(p.cache.length(1), 2) << "a refused step writes nothing";
  const std::vector<std::int32_t> one{2};
  EXPECT_THAT([&] { decode_step(w, p.cache, std::span<const std::int32_t>(one)); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("1 tokens for a cache of B=2")));
}

TEST_F(DecodeErrors, APositionBeyondMaxContextNamesSequenceAndPosition) {
  EXPECT_THAT(
      [&] {
        prefill(w, Prompts{{1, 2}, {1, 2, 3, 4, 5}}, /*max_context=*/4);
      },
      ThrowsMessage<std::length_error>(
          HasSubstr("sequence 1 would hold position 4, beyond max_context=4")));
  Prefill<double> p = prefill(w, Prompts{{1, 2, 3}, {1}}, /*max_context=*/4);
  const std::vector<std::int32_t> next{5, 6};
  decode_step(w, p.cache, std::span<const std::int32_t>(next));  // positions 3 and 1: fits
  EXPECT_THAT([&] { decode_step(w, p.cache, std::span<const std::int32_t>(next)); },
              ThrowsMessage<std::length_error>(
                  HasSubstr("sequence 0 would hold position 4, beyond max_context=4")));
  EXPECT_EQ(p.cache.length(1), 2) << "a refused step writes nothing";
  Sampler greedy = Sampler::greedy();
  EXPECT_THAT(
      [&] {
        generate(w, Prompts{{1, 2}}, 4, greedy, /*max_context=*/4);
      },
      ThrowsMessage<std::length_error>(HasSubstr("would hold position 4")));
  EXPECT_NO_THROW(generate(w, Prompts{{1, 2}}, 3, greedy, /*max_context=*/4));
}

TEST_F(DecodeErrors, ZeroNewTokensIsAnError) {
  Sampler greedy = Sampler::greedy();
  EXPECT_THAT([&] { generate(w, Prompts{{1}}, 0, greedy); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("n_new=0 must be >= 1")));
}

TEST_F(DecodeErrors, CacheAccessOutsideItsPositionsNamesTheIndex) {
  const Prefill<double> p = prefill(w, Prompts{{1, 2, 3}});
  EXPECT_THAT([&] { p.cache.k(0, 0, 3); },
              ThrowsMessage<std::out_of_range>(HasSubstr("position 3 of layer 0 sequence 0")));
  EXPECT_THAT([&] { p.cache.v(2, 0, 0); },
              ThrowsMessage<std::out_of_range>(HasSubstr("layer 2 outside [0, 2)")));
  EXPECT_THAT([&] { p.cache.keys(0, 1); },
              ThrowsMessage<std::out_of_range>(HasSubstr("sequence 1 outside [0, 1)")));
}

}  // namespace
}  // namespace tspemu::ref
