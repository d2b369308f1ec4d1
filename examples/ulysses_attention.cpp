// DeepSpeed-Ulysses attention, checked against the dense reference with the check kit.
//
// Each rank holds S/n tokens (zigzag layout) with every head. Inside the attention block's core,
// one all-to-all per tensor turns q, k, v [B, S/n, H, hs] into [B, S, H/n, hs]: the whole
// sequence on this rank's heads. Causal attention runs there; the inverse all-to-all brings the
// output back to the token owners. Backward is the same in reverse. The projections are the
// reference block's, so the weights are replicated and their gradients are all-reduced.
//
//   ulysses_attention [--ranks N] [--mutate position|no-reduce]
// Exit 0: PASS, 1: FAIL (the report names the tensor and element at fault), 2: bad arguments.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tspemu/check/block_check.hpp"
#include "tspemu/check/replicated_weights.hpp"
#include "tspemu/reference/attention.hpp"
#include "tspemu/runtime/collectives.hpp"
#include "tspemu/runtime/error.hpp"

using namespace tspemu;

namespace {

// What forward keeps for backward: the head-sharded tensors, over the whole sequence.
struct UlyssesState {
  std::vector<float> q, k, v, att, lse;  // [B, S, NH/n or NKV/n, hs]; lse [B, NH/n, S]
  std::vector<std::int64_t> pos;         // [S] rank-major, as the all-to-all orders tokens
};

ref::AttentionCore<float> ulysses_core(Comm& comm, const tsp::SequenceLayout& layout,
                                       bool position_bug) {
  auto st = std::make_shared<UlyssesState>();
  const int n = comm.size();
  for (int r = 0; r < n; ++r)
    for (std::int64_t p : layout.positions(r)) st->pos.push_back(p);
  // The planted bug: one gathered position off by one (the last token of rank 0's first chunk).
  if (position_bug) st->pos[static_cast<std::size_t>(layout.local_tokens() / 2 - 1)] += 1;
  auto to_heads = [&comm](const float* in, std::vector<float>& out, const ref::AttentionDims& d,
                          int H) {
    const SequenceHeadsShape s{std::size_t(d.B), std::size_t(d.Tq), std::size_t(H),
                               std::size_t(d.hs)};
    out.resize(s.B * s.S_local * s.H * s.hs);
    all_to_all_sequence_to_heads<float>(comm, {in, out.size()}, out, s);
  };
  auto to_sequence = [&comm](const std::vector<float>& in, float* out, const ref::AttentionDims& d,
                             int H) {
    const SequenceHeadsShape s{std::size_t(d.B), std::size_t(d.Tq), std::size_t(H),
                               std::size_t(d.hs)};
    all_to_all_heads_to_sequence<float>(comm, in, {out, in.size()}, s);
  };
  ref::AttentionCore<float> core;
  core.forward = [=](float* att, float* lse, const float* q, const float* k, const float* v,
                     const std::int64_t*, const ref::AttentionDims& d) {
    to_heads(q, st->q, d, d.NH);  // [B, S, NH/n, hs]
    to_heads(k, st->k, d, d.NKV);
    to_heads(v, st->v, d, d.NKV);
    const ref::AttentionDims h{d.B, n * d.Tq, n * d.Tq, d.NH / n, d.NKV / n, d.hs};
    st->att.resize(st->q.size());
    st->lse.resize(std::size_t(h.B) * h.NH * h.Tq);
    ref::causal_attention_forward(st->att.data(), st->lse.data(), st->q.data(), st->k.data(),
                                  st->v.data(), st->pos.data(), st->pos.data(), h);
    to_sequence(st->att, att, d, d.NH);  // [B, S/n, NH, hs]
    // Backward reads the head-sharded lse kept above, so the block's [B, NH, S/n] slot is unused.
    std::fill_n(lse, std::size_t(d.B) * d.NH * d.Tq, 0.0f);
  };
  core.backward = [=](float* dq, float* dk, float* dv, const float* datt, const float*,
                      const float*, const float*, const float*, const float*, const std::int64_t*,
                      const ref::AttentionDims& d) {
    const ref::AttentionDims h{d.B, n * d.Tq, n * d.Tq, d.NH / n, d.NKV / n, d.hs};
    std::vector<float> datt_h, dq_h(st->q.size()), dk_h(st->k.size()), dv_h(st->v.size());
    to_heads(datt, datt_h, d, d.NH);
    ref::causal_attention_backward(dq_h.data(), dk_h.data(), dv_h.data(), datt_h.data(),
                                   st->q.data(), st->k.data(), st->v.data(), st->lse.data(),
                                   st->pos.data(), st->pos.data(), h);
    to_sequence(dq_h, dq, d, d.NH);
    to_sequence(dk_h, dk, d, d.NKV);
    to_sequence(dv_h, dv, d, d.NKV);
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
      std::cerr << "usage: " << argv[0] << " [--ranks N] [--mutate position|no-reduce]\n";
      return 2;
    }
  }
  ref::ModelConfig m{
      .vocab = 16, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 192};
  if (ranks < 1 || m.n_kv_heads % ranks != 0 ||
      !(mutate.empty() || mutate == "position" || mutate == "no-reduce")) {
    std::cerr << "ulysses_attention: --ranks " << ranks << " must divide NKV = " << m.n_kv_heads
              << "; --mutate '" << mutate << "' must be position or no-reduce\n";
    return 2;
  }
  const int B = 2, S = 16 * ranks;
  const tsp::SequenceLayout layout(tsp::LayoutKind::zigzag, ranks, S);
  check::BlockCheck c;
  c.name = "ulysses";
  c.model = m;
  c.block = check::Block::attention;
  c.ranks = ranks;
  c.B = B;
  c.S = S;
  c.tokens = check::sequence_sharded(layout, B);
  try {
    const check::Report report = check::check_block(c, [&](check::RankBlock& rb) {
      check::attention_with_replicated_weights(
          rb, ulysses_core(rb.comm(), layout, mutate == "position"),
          /*reduce_gradients=*/mutate != "no-reduce");
    });
    report.print(std::cout);
    return report.ok() ? 0 : 1;
  } catch (const Error& e) {
    std::cout << "ulysses_attention: the schedule failed at run time:\n" << e.what() << "\n";
    return 1;
  }
}
