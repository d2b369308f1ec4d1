// The strategy table (strategy.hpp): every strategy's divisibility rules reject exactly the shapes
// its blocks cannot run, naming the values; the blocks' validation and the cost model say the
// same; lookup by name lists the known names; the table's traffic formula is the cost model's.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/plan/cost_model.hpp"
#include "tspemu/plan/strategy_table.hpp"
#include "tspemu/tsp/baseline_shape.hpp"
#include "tspemu/tsp/tsp_shape.hpp"
#include "tspemu/tsp/ulysses_attention.hpp"

namespace tspemu::tsp {
namespace {

using cost::Strategy;

// h = 64, 8 query / 4 KV heads (hs = 8), F = 96, B = 1, S = 48: every strategy at 4 ranks runs.
cost::ModelShape base_shape() {
  return {.B = 1, .S = 48, .hidden = 64, .n_heads = 8, .n_kv_heads = 4, .ffn = 96, .vocab = 12};
}

struct RuleCase {
  Strategy st;
  cost::ModelShape m;
  RuleOptions o;
  std::string rejected;  // a substring of the message naming the values; "" when accepted
};

cost::ModelShape with(cost::ModelShape m, std::int64_t cost::ModelShape::*field, std::int64_t v) {
  m.*field = v;
  return m;
}

std::vector<RuleCase> rule_cases() {
  using M = cost::ModelShape;
  const M b = base_shape();
  const RuleOptions blocks{};
  const RuleOptions contiguous{.tsp_layout = LayoutKind::contiguous};
  const RuleOptions cost_view{.layout_rules = false};
  const M gqa6 = {
      .B = 1, .S = 48, .hidden = 48, .n_heads = 6, .n_kv_heads = 3, .ffn = 96, .vocab = 12};
  return {
      // TSP: D shards heads, KV heads, MLP width and the zigzag sequence.
      {Strategy::tsp(4), b, blocks, ""},
      {Strategy::tsp(3), b, blocks, "D=3 does not divide n_heads=8"},
      {Strategy::tsp(8), b, blocks, "D=8 does not divide n_kv_heads=4"},
      {Strategy::tsp(4), with(b, &M::ffn, 98), blocks, "D=4 does not divide the MLP width ffn=98"},
      {Strategy::tsp(4), with(b, &M::S, 36), blocks, "zigzag layout needs S=36 divisible by 2·D=8"},
      {Strategy::tsp(4), with(b, &M::S, 36), contiguous, ""},
      {Strategy::tsp(4), with(b, &M::S, 30), contiguous, "S=30 is not divisible by D=4"},
      {Strategy::tsp(4), with(b, &M::S, 36), cost_view, ""},
      {Strategy::tsp(4), b, {.head_buckets = 2}, "head_buckets=2 must divide the 1 KV heads"},
      {Strategy::tsp(2), b, {.head_buckets = 2}, ""},
      {Strategy::tsp(4),
       with(b, &M::vocab, 10),
       {.whole_model = true},
       "D=4 does not divide vocab=10"},
      {Strategy::tsp(4), with(b, &M::vocab, 10), blocks, ""},
      // The whole model cuts the vocabulary as the layers: T | vocab; SP replicates it.
      {Strategy::tp(4),
       with(b, &M::vocab, 10),
       {.whole_model = true},
       "T=4 does not divide vocab=10"},
      {Strategy::megatron_sp(2), with(b, &M::vocab, 10), {.whole_model = true}, ""},
      {Strategy::tp_sp(4, 2),
       with(b, &M::vocab, 10),
       {.whole_model = true},
       "T=4 does not divide vocab=10"},
      {Strategy::sp(4), with(b, &M::vocab, 10), {.whole_model = true}, ""},
      {Strategy::ring(4), with(b, &M::vocab, 10), {.whole_model = true}, ""},
      {Strategy::tsp(0), b, blocks, "D=0 must be >= 1"},
      // TP: T shards heads and MLP; tokens replicated, so any S.
      {Strategy::tp(4), with(b, &M::S, 30), blocks, ""},
      {Strategy::tp(3), b, blocks, "T=3 does not divide n_heads=8"},
      {Strategy::tp(8), b, blocks, "T=8 does not divide n_kv_heads=4"},
      {Strategy::tp(4), with(b, &M::ffn, 98), blocks, "T=4 does not divide the MLP width ffn=98"},
      // Megatron-SP: also T | S (the row's tokens cut into T pieces).
      {Strategy::megatron_sp(4), b, blocks, ""},
      {Strategy::megatron_sp(4), with(b, &M::S, 30), blocks,
       "sequence parallelism needs S/Sp=30 tokens per row divisible by T=4"},
      // SP: weights replicated (any heads), zigzag rows: 2·Sp | S.
      {Strategy::sp(4), gqa6, blocks, ""},
      {Strategy::sp(4), with(b, &M::S, 36), blocks, "zigzag layout needs S=36 divisible by 2·Sp=8"},
      {Strategy::sp(4), with(b, &M::S, 36), cost_view, ""},
      {Strategy::sp(5), with(b, &M::S, 36), cost_view, "S=36 is not divisible by Sp=5"},
      // TP+SP: T as TP, Sp as SP.
      {Strategy::tp_sp(2, 2), b, blocks, ""},
      {Strategy::tp_sp(2, 3), b, blocks, ""},
      {Strategy::tp_sp(3, 2), b, blocks, "T=3 does not divide n_heads=8"},
      {Strategy::tp_sp(2, 5), b, blocks, "zigzag layout needs S=48 divisible by 2·Sp=10"},
      // Ulysses: n | query and KV heads, zigzag rows.
      {Strategy::ulysses(4), b, blocks, ""},
      {Strategy::ulysses(4), with(b, &M::n_kv_heads, 2), blocks,
       "n=4 ranks must divide n_heads=8 and n_kv_heads=2"},
      {Strategy::ulysses(4), gqa6, blocks, "n=4 ranks must divide n_heads=6 and n_kv_heads=3"},
      {Strategy::ulysses(4), with(b, &M::S, 36), blocks,
       "zigzag layout needs S=36 divisible by 2·n=8"},
      // Ring attention: any heads, zigzag rows.
      {Strategy::ring(4), gqa6, blocks, ""},
      {Strategy::ring(3), b, blocks, ""},
      {Strategy::ring(5), b, blocks, "zigzag layout needs S=48 divisible by 2·n=10"},
  };
}

std::string describe(const RuleCase& c) {
  return c.st.name() + " S=" + std::to_string(c.m.S) + " NH=" + std::to_string(c.m.n_heads) +
         " NKV=" + std::to_string(c.m.n_kv_heads) + " F=" + std::to_string(c.m.ffn);
}

TEST(StrategyTable, EveryStrategysRulesRejectExactlyTheBadShapesNamingTheValues) {
  std::set<cost::Scheme> covered;
  for (const RuleCase& c : rule_cases()) {
    covered.insert(c.st.scheme);
    const std::optional<Violation> v = violation(c.m, c.st, c.o);
    if (c.rejected.empty()) {
      EXPECT_FALSE(v.has_value()) << describe(c) << ": " << (v ? v->message : "");
      continue;
    }
    ASSERT_TRUE(v.has_value()) << describe(c) << " accepted";
    EXPECT_NE(v->message.find(c.rejected), std::string::npos)
        << describe(c) << "\nmessage: " << v->message << "\nwanted: " << c.rejected;
  }
  EXPECT_EQ(covered.size(), strategies().size()) << "a strategy without rule cases";
}

// The blocks' own validation (TspShape, BaselineShape, the Ulysses core) and the cost model reject
// exactly the shapes the table rejects, with the table's message.
TEST(StrategyTable, BlocksAndCostModelRejectExactlyWhatTheTableRejects) {
  for (const RuleCase& c : rule_cases()) {
    if (c.st.ranks() < 1) continue;  // the shapes' own degree checks come first
    ref::ModelConfig mc;
    mc.n_layers = 1;
    mc.hidden = static_cast<int>(c.m.hidden);
    mc.n_heads = static_cast<int>(c.m.n_heads);
    mc.n_kv_heads = static_cast<int>(c.m.n_kv_heads);
    mc.ffn = static_cast<int>(c.m.ffn);
    mc.vocab = static_cast<int>(c.m.vocab);
    const int B = static_cast<int>(c.m.B), S = static_cast<int>(c.m.S);
    auto mesh_check = [&](const BaselineShape& s) {
      if (c.o.whole_model)
        s.validate_whole_model();
      else
        s.validate();
    };
    auto block_check = [&] {
      switch (c.st.scheme) {
        case cost::Scheme::tsp: {
          const TspShape s{.model = mc,
                           .D = c.st.D,
                           .B = B,
                           .S = S,
                           .options = {.layout = c.o.tsp_layout, .head_buckets = c.o.head_buckets}};
          if (c.o.whole_model)
            s.validate_whole_model();
          else
            s.validate();
          return;
        }
        case cost::Scheme::tp:
          return mesh_check(BaselineShape::tp(mc, c.st.T, B, S));
        case cost::Scheme::megatron_sp:
          return mesh_check(BaselineShape::megatron_sp(mc, c.st.T, B, S));
        case cost::Scheme::sp:
        case cost::Scheme::ring:  // the ring core runs on the SP shape, no rule of its own
          return mesh_check(BaselineShape::sp(mc, c.st.Sp, B, S));
        case cost::Scheme::ulysses:
          return check_ulysses_shape(BaselineShape::sp(mc, c.st.Sp, B, S));
        case cost::Scheme::tp_sp:
          return mesh_check(BaselineShape::tp_sp(mc, c.st.T, c.st.Sp, B, S));
      }
    };
    if (c.o.layout_rules) {
      if (c.rejected.empty()) {
        EXPECT_NO_THROW(block_check()) << describe(c);
      } else {
        try {
          block_check();
          ADD_FAILURE() << describe(c) << ": the block accepted it";
        } catch (const std::invalid_argument& e) {
          // Ulysses and ring attention run on the SP shape, whose own check comes first and
          // names the degree Sp: the message is the SP entry's, else the strategy's.
          const bool on_sp_shape =
              c.st.scheme == cost::Scheme::ulysses || c.st.scheme == cost::Scheme::ring;
          std::optional<Violation> v;
          if (on_sp_shape) v = violation(c.m, Strategy::sp(c.st.Sp), c.o);
          if (!v) v = violation(c.m, c.st, c.o);
          ASSERT_TRUE(v.has_value()) << describe(c);
          EXPECT_NE(std::string(e.what()).find(v->message), std::string::npos)
              << describe(c) << ": " << e.what();
        }
      }
    }
    if (c.o.whole_model) continue;  // the cost model has no vocabulary rule
    // The cost model: the same rules without the zigzag layout's 2·degree | S.
    const RuleOptions cost_view{.layout_rules = false, .head_buckets = c.o.head_buckets};
    const bool cost_rejects = violation(c.m, c.st, cost_view).has_value();
    const cost::CostOptions opt{.head_buckets = c.o.head_buckets};
    if (cost_rejects)
      EXPECT_THROW(cost::layer_traffic(c.m, c.st, cost::ElementSizes{}, opt), std::invalid_argument)
          << describe(c);
    else
      EXPECT_NO_THROW(cost::layer_traffic(c.m, c.st, cost::ElementSizes{}, opt)) << describe(c);
  }
}

TEST(StrategyTable, IsIndexedBySchemeWithUniqueNames) {
  std::set<std::string> names;
  for (const StrategyInfo& e : strategies()) {
    EXPECT_EQ(&strategy_info(e.scheme), &e) << e.name;
    EXPECT_TRUE(names.insert(e.name).second) << "duplicate name " << e.name;
    EXPECT_EQ(&strategy_named(e.name), &e);
    EXPECT_STRNE(e.description, "");
    EXPECT_STREQ(cost::scheme_name(e.scheme), e.title);
  }
  EXPECT_EQ(strategy_names(), "tsp, tp, megatron-sp, sp, ulysses, ring, tp-sp");
}

TEST(StrategyTable, LookupOfAnUnknownNameThrowsListingTheKnownNames) {
  try {
    strategy_named("fsdp");
    FAIL() << "accepted fsdp";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown strategy 'fsdp'"), std::string::npos) << what;
    for (const StrategyInfo& s : strategies())
      EXPECT_NE(what.find(s.name), std::string::npos) << what << " does not list " << s.name;
  }
}

TEST(StrategyTable, MeshesBuildTheDegreesAndStrategiesAtListEveryFactorization) {
  EXPECT_EQ(strategy_named("tsp").make(8, 2, 4).name(), "TSP D=8");
  EXPECT_EQ(strategy_named("tp").make(8, 2, 4).name(), "TP T=8");
  EXPECT_EQ(strategy_named("megatron-sp").make(8, 2, 4).name(), "TP+Megatron-SP T=8");
  EXPECT_EQ(strategy_named("sp").make(8, 2, 4).name(), "SP Sp=8");
  EXPECT_EQ(strategy_named("ulysses").make(8, 2, 4).name(), "Ulysses n=8");
  EXPECT_EQ(strategy_named("ring").make(8, 2, 4).name(), "Ring attention n=8");
  EXPECT_EQ(strategy_named("tp-sp").make(8, 2, 4).name(), "TP+SP T=2×Σ=4");
  for (const StrategyInfo& e : strategies()) EXPECT_EQ(e.make(8, 2, 4).ranks(), 8) << e.name;
  std::vector<std::string> at12;
  for (const Strategy& st : strategies_at(12)) at12.push_back(st.name());
  const std::vector<std::string> want = {"TSP D=12",      "TP T=12",       "TP+Megatron-SP T=12",
                                         "SP Sp=12",      "Ulysses n=12",  "Ring attention n=12",
                                         "TP+SP T=2×Σ=6", "TP+SP T=3×Σ=4", "TP+SP T=4×Σ=3",
                                         "TP+SP T=6×Σ=2"};
  EXPECT_EQ(at12, want);
}

// The table's formula (TSP-NOTES, elements) times the element size is the paper-convention
// forward figure of cost::layer_traffic, which `plan` prints — at the emulator's sizes and at the
// paper's 7B-class model from 16K to 128K tokens.
TEST(StrategyTable, TrafficFormulaEqualsTheCostModelsForwardFigure) {
  std::vector<cost::ModelShape> shapes = {base_shape()};
  for (std::int64_t S : {16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024})
    shapes.push_back(cost::paper_7b(1, S));
  for (const cost::ModelShape& m : shapes)
    for (int n : {2, 4, 8})
      for (const Strategy& st : strategies_at(n)) {
        if (violation(m, st, {.layout_rules = false})) continue;
        const StrategyInfo& e = strategy_info(st.scheme);
        for (const cost::ElementSizes& es :
             {cost::ElementSizes::bf16(), cost::ElementSizes::fp32_emulator()}) {
          const cost::LayerTraffic t = cost::layer_traffic(m, st, es);
          EXPECT_DOUBLE_EQ(e.paper_forward_elements(m, st) * es.activation, t.paper_forward)
              << st.name() << " S=" << m.S;
          EXPECT_DOUBLE_EQ(cost::paper_forward_elements(m, st), e.paper_forward_elements(m, st));
        }
        const cost::LayerTraffic direct =
            e.layer_traffic(m, st, cost::ElementSizes::bf16(), {}, st.ranks() - 1);
        const cost::LayerTraffic checked =
            cost::layer_traffic(m, st, cost::ElementSizes::bf16(), {}, st.ranks() - 1);
        EXPECT_EQ(direct.forward, checked.forward) << st.name();
        EXPECT_EQ(direct.backward, checked.backward) << st.name();
      }
}

}  // namespace
}  // namespace tspemu::tsp
