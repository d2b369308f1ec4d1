// The checking kit (check/block_check.hpp): a correct user schedule passes at D = 2 and 4 with GQA;
// a schedule with a planted bug (a key position off by one, a missing gradient reduction) fails
// naming the tensor and the element; bad use of the kit (shard maps that do not tile, a layout
// that does not divide S, an output left unwritten, a wrong shard size, a weight of another block)
// is an error, not a verdict; injection, trace and simulated clock reach the user's schedule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>

#include "tspemu/check/block_check.hpp"
#include "tspemu/check/replicated_weights.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/tsp_attention.hpp"
#include "tspemu/tsp/tsp_mlp.hpp"

namespace tspemu::check {
namespace {

using ::testing::HasSubstr;

ref::ModelConfig model(int NH = 4, int NKV = 2, int hs = 8) {
  ref::ModelConfig m;
  m.vocab = 16;
  m.hidden = NH * hs;
  m.n_layers = 1;
  m.n_heads = NH;
  m.n_kv_heads = NKV;
  m.ffn = 3 * NH * hs;
  return m;
}

BlockCheck zigzag_check(Block block, int D, int B, int S, const ref::ModelConfig& m) {
  BlockCheck c;
  c.name = "test";
  c.model = m;
  c.block = block;
  c.ranks = D;
  c.B = B;
  c.S = S;
  c.tokens = sequence_sharded(tsp::SequenceLayout(tsp::LayoutKind::zigzag, D, S), B);
  return c;
}

// [n][B][T][w] (rank-major, as gathered) <-> [B][n·T][w] (what the attention kernel reads).
void rank_major_to_batch_major(const float* in, float* out, int n, int B, int T, int w,
                               bool inverse) {
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T; ++i) {
        const std::size_t rm = ((std::size_t(r) * B + b) * T + i) * w;
        const std::size_t bm = (std::size_t(b) * n * T + std::size_t(r) * T + i) * w;
        std::copy_n(inverse ? in + bm : in + rm, w, inverse ? out + rm : out + bm);
      }
}

// Sequence-parallel attention as a user would write it with the composable reference block:
// the core all-gathers K/V, attends its local queries to the whole sequence and reduce-scatters
// dK/dV back. `key_shift` plants a bug: the gathered keys' positions off by that much.
struct SpCore {
  std::vector<float> k_all, v_all;  // [B, S, NKV, hs]
  std::vector<std::int64_t> k_pos;  // [S], rank-major
};
ref::AttentionCore<float> sp_core(Comm& comm, const tsp::SequenceLayout& layout, int key_shift) {
  auto st = std::make_shared<SpCore>();
  const int n = comm.size();
  for (int r = 0; r < n; ++r)
    for (const std::int64_t p : layout.positions(r)) st->k_pos.push_back(p + key_shift);
  ref::AttentionCore<float> core;
  core.forward = [&comm, st, n](float* att, float* lse, const float* q, const float* k,
                                const float* v, const std::int64_t* pos,
                                const ref::AttentionDims& d) {
    const std::size_t local = std::size_t(d.B) * d.Tq * d.NKV * d.hs;
    std::vector<float> gathered(local * n);
    st->k_all.resize(local * n);
    st->v_all.resize(local * n);
    for (auto [src, dst] : {std::pair{k, &st->k_all}, std::pair{v, &st->v_all}}) {
      all_gather<float>(comm, std::span<const float>(src, local), gathered);
      rank_major_to_batch_major(gathered.data(), dst->data(), n, d.B, d.Tq, d.NKV * d.hs, false);
    }
    ref::causal_attention_forward(att, lse, q, st->k_all.data(), st->v_all.data(), pos,
                                  st->k_pos.data(), {d.B, d.Tq, n * d.Tq, d.NH, d.NKV, d.hs});
  };
  core.backward = [&comm, st, n](float* dq, float* dk, float* dv, const float* datt, const float* q,
                                 const float*, const float*, const float*, const float* lse,
                                 const std::int64_t* pos, const ref::AttentionDims& d) {
    const std::size_t local = std::size_t(d.B) * d.Tq * d.NKV * d.hs;
    std::vector<float> dk_all(local * n), dv_all(local * n), rank_major(local * n);
    ref::causal_attention_backward(dq, dk_all.data(), dv_all.data(), datt, q, st->k_all.data(),
                                   st->v_all.data(), lse, pos, st->k_pos.data(),
                                   {d.B, d.Tq, n * d.Tq, d.NH, d.NKV, d.hs});
    for (auto [src, dst] : {std::pair{&dk_all, dk}, std::pair{&dv_all, dv}}) {
      rank_major_to_batch_major(src->data(), rank_major.data(), n, d.B, d.Tq, d.NKV * d.hs, true);
      reduce_scatter<float>(comm, rank_major, std::span<float>(dst, local));
    }
  };
  return core;
}

struct SpBugs {
  int key_shift = 0;
  bool reduce_gradients = true;
};

Report check_sp_attention(BlockCheck c, SpBugs bugs = {}) {
  const tsp::SequenceLayout layout(tsp::LayoutKind::zigzag, c.ranks, c.S);
  return check_block(c, [&](RankBlock& rb) {
    attention_with_replicated_weights(rb, sp_core(rb.comm(), layout, bugs.key_shift),
                                      bugs.reduce_gradients);
  });
}

TEST(BlockCheck, SequenceParallelAttentionWrittenByAUserPasses) {
  for (int D : {2, 4})
    for (int B : {1, 2}) {
      const Report r = check_sp_attention(zigzag_check(Block::attention, D, B, 32, model()));
      std::ostringstream s;
      r.print(s);
      EXPECT_TRUE(r.ok()) << s.str();
      EXPECT_EQ(r.tensors.size(), 7u);  // y, dx and five weight gradients
      EXPECT_THAT(s.str(), HasSubstr("verdict: PASS"));
    }
}

TEST(BlockCheck, KeyPositionOffByOneFailsNamingTensorElementAndRank) {
  const Report r =
      check_sp_attention(zigzag_check(Block::attention, 4, 1, 32, model()), {.key_shift = 1});
  ASSERT_FALSE(r.ok());
  const TensorResult* y = r.find("y");
  ASSERT_NE(y, nullptr);
  EXPECT_FALSE(y->ok());
  EXPECT_GT(y->ratio, 1.0);
  EXPECT_THAT(y->worst, HasSubstr("position"));
  ASSERT_EQ(y->owners.size(), 1u);  // a zigzag token lives on exactly one rank
  std::ostringstream s;
  r.print(s);
  EXPECT_THAT(s.str(), HasSubstr("FAIL y"));
  EXPECT_THAT(s.str(), HasSubstr("on rank(s) " + std::to_string(y->owners[0])));
  EXPECT_THAT(s.str(), HasSubstr("verdict: FAIL"));
}

TEST(BlockCheck, MissingGradientReductionFailsNamingTheWeightAndTheReplicas) {
  const Report r = check_sp_attention(zigzag_check(Block::attention, 2, 1, 16, model()),
                                      {.reduce_gradients = false});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.find("y")->ok());  // forward is right
  for (const char* w : {"wq", "wk", "wv", "wo"}) {
    const TensorResult* t = r.find(w);
    EXPECT_FALSE(t->ok()) << w;
    ASSERT_FALSE(t->replica_mismatches.empty()) << w;
    EXPECT_THAT(t->replica_mismatches[0], HasSubstr("rank 1 holds"));
    EXPECT_THAT(t->worst, HasSubstr("feature"));
  }
}

// The built-in TSP blocks, checked through the kit: their packed gradient shards map back with
// head_sharded (attention) and column/row_parallel (MLP).
TEST(BlockCheck, TspBlocksPassThroughTheKit) {
  for (int D : {2, 4}) {
    for (Block block : {Block::attention, Block::mlp}) {
      BlockCheck c = zigzag_check(block, D, 2, 32, model(4, 4));
      tsp::TspShape s;
      s.model = c.model;
      s.D = D;
      s.B = c.B;
      s.S = c.S;
      const Report r = check_block(c, [&](RankBlock& rb) {
        const int p = rb.rank().id();
        auto declare = [&](const char* name, const float* data, const ShardMap& map) {
          const TensorShape t = rb.shape(name);
          rb.gradient(name, std::span<const float>(data, t.rows * t.cols / D), map);
        };
        if (block == Block::attention) {
          tsp::TspAttention att(rb.rank(), s, rb.master());
          att.forward(rb.x().data(), rb.y().data());
          att.backward(rb.x().data(), rb.dy().data(), rb.dx().data());
          const auto v = tsp::attention_view(att.grad_shard().data(), s);
          for (auto [name, data] : {std::pair{"wq", v.wq}, std::pair{"wk", v.wk},
                                    std::pair{"wv", v.wv}, std::pair{"wo", v.wo}})
            declare(name, data, head_sharded(p, D));
          rb.gradient("input_norm", att.grad_norm().span(), replicated());
        } else {
          tsp::TspMlp mlp(rb.rank(), s, rb.master());
          mlp.forward(rb.x().data(), rb.y().data());
          mlp.backward(rb.x().data(), rb.dy().data(), rb.dx().data());
          const auto v = tsp::mlp_view(mlp.grad_shard().data(), s);
          declare("w_gate", v.gate, column_parallel(p, D));
          declare("w_up", v.up, column_parallel(p, D));
          declare("w_down", v.down, row_parallel(p, D));
          rb.gradient("post_norm", mlp.grad_norm().span(), replicated());
        }
      });
      std::ostringstream out;
      r.print(out);
      EXPECT_TRUE(r.ok()) << out.str();
    }
  }
}

// A local MLP with replicated weights (data parallel over the sequence), the smallest schedule.
void local_mlp(RankBlock& rb, const ShardMap& grad_map, bool write_dx = true) {
  auto grads = ref::LayerWeights<float>::zeros(rb.config());
  ref::MlpCache<float> cache;
  std::vector<float> dx(rb.dx().size());
  ref::mlp_block_forward(rb.config(), rb.master(), rb.x().data(), rb.y().data(), rb.batches(),
                         rb.tokens(), cache);
  ref::mlp_block_backward(rb.config(), rb.master(), rb.x().data(), rb.dy().data(),
                          write_dx ? rb.dx().data() : dx.data(), rb.batches(), rb.tokens(), cache,
                          grads);
  std::vector<std::span<float>> g = {grads.post_norm, grads.w_gate, grads.w_up, grads.w_down};
  all_reduce_buffers<float>(rb.comm(), g);
  rb.gradient("post_norm", grads.post_norm, replicated());
  const TensorShape gate = rb.shape("w_gate");
  std::vector<float> piece(static_cast<std::size_t>(element_count(grad_map.resolve(gate))));
  cut(grads.w_gate.data(), gate, grad_map.resolve(gate), piece.data());
  rb.gradient("w_gate", piece, grad_map);
  rb.gradient("w_up", grads.w_up, replicated());
  rb.gradient("w_down", grads.w_down, replicated());
}

TEST(BlockCheck, ShardMapsThatDoNotTileTheMasterTensorAreAnError) {
  const BlockCheck c = zigzag_check(Block::mlp, 2, 1, 16, model());
  // Each rank declares only the first quarter of the rows: half of w_gate is held by nobody.
  try {
    check_block(c, [&](RankBlock& rb) {
      const std::int64_t q = rb.shape("w_gate").rows / 4;
      local_mlp(rb, rows(rb.rank().id() * q, q));
    });
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("gradient shards of w_gate"));
    EXPECT_THAT(e.what(), HasSubstr("do not tile"));
    EXPECT_THAT(e.what(), HasSubstr("held by no rank"));
  }
  // A proper tiling passes.
  const Report ok =
      check_block(c, [&](RankBlock& rb) { local_mlp(rb, column_parallel(rb.rank().id(), 2)); });
  EXPECT_TRUE(ok.ok());
}

TEST(BlockCheck, BadUseIsAnErrorNamingWhatIsWrong) {
  BlockCheck c = zigzag_check(Block::mlp, 2, 1, 16, model());
  // A layout that does not divide S.
  EXPECT_THAT([] { (void)tsp::SequenceLayout(tsp::LayoutKind::zigzag, 4, 18); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("18")));
  // Token shards that leave tokens out.
  BlockCheck gap = c;
  gap.tokens = [](int rank) { return TokenShard{0, 1, {rank}}; };
  EXPECT_THAT([&] { check_block(gap, [](RankBlock&) {}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("held by no rank")));
  // A schedule that returns without writing its output.
  EXPECT_THAT([&] { check_block(c, [](RankBlock& rb) { local_mlp(rb, replicated(), false); }); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("left dx unwritten")));
  // A shard whose size is not its map's (inside a rank: a RankFailure naming it).
  EXPECT_THAT(
      [&] {
        check_block(c, [](RankBlock& rb) {
          std::vector<float> g(3);
          rb.gradient("w_up", g, column_parallel(rb.rank().id(), 2));
        });
      },
      ::testing::ThrowsMessage<RankFailure>(HasSubstr("declared the w_up gradient with 3")));
  // A weight that the block does not have.
  EXPECT_THAT(
      [&] {
        check_block(c, [](RankBlock& rb) {
          local_mlp(rb, replicated());
          rb.gradient("wq", std::vector<float>(rb.shape("wq").rows * rb.shape("wq").cols),
                      replicated());
        });
      },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("not a weight of the MLP block")));
  // A map that does not divide the tensor.
  EXPECT_THAT(
      [&] {
        check_block(c, [](RankBlock& rb) { (void)rb.weight("w_up", column_parallel(0, 7)); });
      },
      ::testing::ThrowsMessage<RankFailure>(HasSubstr("not divisible by 7")));
}

TEST(BlockCheck, InjectionSeedsPassACorrectScheduleAndNameWhatChanges) {
  BlockCheck c = zigzag_check(Block::mlp, 4, 1, 32, model());
  c.inject_seeds = 3;
  const Report good = check_block(c, [](RankBlock& rb) { local_mlp(rb, replicated()); });
  EXPECT_TRUE(good.ok());
  EXPECT_TRUE(good.nondeterminism.empty());
  // A result that differs between runs (a planted dependence on how many runs came before).
  std::atomic<int> runs{0};
  const Report bad = check_block(c, [&](RankBlock& rb) {
    local_mlp(rb, replicated());
    if (rb.rank().id() == 2 && runs.fetch_add(1, std::memory_order_relaxed) > 0) rb.y()[0] += 1.0f;
  });
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.nondeterminism, HasSubstr("injection seed 1"));
  EXPECT_THAT(bad.nondeterminism, HasSubstr("changes y at (batch 0, position 8, feature 0)"));
  EXPECT_THAT(bad.nondeterminism, HasSubstr("ranks 2"));
}

TEST(BlockCheck, TraceAndSimulatedClockSeeTheUserScheduleGemms) {
  BlockCheck c = zigzag_check(Block::attention, 2, 1, 16, model());
  c.sim_clock = SimClockModel::preset("nvlink");
  c.trace_path = ::testing::TempDir() + "block_check_trace.json";
  const Report r = check_sp_attention(c);
  EXPECT_TRUE(r.ok());
  ASSERT_EQ(r.simulated_seconds.size(), 2u);
  // At least the block's GEMM FLOPs on the model's peak: q/k/v/o projections forward.
  const double C = c.model.hidden, N = 8, gemm = 2 * N * C * (2 * C + 2 * c.model.kv_dim());
  EXPECT_GE(r.simulated_seconds[0], gemm / c.sim_clock->peak_flops);
  std::ifstream f(c.trace_path);
  std::stringstream s;
  s << f.rdbuf();
  EXPECT_THAT(s.str(), HasSubstr("\"gemm\""));
  EXPECT_THAT(s.str(), HasSubstr("\"attention backward\""));
}

}  // namespace
}  // namespace tspemu::check
