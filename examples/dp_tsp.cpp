// Data parallelism x TSP on a 2-D mesh, a whole layer, checked against the dense reference with
// the check kit.
//
// ranks = replicas x D, rank = replica·D + i. The world splits into a TSP group per replica (its
// D ranks, ordered by i) and a data-parallel group per i (one rank of each replica). Each TSP
// group runs TSP attention then the TSP MLP on its replica's batches, every rank holding the
// zigzag tokens of its i; the gradient shards are then all-reduced over the data-parallel group,
// so replicas of a shard are bitwise equal, as the kit requires.
//
//   dp_tsp [--ranks N] [--replicas R] [--mutate no-dp-reduce]     (default 4 ranks = 2 x 2)
// Exit 0: PASS, 1: FAIL (the report names the tensor and element at fault), 2: bad arguments.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tspemu/check/block_check.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"
#include "tspemu/tsp/packed_shards.hpp"
#include "tspemu/tsp/tsp_attention.hpp"
#include "tspemu/tsp/tsp_mlp.hpp"

using namespace tspemu;

int main(int argc, char** argv) {
  int ranks = 4, replicas = 2;
  std::string mutate;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--ranks" && a + 1 < argc) {
      ranks = std::atoi(argv[++a]);
    } else if (arg == "--replicas" && a + 1 < argc) {
      replicas = std::atoi(argv[++a]);
    } else if (arg == "--mutate" && a + 1 < argc) {
      mutate = argv[++a];
    } else {
      std::cerr << "usage: " << argv[0] << " [--ranks N] [--replicas R] [--mutate no-dp-reduce]\n";
      return 2;
    }
  }
  const ref::ModelConfig m{
      .vocab = 16, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 192};
  const int B = 2;
  if (ranks < 1 || replicas < 1 || ranks % replicas != 0 || B % replicas != 0 ||
      m.n_kv_heads % (ranks / replicas) != 0 || !(mutate.empty() || mutate == "no-dp-reduce")) {
    std::cerr << "dp_tsp: --ranks " << ranks << " must be --replicas " << replicas
              << " x D with D dividing NKV = " << m.n_kv_heads << " and replicas dividing B = " << B
              << "; --mutate '" << mutate << "' must be no-dp-reduce\n";
    return 2;
  }
  const int D = ranks / replicas, S = 16 * D;
  const tsp::SequenceLayout layout(tsp::LayoutKind::zigzag, D, S);
  check::BlockCheck c;
  c.name = "dp x tsp";
  c.model = m;
  c.block = check::Block::layer;
  c.ranks = ranks;
  c.B = B;
  c.S = S;
  c.tokens = check::data_parallel(replicas, D, B, check::sequence_sharded(layout, B / replicas));
  tsp::TspShape shape;
  shape.model = m;
  shape.D = D;
  shape.B = B / replicas;
  shape.S = S;
  try {
    const check::Report report = check::check_block(c, [&](check::RankBlock& rb) {
      const int replica = rb.rank().id() / D, i = rb.rank().id() % D;
      Comm tsp_group = rb.comm().split(replica, i, "tsp" + std::to_string(replica));
      Comm dp_group = rb.comm().split(i, replica, "dp" + std::to_string(i));
      tsp::TspAttention attention(rb.rank(), tsp_group, shape, rb.master());
      tsp::TspMlp mlp(rb.rank(), tsp_group, shape, rb.master());
      std::vector<float> mid(rb.x().size()), dmid(rb.x().size());  // [B/replicas, S/D, C]
      attention.forward(rb.x().data(), mid.data());
      mlp.forward(mid.data(), rb.y().data());
      mlp.backward(mid.data(), rb.dy().data(), dmid.data());
      attention.backward(rb.x().data(), dmid.data(), rb.dx().data());

      // Gradient shards, copied out to be summed over the replicas.
      auto copy = [](const Buffer<float>& b) { return std::vector<float>(b.begin(), b.end()); };
      std::vector<float> g_att = copy(attention.grad_shard()), g_mlp = copy(mlp.grad_shard()),
                         g_in = copy(attention.grad_norm()), g_post = copy(mlp.grad_norm());
      const std::vector<std::span<float>> grads = {g_att, g_mlp, g_in, g_post};
      if (mutate != "no-dp-reduce") all_reduce_buffers<float>(dp_group, grads);

      const auto a = tsp::attention_view(g_att.data(), shape);
      const auto f = tsp::mlp_view(g_mlp.data(), shape);
      auto declare = [&](const char* name, const float* shard, const check::ShardMap& map) {
        const check::TensorShape t = rb.shape(name);
        rb.gradient(name, {shard, std::size_t(t.rows * t.cols / D)}, map);
      };
      for (auto [name, shard] : {std::pair{"wq", a.wq}, std::pair{"wk", a.wk},
                                 std::pair{"wv", a.wv}, std::pair{"wo", a.wo}})
        declare(name, shard, check::head_sharded(i, D));
      declare("w_gate", f.gate, check::column_parallel(i, D));
      declare("w_up", f.up, check::column_parallel(i, D));
      declare("w_down", f.down, check::row_parallel(i, D));
      rb.gradient("input_norm", g_in, check::replicated());
      rb.gradient("post_norm", g_post, check::replicated());
    });
    report.print(std::cout);
    return report.ok() ? 0 : 1;
  } catch (const Error& e) {
    std::cout << "dp_tsp: the schedule failed at run time:\n" << e.what() << "\n";
    return 1;
  }
}
