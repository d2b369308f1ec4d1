// Ring attention (zigzag layout), checked against the dense reference with the check kit.
//
// Each rank keeps its queries and passes its K/V block round the ring (to rank + 1, from
// rank - 1) with sendrecv. At step s it holds the block of rank (rank - s) mod n, attends its
// queries to it at that block's global positions, and folds the partial output into a running
// one by log-sum-exp (merge_attention_partials). Backward runs the ring again on the final
// out and lse (delta = rowsum(dout * out) over the full output): dq accumulates locally, and
// each block's dK/dV travels with its K/V, every rank adding its queries' share, so after n hops
// the block arrives home with its complete gradient. Weights are replicated and their gradients
// all-reduced.
//
//   ring_attention [--ranks N] [--mutate direction|no-reduce]
// Exit 0: PASS, 1: FAIL (or a runtime failure such as a hang, printed), 2: bad arguments.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "tspemu/check/block_check.hpp"
#include "tspemu/check/replicated_weights.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"

using namespace tspemu;

namespace {

// direction_bug: rank 0 sends its block the wrong way round (to rank - 1). With two ranks both
// ways reach the same neighbour, so the bug only shows from three ranks on.
ref::AttentionCore<float> ring_core(Comm& comm, const tsp::SequenceLayout& layout,
                                    bool direction_bug) {
  const int n = comm.size(), r = comm.rank();
  const int next = (direction_bug && r == 0 ? r + n - 1 : r + 1) % n, prev = (r + n - 1) % n;
  // One ring step: send `cur` on, receive the previous rank's into `other`, then swap them.
  auto pass_on = [&comm, next, prev](std::vector<float>& cur, std::vector<float>& other) {
    sendrecv<float>(comm, cur, next, other, prev);
    cur.swap(other);
  };
  ref::AttentionCore<float> core;
  core.forward = [=](float* att, float* lse, const float* q, const float* k, const float* v,
                     const std::int64_t* pos, const ref::AttentionDims& d) {
    const std::size_t E = std::size_t(d.B) * d.Tk * d.NKV * d.hs;  // one K or V block
    std::vector<float> kv(k, k + E), other(2 * E), part(std::size_t(d.B) * d.Tq * d.NH * d.hs),
        part_lse(std::size_t(d.B) * d.NH * d.Tq);
    kv.insert(kv.end(), v, v + E);  // [K | V] of the block in hand
    std::fill_n(att, part.size(), 0.0f);
    std::fill_n(lse, part_lse.size(), -std::numeric_limits<float>::infinity());
    for (int s = 0; s < n; ++s) {
      const auto kpos = layout.positions((r - s + n) % n);
      ref::causal_attention_forward(part.data(), part_lse.data(), q, kv.data(), kv.data() + E, pos,
                                    kpos.data(), d);
      ref::merge_attention_partials(att, lse, part.data(), part_lse.data(), d);
      if (s + 1 < n) pass_on(kv, other);
    }
  };
  core.backward = [=](float* dq, float* dk, float* dv, const float* datt, const float* q,
                      const float* k, const float* v, const float* att, const float* lse,
                      const std::int64_t* pos, const ref::AttentionDims& d) {
    const std::size_t E = std::size_t(d.B) * d.Tk * d.NKV * d.hs;
    std::vector<float> blk(k, k + E), other(4 * E), delta(std::size_t(d.B) * d.NH * d.Tq);
    blk.insert(blk.end(), v, v + E);
    blk.resize(4 * E, 0.0f);  // [K | V | dK | dV]: the gradient travels with its block
    ref::attention_row_delta(delta.data(), datt, att, d);
    std::fill_n(dq, std::size_t(d.B) * d.Tq * d.NH * d.hs, 0.0f);
    for (int s = 0; s < n; ++s) {
      const auto kpos = layout.positions((r - s + n) % n);
      float* b = blk.data();
      ref::causal_attention_backward(dq, b + 2 * E, b + 3 * E, datt, q, b, b + E, lse, pos,
                                     kpos.data(), d, delta.data(), /*accumulate=*/true);
      pass_on(blk, other);  // n hops: the last one brings this rank's own block home
    }
    std::copy_n(blk.data() + 2 * E, E, dk);
    std::copy_n(blk.data() + 3 * E, E, dv);
  };
  return core;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4;
  std::string mutate;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--ranks" && a + 1 < argc) {
      ranks = std::atoi(argv[++a]);
    } else if (arg == "--mutate" && a + 1 < argc) {
      mutate = argv[++a];
    } else {
      std::cerr << "usage: " << argv[0] << " [--ranks N] [--mutate direction|no-reduce]\n";
      return 2;
    }
  }
  if (ranks < 1 || !(mutate.empty() || mutate == "direction" || mutate == "no-reduce")) {
    std::cerr << "ring_attention: --ranks " << ranks << " must be >= 1; --mutate '" << mutate
              << "' must be direction or no-reduce\n";
    return 2;
  }
  const ref::ModelConfig m{
      .vocab = 16, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 192};
  const int B = 2, S = 16 * ranks;
  const tsp::SequenceLayout layout(tsp::LayoutKind::zigzag, ranks, S);
  check::BlockCheck c;
  c.name = "ring";
  c.model = m;
  c.block = check::Block::attention;
  c.ranks = ranks;
  c.B = B;
  c.S = S;
  c.tokens = check::sequence_sharded(layout, B);
  if (mutate == "direction") {
    c.watchdog_timeout = std::chrono::milliseconds(1'000);  // the expected hang, found sooner
    if (ranks <= 2) std::cerr << "note: on 2 ranks both ring directions are one neighbour\n";
  }
  try {
    const check::Report report = check::check_block(c, [&](check::RankBlock& rb) {
      check::attention_with_replicated_weights(rb,
                                               ring_core(rb.comm(), layout, mutate == "direction"),
                                               /*reduce_gradients=*/mutate != "no-reduce");
    });
    report.print(std::cout);
    return report.ok() ? 0 : 1;
  } catch (const Error& e) {
    std::cout << "ring_attention: the schedule failed at run time:\n" << e.what() << "\n";
    return 1;
  }
}
