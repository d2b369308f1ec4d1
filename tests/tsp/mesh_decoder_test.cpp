// TP+SP mesh decoding (mesh_decoder.hpp) against the reference decoder (reference/decode.hpp),
// the fp64 oracle and the planner's TP+SP closed forms (plan/decode_cost.hpp).
//
// Shapes: one small GQA model (NH=8, NKV=4, C=64, L=2, F=V=96) at (T, Σ) = (2, 2), (2, 4), (4, 2):
// two and one KV heads per rank, T | V for the vocabulary-parallel embedding and LM head; five
// prompts of lengths 1 (shorter than Σ), 7, 13, 12, 16; interleave I = 1, 2 (Σ = 4).
// Bounds: as sp_decoder_test.cpp (the rule for float, equality of greedy double tokens for 256
// steps, mesh_decode_checks.hpp's cache bound, traffic and KV bytes equal to the planner's).
#include "tspemu/tsp/mesh_decoder.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "decode_test_support.hpp"
#include "mesh_decode_checks.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspw_test_model.hpp"

namespace tspemu::tsp {
namespace {

using Degrees = std::pair<int, int>;  // (T, Σ)
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::kForcedSteps;
using testing::longest;
using testing::Prompts;
using ::testing::ThrowsMessage;

ref::ModelConfig mesh_decode_model() {  // NH=8, NKV=4, C=64, L=2, F=V=96
  return testing::tspw_test_model(4);
}

MeshDecodeShape mesh_shape(Degrees d, int B, std::int64_t max_context) {
  return MeshDecodeShape{.model = mesh_decode_model(),
                         .T = d.first,
                         .Sp = d.second,
                         .batch = B,
                         .max_context = max_context,
                         .interleave = d.second == 4 ? 2 : 1};
}

template <class T>
auto mesh_factory(const MeshDecodeShape& s, const ref::ModelWeights<T>& w) {
  return [&s, &w](Rank& rank) { return std::make_unique<BasicMeshDecoder<T>>(rank, s, w); };
}

std::string degrees_name(const ::testing::TestParamInfo<Degrees>& info) {
  return "T" + std::to_string(info.param.first) + "xS" + std::to_string(info.param.second);
}

const auto kMeshes = ::testing::Values(Degrees{2, 2}, Degrees{2, 4}, Degrees{4, 2});

// ---------------------------------------------------------------- shape, bad input

TEST(MeshDecodeShape, RefusesTNotDividingTheKvHeadsNamingTAndNkv) {
  MeshDecodeShape s = mesh_shape({8, 1}, 1, 8);  // T = 8 > NKV = 4: no duplication
  EXPECT_THAT([&] { s.validate(); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("TP+SP decode"), HasSubstr("T=8"), HasSubstr("NKV=4"))));
  s.model.n_heads = 12;  // NH = 12, NKV = 6, C = 96: T = 4 divides NH but not NKV
  s.model.n_kv_heads = 6;
  s.model.hidden = 96;
  s.T = 4;
  EXPECT_THAT([&] { s.validate(); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("T=4"), HasSubstr("NKV=6"))));
  const MeshDecodeShape good = mesh_shape({2, 2}, 1, 8);
  const auto w = ref::init_weights<float>(good.model, 1);
  World world({.ranks = 3});
  EXPECT_THROW(world.run([&](Rank& r) { MeshDecoder dec(r, good, w); }), std::exception);
}

TEST(MeshDecodeShape, RefusesTNotDividingTheHeadsMlpOrVocabularyNamingThem) {
  const MeshDecodeShape good = mesh_shape({2, 2}, 2, 8);
  auto fails = [](MeshDecodeShape s, const char* what) {
    EXPECT_THAT([&] { s.validate(); }, ThrowsMessage<std::invalid_argument>(HasSubstr(what)));
  };
  MeshDecodeShape s = good;
  s.T = 3;
  fails(s, "T=3 does not divide NH=8");
  s = good;
  s.T = 4;
  s.model.vocab = 98;
  fails(s, "T=4 does not divide V=98");
  s = good;
  s.T = 4;
  s.model.ffn = 90;
  fails(s, "T=4 does not divide F=90");
  // Σ, B, max_context and I: the same validate() at T = 1 is SP's (sp_decoder_test.cpp).
}

TEST(MeshDecoder, BadInputIsRefusedNamingSequencePositionAndValue) {
  const MeshDecodeShape s = mesh_shape({2, 2}, 2, 8);
  const auto w = ref::init_weights<float>(s.model, 2);
  testing::expect_decoder_refuses_bad_input(4, mesh_factory(s, w), "TP+SP decode");
}

// ---------------------------------------------------------------- float, teacher-forced

class MeshFloat : public ::testing::TestWithParam<Degrees> {};

TEST_P(MeshFloat, LogitsOfEveryStepTeacherForcedPassTheOracleRule) {
  const ref::ModelConfig cfg = mesh_decode_model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 5);
  const MeshDecodeShape s =
      mesh_shape(GetParam(), static_cast<int>(prompts.size()), longest(prompts) + kForcedSteps + 1);
  const auto w64 = ref::init_weights<double>(cfg, 11);
  const auto w32 = ref::init_weights<float>(cfg, 11);
  const auto r = testing::judge_teacher_forced(testing::label_of(s), s.ranks(), w64, w32, prompts,
                                               s.max_context, kForcedSteps, mesh_factory(s, w32));
  std::cout << testing::label_of(s) << ": worst err(TP+SP fp32)/err(reference fp32) over "
            << r.steps << " steps " << r.worst_ratio << "\n";
}

INSTANTIATE_TEST_SUITE_P(Mesh, MeshFloat, kMeshes, degrees_name);

// ---------------------------------------------------------------- double, free-running greedy

class MeshGreedy : public ::testing::TestWithParam<Degrees> {};

// 256 free-running greedy double steps: tokens equal to the reference's, every rank's logits
// bitwise rank 0's, every rank's cache (its head shard) against the reference cache, KV bytes =
// the planner's.
TEST_P(MeshGreedy, DoubleRunOf256StepsEqualsTheReferenceOnEveryRank) {
  const ref::ModelConfig cfg = mesh_decode_model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 7);
  const MeshDecodeShape s = mesh_shape(GetParam(), static_cast<int>(prompts.size()),
                                       longest(prompts) + testing::kGreedySteps + 3);
  const auto w = ref::init_weights<double>(cfg, 13);
  testing::expect_greedy_run_matches(s, w, prompts, mesh_factory(s, w));
}

INSTANTIATE_TEST_SUITE_P(Mesh, MeshGreedy, kMeshes, degrees_name);

// ---------------------------------------------------------------- traffic, KV bytes

class MeshTrafficModel : public ::testing::TestWithParam<Degrees> {};

TEST_P(MeshTrafficModel, EveryStageOfEveryDecodeStepOnEveryRankEqualsThePlannersClosedForm) {
  const ref::ModelConfig cfg = mesh_decode_model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 11);
  const int steps = 5;
  const MeshDecodeShape s =
      mesh_shape(GetParam(), static_cast<int>(prompts.size()), longest(prompts) + steps);
  const auto w = ref::init_weights<float>(cfg, 29);
  testing::expect_traffic_equals_planner(s, prompts, steps, mesh_factory(s, w));
}

INSTANTIATE_TEST_SUITE_P(Mesh, MeshTrafficModel, kMeshes, degrees_name);

// ---------------------------------------------------------------- determinism, independence

TEST(MeshDecoder, TwoRunsAreBitwiseIdentical) {
  const ref::ModelConfig cfg = mesh_decode_model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 9);
  const MeshDecodeShape s =
      mesh_shape({2, 2}, static_cast<int>(prompts.size()), longest(prompts) + 20);
  const auto w = ref::init_weights<float>(cfg, 17);
  testing::expect_deterministic(s.ranks(), mesh_factory(s, w), prompts, 16);
}

TEST(MeshDecoder, ASequencesLogitsDoNotDependOnItsBatchMatesInDouble) {
  const int steps = 24;
  const ref::ModelConfig cfg = mesh_decode_model();
  const Prompts prompts = testing::test_prompts(cfg.vocab, 3);
  const auto w = ref::init_weights<double>(cfg, 19);
  testing::expect_batch_independent(prompts, {0, 2}, [&](const Prompts& p) {
    const MeshDecodeShape s =
        mesh_shape({2, 2}, static_cast<int>(p.size()), longest(prompts) + steps + 1);
    return testing::run_decoder<double>(s.ranks(), mesh_factory(s, w), p, steps);
  });
}

}  // namespace
}  // namespace tspemu::tsp
