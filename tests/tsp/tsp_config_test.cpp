// Every configuration TSP rejects, with the message that names the values at fault.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "tspemu/tsp/sequence_layout.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::tsp {
namespace {

using ::testing::HasSubstr;

TspShape valid_shape() {
  TspShape s;
  s.model = {.vocab = 32, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 96};
  s.D = 4;
  s.B = 1;
  s.S = 32;
  return s;
}

void expect_tsp_rejected(const TspShape& s, const std::string& message) {
  try {
    s.validate();
    FAIL() << "expected rejection containing: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(message));
  }
}

TEST(TspConfig, AcceptsAValidShape) {
  EXPECT_NO_THROW(valid_shape().validate());
}

TEST(TspConfig, RejectsSequenceNotDivisibleByTwoDForZigzag) {
  auto s = valid_shape();
  s.S = 36;  // divisible by D=4 but not by 2D=8
  expect_tsp_rejected(s, "zigzag layout needs S=36 divisible by 2·D=8");
}

TEST(TspConfig, RejectsSequenceNotDivisibleByDForContiguous) {
  auto s = valid_shape();
  s.options.layout = LayoutKind::contiguous;
  s.S = 30;
  expect_tsp_rejected(s, "S=30 is not divisible by D=4");
}

TEST(TspConfig, RejectsQueryHeadsNotDivisibleByD) {
  auto s = valid_shape();
  s.D = 3;
  s.S = 36;
  s.model.n_heads = 8;
  s.model.n_kv_heads = 8;
  s.model.ffn = 96;
  expect_tsp_rejected(s, "D=3 does not divide n_heads=8");
}

TEST(TspConfig, RejectsKvHeadsNotDivisibleByD) {
  auto s = valid_shape();
  s.D = 8;
  s.S = 64;
  s.model.n_kv_heads = 4;
  expect_tsp_rejected(s, "D=8 does not divide n_kv_heads=4");
}

TEST(TspConfig, RejectsMlpWidthNotDivisibleByD) {
  auto s = valid_shape();
  s.model.ffn = 98;
  expect_tsp_rejected(s, "D=4 does not divide the MLP width ffn=98");
}

TEST(TspConfig, WholeModelRejectsAVocabularyNotDivisibleByDBeforeAnyRankRuns) {
  auto s = valid_shape();
  s.model.vocab = 30;
  EXPECT_NO_THROW(s.validate()) << "the layers alone have no vocabulary";
  try {
    s.validate_whole_model();
    FAIL() << "accepted vocab 30 at D=4";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("30"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("D=4"));
  }
}

TEST(TspConfig, RejectsDegreeBelowOne) {
  auto s = valid_shape();
  s.D = 0;
  expect_tsp_rejected(s, "D=0 must be >= 1");
}

TEST(TspConfig, RejectsBatchBelowOne) {
  auto s = valid_shape();
  s.B = 0;
  expect_tsp_rejected(s, "B=0 must be >= 1");
}

TEST(TspConfig, RejectsHeadBucketsThatDoNotDivideTheShardsKvHeads) {
  auto s = valid_shape();  // 4 KV heads over D=4: one per shard
  s.options.head_buckets = 2;
  expect_tsp_rejected(s, "head_buckets=2 must divide the 1 KV heads of a shard");
}

TEST(TspConfig, RejectsAnInvalidModelConfigFirst) {
  auto s = valid_shape();
  s.model.n_heads = 7;
  EXPECT_THROW(s.validate(), std::invalid_argument);
}

TEST(SequenceLayout, EveryLayoutIsAPermutationOfTheSequence) {
  for (LayoutKind k : {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped})
    for (int D : {1, 2, 3, 4, 8}) {
      const int S = 2 * D * 5;
      SequenceLayout layout(k, D, S);
      std::set<std::int64_t> seen;
      for (int r = 0; r < D; ++r)
        for (std::int64_t p : layout.positions(r)) EXPECT_TRUE(seen.insert(p).second) << p;
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(S));
      EXPECT_EQ(*seen.begin(), 0);
      EXPECT_EQ(*seen.rbegin(), S - 1);
    }
}

TEST(SequenceLayout, ZigzagGivesRankRChunksRAndTwoDMinusOneMinusR) {
  SequenceLayout z(LayoutKind::zigzag, 4, 16);  // chunks of 2 tokens
  EXPECT_EQ(z.positions(0), (std::vector<std::int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(z.positions(1), (std::vector<std::int64_t>{2, 3, 12, 13}));
  EXPECT_EQ(z.positions(3), (std::vector<std::int64_t>{6, 7, 8, 9}));
}

TEST(SequenceLayout, ScatterThenGatherRestoresTheTensor) {
  SequenceLayout z(LayoutKind::zigzag, 3, 12);
  const int B = 2, C = 3;
  std::vector<float> full(static_cast<std::size_t>(B) * 12 * C), back(full.size(), -1.f),
      shard(static_cast<std::size_t>(B) * 4 * C);
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  for (int r = 0; r < 3; ++r) {
    z.scatter(full.data(), shard.data(), r, B, C);
    z.gather(shard.data(), back.data(), r, B, C);
  }
  EXPECT_EQ(full, back);
}

TEST(SequenceLayout, RejectsUnknownLayoutNames) {
  EXPECT_THAT([] { parse_layout("diagonal"); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("unknown sequence layout 'diagonal'")));
}

}  // namespace
}  // namespace tspemu::tsp
