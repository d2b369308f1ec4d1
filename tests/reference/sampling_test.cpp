// Sampler (sampling.hpp): the greedy tie rule, one random stream for the whole batch, seeded
// reproducibility, top-k, and parameter errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/sampling.hpp"

namespace tspemu::ref {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Sampler, GreedyTiesGoToTheLowestIndex) {
  const std::vector<double> logits{0.5, 2.0, -1.0, 2.0, 2.0,   // row 0: max 2.0 at 1, 3, 4
                                   7.0, 7.0, 7.0,  7.0, 7.0};  // row 1: all tied
  Sampler greedy = Sampler::greedy();
  EXPECT_EQ(greedy.sample(std::span<const double>(logits), 2, 5),
            (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(greedy.draws(), 0u);
}

// An independent inverse-CDF over one SplitMix64 stream: sequence b of call c uses the
// (B·c + b)-th uniform.
std::vector<std::int32_t> expected_draws(SplitMix64& rng, const std::vector<double>& logits, int B,
                                         int V, double temperature) {
  std::vector<std::int32_t> out;
  for (int b = 0; b < B; ++b) {
    const double* r = logits.data() + std::size_t(b) * V;
    double m = r[0];
    for (int i = 1; i < V; ++i) m = std::max(m, r[i]);
    std::vector<double> cdf(V);
    double acc = 0;
    for (int i = 0; i < V; ++i) cdf[i] = acc += std::exp((r[i] - m) / temperature);
    const double u = rng.uniform() * acc;
    int pick = V - 1;
    for (int i = 0; i < V; ++i) {
      if (cdf[i] > u) {
        pick = i;
        break;
      }
    }
    out.push_back(pick);
  }
  return out;
}

TEST(Sampler, SeededDrawsOneUniformPerSequenceInBatchOrderFromOneStream) {
  const int B = 4, V = 11;
  const double temperature = 0.7;
  Sampler s = Sampler::seeded(1234, temperature);
  SplitMix64 rng(1234);
  for (int call = 0; call < 5; ++call) {
    const std::vector<double> logits = testing::random_vector(std::size_t(B) * V, 40 + call, 2.0);
    EXPECT_EQ(s.sample(std::span<const double>(logits), B, V),
              expected_draws(rng, logits, B, V, temperature))
        << "call " << call;
    EXPECT_EQ(s.draws(), std::uint64_t(B) * (call + 1));
  }
}

TEST(Sampler, SeededGenerationIsBitwiseReproducibleAndDependsOnTheSeed) {
  const ModelConfig cfg = testing::tiny_gqa_config();
  const auto w = init_weights<double>(cfg, 5);
  const std::vector<std::vector<std::int32_t>> prompts{{1, 2, 3}, {4}, {5, 6, 7, 8, 9}};
  Sampler a = Sampler::seeded(99, 1.0, 5), b = Sampler::seeded(99, 1.0, 5),
          c = Sampler::seeded(100, 1.0, 5);
  const auto ga = generate(w, prompts, 16, a), gb = generate(w, prompts, 16, b),
             gc = generate(w, prompts, 16, c);
  EXPECT_EQ(ga.tokens, gb.tokens);
  EXPECT_EQ(ga.logits, gb.logits);
  EXPECT_EQ(a.draws(), 3u * 16u) << "one draw per sequence per step";
  EXPECT_NE(ga.tokens, gc.tokens);
}

TEST(Sampler, TopKNeverPicksOutsideTheKLargestAndTopOneIsGreedy) {
  const int V = 9;
  // Ties at the k-th place: 3.0 at 2, 5, 6; top 3 = {1 (4.0), 2, 5}.
  const std::vector<float> logits{0.0f, 4.0f, 3.0f, -2.0f, 1.0f, 3.0f, 3.0f, 2.0f, -1.0f};
  Sampler s = Sampler::seeded(7, 5.0, 3);
  std::set<std::int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(s.sample(std::span<const float>(logits), 1, V)[0]);
  EXPECT_EQ(seen, (std::set<std::int32_t>{1, 2, 5}));
  Sampler top1 = Sampler::seeded(7, 1.0, 1);
  const std::vector<float> tied{1.0f, 3.0f, 3.0f};
  EXPECT_EQ(top1.sample(std::span<const float>(tied), 1, 3)[0], 1);
  Sampler wide = Sampler::seeded(7, 1.0, 1000);  // k > V: every token, as top_k = 0
  Sampler all = Sampler::seeded(7, 1.0, 0);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(wide.sample(std::span<const float>(logits), 1, V),
              all.sample(std::span<const float>(logits), 1, V));
  }
}

TEST(Sampler, BadParametersAndNanLogitsThrowNamingTheValue) {
  EXPECT_THAT([] { Sampler::seeded(1, 0.0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("temperature=0 must be")));
  EXPECT_THAT([] { Sampler::seeded(1, -0.5); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("temperature=-0.5")));
  EXPECT_THAT([] { Sampler::seeded(1, std::numeric_limits<double>::quiet_NaN()); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("temperature=nan")));
  EXPECT_THAT([] { Sampler::seeded(1, 1.0, -2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("top_k=-2")));
  const std::vector<double> nan_row{0.0, 1.0, 2.0, std::numeric_limits<double>::quiet_NaN()};
  Sampler greedy = Sampler::greedy();
  EXPECT_THAT([&] { greedy.sample(std::span<const double>(nan_row), 2, 2); },
              ThrowsMessage<std::domain_error>(HasSubstr("logits[1, 1] is NaN")));
  EXPECT_THAT([&] { greedy.sample(std::span<const double>(nan_row), 3, 2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("4 elements for B=3 V=2")));
}

}  // namespace
}  // namespace tspemu::ref
