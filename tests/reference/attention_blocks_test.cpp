// Statistics-aware attention kernels: attending key blocks one at a time and merging them by
// their logsumexp, and the blockwise backward on the merged statistics (FlashAttention-2, ring
// attention), agree with the one-shot kernels by the fp64-oracle rule; merge, row delta and
// accumulate behave as their contracts say.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blockwise_attention.hpp"
#include "test_util.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/numerics.hpp"

namespace tspemu::ref {
namespace {

using testing::random_vector;

using testing::kOracleFactor;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Queries and keys are the same T tokens stored in `positions` order; the keys are split into
// `blocks` (indices into storage order).
struct Problem {
  std::string name;
  AttentionDims d;
  std::vector<std::int64_t> positions;  // [T]
  std::vector<std::vector<int>> blocks;
  std::vector<double> q, k, v, dout;  // [B, T, NH|NKV, hs]
};

Problem make_problem(std::string name, std::vector<std::int64_t> positions,
                     std::vector<std::vector<int>> blocks) {
  const int T = int(positions.size());
  Problem p{
      std::move(name), {2, T, T, 4, 2, 8}, std::move(positions), std::move(blocks), {}, {}, {}, {}};
  const std::size_t nq = std::size_t(p.d.B) * T * p.d.NH * p.d.hs;
  const std::size_t nkv = std::size_t(p.d.B) * T * p.d.NKV * p.d.hs;
  // q scaled up so the softmax is peaked and the blocks' weights differ by orders of magnitude.
  p.q = random_vector(nq, 11, 1.5);
  p.k = random_vector(nkv, 12);
  p.v = random_vector(nkv, 13);
  p.dout = random_vector(nq, 14);
  return p;
}

// T = 200 crosses the kernels' 128-query GEMM block; zigzag blocks mix early and late keys.
std::vector<Problem> problems() {
  const int T = 200;
  using testing::contiguous_blocks;
  using testing::zigzag_positions;
  return {
      make_problem("contiguous, 2 blocks", testing::iota_positions(T), contiguous_blocks(T, 2)),
      make_problem("contiguous, 3 uneven blocks", testing::iota_positions(T),
                   contiguous_blocks(T, 3)),
      make_problem("zigzag D=2, a block per chunk", zigzag_positions(T, 2),
                   contiguous_blocks(T, 4)),
      make_problem("zigzag D=4, a block per rank", zigzag_positions(T, 4), contiguous_blocks(T, 4)),
  };
}

using testing::as;

template <class T>
struct Attention {
  std::vector<T> out, lse, dq, dk, dv;

  const std::vector<T>& operator[](const std::string& name) const {
    if (name == "out") return out;
    if (name == "lse") return lse;
    if (name == "dq") return dq;
    if (name == "dk") return dk;
    if (name == "dv") return dv;
    throw std::out_of_range("Attention: no tensor " + name);
  }
};

template <class T>
Attention<T> run(const Problem& p, bool blockwise) {
  const auto q = as<T>(p.q), k = as<T>(p.k), v = as<T>(p.v), dout = as<T>(p.dout);
  const std::int64_t* pos = p.positions.data();
  Attention<T> a{std::vector<T>(q.size()), std::vector<T>(std::size_t(p.d.B) * p.d.NH * p.d.Tq),
                 std::vector<T>(q.size()), std::vector<T>(k.size()), std::vector<T>(v.size())};
  if (blockwise) {
    testing::blockwise_attention_forward(a.out.data(), a.lse.data(), q.data(), k.data(), v.data(),
                                         pos, pos, p.d, p.blocks);
    testing::blockwise_attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), dout.data(),
                                          q.data(), k.data(), v.data(), a.out.data(), a.lse.data(),
                                          pos, pos, p.d, p.blocks);
  } else {
    causal_attention_forward(a.out.data(), a.lse.data(), q.data(), k.data(), v.data(), pos, pos,
                             p.d);
    causal_attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), dout.data(), q.data(),
                              k.data(), v.data(), a.lse.data(), pos, pos, p.d);
  }
  return a;
}

// For every problem: the blockwise fp32 tensors against the one-shot fp32 ones and the one-shot
// fp64 oracle, by the oracle rule.
void expect_blockwise_passes_oracle_rule(const std::vector<std::string>& tensors) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(p.name);
    const auto cand = run<float>(p, true), ref32 = run<float>(p, false);
    const auto oracle = run<double>(p, false);
    for (const std::string& t : tensors) {
      const Verdict v = check_close(p.name + " " + t, cand[t], ref32[t], oracle[t], kOracleFactor);
      EXPECT_TRUE(v) << v.report;
    }
  }
}

TEST(AttentionBlocks, KeyBlocksMergedByLogsumexpEqualTheOneShotForward) {
  expect_blockwise_passes_oracle_rule({"out", "lse"});
}

TEST(AttentionBlocks, BlockwiseBackwardOnMergedStatisticsEqualsTheOneShotBackward) {
  expect_blockwise_passes_oracle_rule({"dq", "dk", "dv"});
}

// The double instantiation of the blockwise path must also be the oracle's own result (up to
// double rounding): a wrong statistic would show in fp64 as well as in fp32.
TEST(AttentionBlocks, BlockwiseFp64MatchesOneShotFp64) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(p.name);
    const auto blk = run<double>(p, true), one = run<double>(p, false);
    for (const std::string t : {"out", "lse", "dq", "dk", "dv"}) {
      const Verdict v = check_close64(t, blk[t], one[t], 1e-13);
      EXPECT_TRUE(v) << v.report;
    }
  }
}

TEST(AttentionBlocks, RowDeltaEqualsRowsumOfPTimesDPOfTheReferenceBackward) {
  const Problem p = make_problem("zigzag", testing::zigzag_positions(40, 2), {});
  const AttentionDims& d = p.d;
  std::vector<double> out(p.q.size()), lse(std::size_t(d.B) * d.NH * d.Tq), delta(lse.size());
  causal_attention_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(),
                           p.positions.data(), p.positions.data(), d);
  attention_row_delta(delta.data(), p.dout.data(), out.data(), d);
  // rowsum(P ∘ dP) with P = exp(s - lse) and dP = dout Vᵀ, one scalar at a time.
  std::vector<double> expect(delta.size());
  const int group = d.NH / d.NKV;
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.NH; ++h) {
      for (int i = 0; i < d.Tq; ++i) {
        const std::size_t r = (std::size_t(b) * d.NH + h) * d.Tq + i;
        const std::size_t qi = ((std::size_t(b) * d.Tq + i) * d.NH + h) * d.hs;
        double sum = 0;
        for (int j = 0; j < d.Tk; ++j) {
          if (p.positions[j] > p.positions[i]) continue;
          const std::size_t kj = ((std::size_t(b) * d.Tk + j) * d.NKV + h / group) * d.hs;
          double s = 0, dp = 0;
          for (int c = 0; c < d.hs; ++c) {
            s += p.q[qi + c] * p.k[kj + c];
            dp += p.dout[qi + c] * p.v[kj + c];
          }
          sum += std::exp(s / std::sqrt(double(d.hs)) - lse[r]) * dp;
        }
        expect[r] = sum;
      }
    }
  }
  const Verdict v = check_close64("delta", delta, expect, 1e-13);
  EXPECT_TRUE(v) << v.report;
}

TEST(AttentionBlocks, AccumulateAddsToGradientsAndLeavesRowsWithoutKeysUntouched) {
  // Queries 0..5; keys at 3..8: queries 0..2 see no key. A second key set lies after every query.
  const AttentionDims d{1, 6, 6, 2, 1, 4};
  const std::vector<std::int64_t> qpos = {0, 1, 2, 3, 4, 5}, kpos = {3, 4, 5, 6, 7, 8},
                                  late = {10, 11, 12, 13, 14, 15};
  const auto q = random_vector(6 * 2 * 4, 21), k = random_vector(6 * 4, 22),
             v = random_vector(6 * 4, 23), dout = random_vector(q.size(), 24);
  const auto q0 = random_vector(q.size(), 25), k0 = random_vector(k.size(), 26),
             v0 = random_vector(v.size(), 27);
  std::vector<double> out(q.size()), lse(2 * 6), delta(lse.size());
  causal_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), qpos.data(),
                           kpos.data(), d);
  attention_row_delta(delta.data(), dout.data(), out.data(), d);

  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  causal_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                            v.data(), lse.data(), qpos.data(), kpos.data(), d, delta.data());
  std::vector<double> aq = q0, ak = k0, av = v0;
  causal_attention_backward(aq.data(), ak.data(), av.data(), dout.data(), q.data(), k.data(),
                            v.data(), lse.data(), qpos.data(), kpos.data(), d, delta.data(), true);
  for (auto [name, acc, init, fresh] :
       {std::tuple{"dq", &aq, &q0, &dq}, std::tuple{"dk", &ak, &k0, &dk},
        std::tuple{"dv", &av, &v0, &dv}}) {
    std::vector<double> expect(init->size());
    for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = (*init)[i] + (*fresh)[i];
    const Verdict verdict = check_close64(name, *acc, expect, 1e-14);
    EXPECT_TRUE(verdict) << verdict.report;
  }
  for (int i = 0; i < 3 * 2 * 4; ++i) EXPECT_EQ(aq[i], q0[i]) << "dq of a query that sees no key";

  // Every query before every key: nothing is added anywhere, bit for bit.
  std::vector<double> nq = q0, nk = k0, nv = v0;
  causal_attention_backward(nq.data(), nk.data(), nv.data(), dout.data(), q.data(), k.data(),
                            v.data(), lse.data(), qpos.data(), late.data(), d, delta.data(), true);
  EXPECT_EQ(nq, q0);
  EXPECT_EQ(nk, k0);
  EXPECT_EQ(nv, v0);
}

TEST(AttentionBlocks, MergeTreatsMinusInfinityAsEmptyAndNeverMakesNaN) {
  // One batch, one head, 4 rows of hs = 2; rows: (running, partial) =
  //   0: (-inf, -inf)  1: (finite, -inf)  2: (-inf, finite)  3: (finite, much smaller finite)
  const AttentionDims d{1, 4, 1, 1, 1, 2};
  std::vector<double> out = {0, 0, 1.5, -2, kInf, -kInf, 3, 4};
  std::vector<double> lse = {-kInf, 0.25, -kInf, 1000};
  const std::vector<double> part = {7, 8, 9, 10, 11, -12, 13, 14};
  const std::vector<double> part_lse = {-kInf, -kInf, -3, 0};
  merge_attention_partials(out.data(), lse.data(), part.data(), part_lse.data(), d);
  EXPECT_EQ(out, (std::vector<double>{0, 0, 1.5, -2, 11, -12, 3, 4}));
  EXPECT_EQ(lse, (std::vector<double>{-kInf, 0.25, -3, 1000}));

  // The same in float, with the running side's lse far above the partial's: exp underflows to 0.
  std::vector<float> fo = {1, 2}, fl = {80}, fp = {5, 6}, fpl = {-80};
  merge_attention_partials(fo.data(), fl.data(), fp.data(), fpl.data(),
                           AttentionDims{1, 1, 1, 1, 1, 2});
  EXPECT_EQ(fo, (std::vector<float>{1, 2}));
  EXPECT_EQ(fl[0], 80.0f);
}

TEST(AttentionBlocks, MergedKeyBlocksWithNoVisibleKeyLeaveNoNaN) {
  // The last quarter of the keys comes after every query of the first quarter, etc.: many
  // (query, block) pairs are fully masked and return lse = -inf partials.
  const Problem p =
      make_problem("contiguous", testing::iota_positions(16), testing::contiguous_blocks(16, 4));
  const auto a = run<double>(p, true);
  for (const auto* t : {&a.out, &a.lse, &a.dq, &a.dk, &a.dv}) {
    for (double x : *t) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(AttentionBlocks, BadDimsThrowNamingTheFunctionAndTheValues) {
  std::vector<double> buf(64);
  const AttentionDims bad{1, 2, 2, 3, 2, 4};
  try {
    merge_attention_partials(buf.data(), buf.data() + 8, buf.data() + 16, buf.data() + 32, bad);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("merge_attention_partials"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("NH=3 NKV=2"));
  }
  try {
    attention_row_delta(buf.data(), buf.data(), buf.data(), AttentionDims{1, 2, 2, 2, 2, 0});
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("attention_row_delta"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("hs=0"));
  }
  const std::int64_t pos[2] = {0, 1};
  EXPECT_THROW(causal_attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                         buf.data(), buf.data(), buf.data(), pos, pos, bad,
                                         buf.data(), true),
               std::invalid_argument);
}

}  // namespace
}  // namespace tspemu::ref
