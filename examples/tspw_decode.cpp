// TSP-W decoding (weights stationary, KV cache sharded over the sequence) written on the runtime's
// collectives and checked with the check kit's decode entry (check_decode) against the reference
// decoder and the fp64 oracle: logits of every step, sequence and rank, the KV cache, a free run.
//
// Rank r holds its Megatron shard of every layer (DecodeRank::tp_layer: head shard r of W_Q, W_K,
// W_V, column-parallel, and of W_O, row-parallel; MLP shard r); no weight moves. check::RowDecoder
// turns prefill and decode into one step over the new tokens (rows), keeps this rank's cache
// shard (positions by tsp::KvOwnership; each owner keeps K, RoPE'd at the GLOBAL position, and V
// of all KV heads) and gives the pieces every such schedule shares: the embedding, the
// vocab-parallel LM head, attention over this rank's keys, the merge of the partials at the head
// owners and the TP MLP. One step, per layer: q, k, v of r's heads; all-gather k, v (the owner
// appends them) and q; every rank attends all queries to its own keys; all-to-all of the
// (out, lse) partials to the head owners, merged by log-sum-exp in rank order; o_proj +
// all-reduce; the MLP TP-style + all-reduce.
//   tspw_decode [--ranks N] [--mutate rope-local]   (rope-local: RoPE at a key's local index)
// Exit 0: PASS, 1: FAIL (the report names step, sequence, rank, layer, position), 2: bad arguments.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tspemu/check/row_decoder.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"
#include "tspemu/reference/rope.hpp"
#include "tspemu/runtime/collectives.hpp"

using namespace tspemu;
using Vec = std::vector<float>;

class Tspw : public check::RowDecoder {
 public:
  Tspw(check::DecodeRank& dr, bool rope_local) : RowDecoder(dr), m_(dr.config()), bug_(rope_local) {
    for (int l = 0; l < m_.n_layers; ++l) layers_.push_back(dr.tp_layer(l));
  }

 private:
  Vec step(std::span<const check::DecodeRow> rows) override {
    Comm& comm = dr_.comm();
    const int D = comm.size(), r = comm.rank(), N = int(rows.size()), C = m_.hidden;
    const int hs = m_.head_size(), NH = m_.n_heads, NHl = NH / D, NKVl = m_.n_kv_heads / D;
    const int q = NHl * hs, kv = NKVl * hs;
    const std::size_t Nz = std::size_t(N);
    auto gather = [&](const Vec& mine) {
      Vec all(mine.size() * D);
      all_gather<float>(comm, mine, all);
      return all;
    };
    const tsp::KvOwnership& own = ownership();
    Vec x(Nz * C), xn(Nz * C), rstd(Nz), ql(Nz * q), kl(Nz * kv), vl(Nz * kv), qf(Nz * NH * hs),
        out(qf.size()), lse(Nz * NH), att(Nz * q), part(Nz * C), krow(std::size_t(kv) * D),
        vrow(krow.size());
    std::vector<std::int64_t> rot(Nz);  // RoPE at the global position; the bug: the owner's index
    embed(rows, x.data());
    for (std::size_t n = 0; n < Nz; ++n)
      rot[n] = bug_ ? own.count(own.owner(rows[n].seq, rows[n].pos), rows[n].seq, rows[n].pos)
                    : rows[n].pos;
    for (int l = 0; l < m_.n_layers; ++l) {
      const check::TpLayer& w = layers_[std::size_t(l)];
      ref::rmsnorm_forward(xn.data(), rstd.data(), x.data(), w.input_norm.data(), N, C,
                           m_.norm_eps);
      ref::matmul_nt(ql.data(), xn.data(), w.wq.data(), N, q, C);
      ref::matmul_nt(kl.data(), xn.data(), w.wk.data(), N, kv, C);
      ref::matmul_nt(vl.data(), xn.data(), w.wv.data(), N, kv, C);
      ref::rope_forward(ql.data(), rot.data(), 1, N, NHl, hs, m_.rope_base);
      ref::rope_forward(kl.data(), rot.data(), 1, N, NKVl, hs, m_.rope_base);
      const Vec ka = gather(kl), va = gather(vl), qa = gather(ql);  // [D, N, heads of rank p]
      for (std::size_t n = 0; n < Nz; ++n) {
        for (std::size_t p = 0; p < std::size_t(D); ++p) {
          std::copy_n(qa.data() + (p * Nz + n) * q, q, qf.data() + (n * D + p) * q);
          std::copy_n(ka.data() + (p * Nz + n) * kv, kv, krow.data() + p * kv);
          std::copy_n(va.data() + (p * Nz + n) * kv, kv, vrow.data() + p * kv);
        }
        if (own.owner(rows[n].seq, rows[n].pos) == r)
          cache().append(l, rows[n].seq, rows[n].pos, krow.data(), vrow.data());
      }
      attend_local(l, rows, qf.data(), out.data(), lse.data());  // none here: out 0, lse -inf
      merge_at_head_owners(rows, out.data(), lse.data(), att.data());
      ref::matmul_nt(part.data(), att.data(), w.wo.data(), N, C, q);  // o_proj, row-parallel
      add_all_reduced(part, x.data());
      tp_mlp(w, rows, x.data());
    }
    return logits(rows, x.data());  // the final norm, the vocab-parallel LM head, all-gathered
  }

  ref::ModelConfig m_;
  bool bug_;
  std::vector<check::TpLayer> layers_;
};

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  int ranks = 4;
  bool bug = false, usage = args.size() % 2 != 0;
  for (std::size_t a = 0; a + 1 < args.size(); a += 2) {
    if (args[a] == "--ranks")
      ranks = std::atoi(args[a + 1].c_str());
    else if (args[a] == "--mutate" && args[a + 1] == "rope-local")
      bug = true;
    else
      usage = true;
  }
  const ref::ModelConfig m{
      .vocab = 96, .hidden = 64, .n_layers = 2, .n_heads = 8, .n_kv_heads = 4, .ffn = 96};
  if (usage || ranks < 1 || m.n_kv_heads % ranks != 0) {
    std::cerr << "usage: tspw_decode [--ranks N] [--mutate rope-local]; N must divide NKV = 4\n";
    return 2;
  }
  const check::DecodeCheck c{.name = "tspw",
                             .model = m,
                             .ranks = ranks,
                             .prompts = check::seeded_prompts(m.vocab, {1, 7, 13, 16}, 3),
                             .steps = 12,
                             .free_run_steps = 32};
  const check::DecodeReport report = check::check_decode(
      c, [&](check::DecodeRank& dr) { return std::make_unique<Tspw>(dr, bug); });
  report.print(std::cout);
  return report.ok() ? 0 : 1;
}
