// Runs one baseline block (TP, Megatron-SP, SP, TP+SP; attention or MLP) on T·Sp ranks next to
// the dense reference in float and double on the same master weights and inputs (reusing
// block_harness.hpp), and gathers every output and gradient back to full tensors. It also checks
// what the schedule promises about replicas: ranks of a row hold bitwise equal outputs and dX
// (without Megatron-SP), ranks of a column bitwise equal weight-shard gradients, and every rank
// the same norm-weight gradient.
#pragma once

#include <cstring>

#include "block_harness.hpp"
#include "tspemu/tsp/baseline_attention.hpp"
#include "tspemu/tsp/baseline_mlp.hpp"

namespace tspemu::tsp::testing {

struct BaselineCase {
  Block block = Block::attention;
  int T = 1, Sp = 1;
  bool sequence_parallel = false;
  int NH = 4, NKV = 4, hs = 8, B = 1, S = 16;
  std::uint64_t seed = 7;

  // The same model as block_harness.hpp's Case (ffn = 3·NH·hs), for run_reference.
  Case reference_case() const {
    Case c;
    c.block = block;
    c.NH = NH;
    c.NKV = NKV;
    c.hs = hs;
    c.B = B;
    c.S = S;
    c.seed = seed;
    return c;
  }
  BaselineShape shape() const {
    BaselineShape s;
    s.model = reference_case().shape().model;
    s.T = T;
    s.Sp = Sp;
    s.B = B;
    s.S = S;
    s.sequence_parallel = sequence_parallel;
    return s;
  }
  std::string name() const {
    return shape().strategy() + " " + (block == Block::attention ? "attention" : "mlp") +
           " T=" + std::to_string(T) + " Sp=" + std::to_string(Sp) + " NH=" + std::to_string(NH) +
           " NKV=" + std::to_string(NKV) + " B=" + std::to_string(B) + " S=" + std::to_string(S);
  }
};

struct ReplicaMismatches {
  std::vector<std::string> what;
};

// `per_rank` runs inside each rank before the block (e.g. a random delay). Replica mismatches
// (see the file comment) are appended to `replicas` when given.
inline Results<float> run_baseline(const BaselineCase& c, World& world,
                                   const ref::LayerWeights<float>& w, const std::vector<float>& x,
                                   const std::vector<float>& dy,
                                   ReplicaMismatches* replicas = nullptr,
                                   const std::function<void(Rank&)>& per_rank = {}) {
  const BaselineShape s = c.shape();
  const TspShape shard = s.shard_shape();
  const int C = s.model.hidden;
  const std::size_t local = static_cast<std::size_t>(c.B) * s.rows() * C;
  Results<float> r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.grads = ref::LayerWeights<float>::zeros(s.model);
  // Every rank's results, for the replica checks: [rank] -> y, dx, grad shard, grad norm.
  std::vector<std::vector<float>> ys(static_cast<std::size_t>(s.ranks())), dxs(ys.size()),
      gshards(ys.size()), gnorms(ys.size());
  world.run([&](Rank& rank) {
    if (per_rank) per_rank(rank);
    const int p = rank.id();
    const auto pos = s.positions(p);
    Arena& a = rank.arena();
    auto xl = a.allocate<float>(local, Category::activations);
    auto yl = a.allocate<float>(local, Category::activations);
    auto dyl = a.allocate<float>(local, Category::workspace);
    auto dxl = a.allocate<float>(local, Category::workspace);
    auto rows = [&](auto fn) {  // fn(local row offset, global row offset)
      for (int b = 0; b < c.B; ++b)
        for (int i = 0; i < s.rows(); ++i)
          fn((static_cast<std::size_t>(b) * s.rows() + i) * C,
             (static_cast<std::size_t>(b) * c.S + pos[static_cast<std::size_t>(i)]) * C);
    };
    rows([&](std::size_t l, std::size_t g) {
      std::memcpy(xl.data() + l, x.data() + g, C * sizeof(float));
      std::memcpy(dyl.data() + l, dy.data() + g, C * sizeof(float));
    });
    auto finish = [&](const auto& block, std::vector<float>& norm_full, auto unpack) {
      // Only one replica writes each element: column 0 of a row writes its tokens (every rank
      // under Megatron-SP), row 0 writes its column's gradient shard, rank 0 the norm gradient.
      if (s.sequence_parallel || s.col(p) == 0)
        rows([&](std::size_t l, std::size_t g) {
          std::memcpy(r.y.data() + g, yl.data() + l, C * sizeof(float));
          std::memcpy(r.dx.data() + g, dxl.data() + l, C * sizeof(float));
        });
      if (s.row(p) == 0) unpack(block.grad_shard().data(), shard, s.col(p), r.grads);
      if (p == 0)
        std::copy(block.grad_norm().data(), block.grad_norm().data() + C, norm_full.begin());
      const auto i = static_cast<std::size_t>(p);
      ys[i].assign(yl.data(), yl.data() + local);
      dxs[i].assign(dxl.data(), dxl.data() + local);
      gshards[i].assign(block.grad_shard().data(),
                        block.grad_shard().data() + block.grad_shard().size());
      gnorms[i].assign(block.grad_norm().data(), block.grad_norm().data() + C);
    };
    if (c.block == Block::attention) {
      BaselineAttention att(rank, s, w);
      att.forward(xl.data(), yl.data());
      att.backward(xl.data(), dyl.data(), dxl.data());
      finish(att, r.grads.input_norm, unpack_attention_shard);
    } else {
      BaselineMlp mlp(rank, s, w);
      mlp.forward(xl.data(), yl.data());
      mlp.backward(xl.data(), dyl.data(), dxl.data());
      finish(mlp, r.grads.post_norm, unpack_mlp_shard);
    }
  });
  if (replicas) {
    for (int p = 0; p < s.ranks(); ++p) {
      const auto i = static_cast<std::size_t>(p);
      const auto row0 = static_cast<std::size_t>(s.row(p) * s.T);  // column 0 of p's row
      const auto col0 = static_cast<std::size_t>(s.col(p));        // row 0 of p's column
      const std::string who = "rank " + std::to_string(p) + ": ";
      if (!s.sequence_parallel && (ys[i] != ys[row0] || dxs[i] != dxs[row0]))
        replicas->what.push_back(who + "y or dx differ from column 0 of the row");
      if (gshards[i] != gshards[col0])
        replicas->what.push_back(who + "weight-shard gradient differs from row 0");
      if (gnorms[i] != gnorms[0]) replicas->what.push_back(who + "norm gradient differs");
    }
  }
  return r;
}

struct BaselineOutcome {
  Results<double> oracle;
  Results<float> reference;
  Results<float> parallel;
  ReplicaMismatches replicas;
};

inline BaselineOutcome run_baseline_case(const BaselineCase& bc, World& world) {
  const Case c = bc.reference_case();
  const TspShape s = c.shape();
  bc.shape().validate();
  auto w64 = ref::init_weights<double>(s.model, c.seed);
  auto w32 = ref::convert_weights<float>(w64);
  const std::size_t n = static_cast<std::size_t>(c.B) * c.S * s.model.hidden;
  auto x64 = random_tensor<double>(n, c.seed + 1);
  auto dy64 = random_tensor<double>(n, c.seed + 2);
  std::vector<float> x32(x64.begin(), x64.end()), dy32(dy64.begin(), dy64.end());
  std::vector<double> x(x32.begin(), x32.end()), dy(dy32.begin(), dy32.end());
  auto w_oracle = ref::convert_weights<double>(w32);
  BaselineOutcome o;
  o.oracle = run_reference<double>(c, w_oracle.layers[0], x, dy);
  o.reference = run_reference<float>(c, w32.layers[0], x32, dy32);
  o.parallel = run_baseline(bc, world, w32.layers[0], x32, dy32, &o.replicas);
  return o;
}

}  // namespace tspemu::tsp::testing
