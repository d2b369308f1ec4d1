// The fp64 oracle runs its GEMM row blocks and attention heads as oneTBB tasks
// (reference/oracle_tasks.hpp): its loss and every gradient must be bitwise identical with one
// thread and with many.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"

namespace tspemu::ref::testing {
namespace {

struct OracleStep {
  double loss = 0;
  ModelWeights<double> grads;
};

OracleStep oracle_step(const ModelWeights<double>& w, const Batch& batch) {
  OracleStep s;
  ModelCache<double> cache;
  s.loss = model_forward(w, batch, cache);
  model_backward(w, batch, cache, s.grads);
  return s;
}

TEST(OracleTasks, LossAndGradientsAreBitwiseIdenticalOnOneThreadAndOnMany) {
  // Large enough that the projections and the MLP split into GEMM row blocks (M = B·T = 512 rows,
  // 8 blocks), with GQA so the backward's tasks each own a K/V head shared by two query heads.
  ModelConfig c = tiny_gqa_config();
  c.hidden = 128;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.ffn = 352;
  c.vocab = 96;
  const int B = 2, T = 256;
  const auto w = init_weights<double>(c, 5);
  const auto tokens = random_tokens(static_cast<std::size_t>(B) * T, c.vocab, 6);
  const auto targets = random_tokens(static_cast<std::size_t>(B) * T, c.vocab, 7);
  const Batch batch{B, T, tokens, targets, {}};

  OracleStep one;
  {
    tbb::global_control serial(tbb::global_control::max_allowed_parallelism, 1);
    one = oracle_step(w, batch);
  }
  tbb::task_arena many(8);
  OracleStep parallel = many.execute([&] { return oracle_step(w, batch); });

  EXPECT_EQ(std::memcmp(&one.loss, &parallel.loss, sizeof(double)), 0)
      << one.loss << " vs " << parallel.loss;
  const auto a = parameters(static_cast<const ModelWeights<double>&>(one.grads));
  const auto b = parameters(static_cast<const ModelWeights<double>&>(parallel.grads));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].data->size(), b[i].data->size());
    EXPECT_EQ(std::memcmp(a[i].data->data(), b[i].data->data(), a[i].data->size() * sizeof(double)),
              0)
        << a[i].name;
  }
}

}  // namespace
}  // namespace tspemu::ref::testing
