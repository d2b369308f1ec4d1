// USP (unified sequence parallelism): DeepSpeed-Ulysses inside each row of a 2-D mesh, ring
// attention across the rows, written with the library's cores on sub-groups and checked against
// the dense reference with the check kit.
//
// The ranks form a mesh of R rows × U columns (Mesh: "ring" × "ulysses" axes made by
// Comm::split). Tokens are laid out in two levels: zigzag over the rows (so each ring step has the
// same causal work), then contiguous over a row's U ranks. The Ulysses core on the row trades the
// sequence axis for the head axis, so the row's tokens sit on U times fewer heads; its inner core
// is ring attention on the column, which passes those heads' K/V blocks round the R rows.
// Weights are replicated and their gradients summed over every rank.
//
//   usp [--ranks N] [--ring R] [--mutate position|no-reduce]
// N = U·R ranks (R defaults to 2 when N is even); exit 0: PASS, 1: FAIL (the report names the
// tensor and element at fault), 2: bad arguments.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tspemu/tspemu.hpp"

using namespace tspemu;

namespace {

// ---- The schedule: one rank's USP attention core ----------------------------------------------

// position_bug: the ring's keys of row 0 are one position late (a zigzag chunk off by one).
ref::AttentionCore<float> usp_core(Mesh& mesh, Arena& arena, const tsp::TwoLevelLayout& layout,
                                   const ref::AttentionDims& d, bool position_bug) {
  Comm& row = mesh.axis("ulysses");
  Comm& column = mesh.axis("ring");
  const int U = row.size(), R = column.size();
  // The Ulysses exchange gathers the row's tokens member by member.
  std::vector<std::int64_t> row_tokens;
  for (int i = 0; i < U; ++i)
    for (std::int64_t p : layout.positions(column.rank(), i)) row_tokens.push_back(p);
  // On the heads layout every row holds its zigzag shard in position order: the ring's blocks.
  std::vector<std::int64_t> ring_tokens;
  for (int o = 0; o < R; ++o) {
    std::vector<std::int64_t> p = layout.outer().positions(o);
    std::sort(p.begin(), p.end());
    ring_tokens.insert(ring_tokens.end(), p.begin(), p.end());
  }
  if (position_bug) ring_tokens[ring_tokens.size() / R / 2 - 1] += 1;
  const ref::AttentionDims heads{d.B, U * d.Tq, U * d.Tk, d.NH / U, d.NKV / U, d.hs};
  return tsp::ulysses_attention_core(row, arena, d, row_tokens,
                                     tsp::ring_attention_core(column, arena, heads, ring_tokens));
}

void usp_schedule(check::RankBlock& rb, const tsp::TwoLevelLayout& layout,
                  const std::string& mutate) {
  Mesh mesh(rb.rank(), {{"ring", layout.outer().ranks()}, {"ulysses", layout.inner().ranks()}});
  const ref::ModelConfig& m = rb.config();
  const ref::AttentionDims d{rb.batches(), rb.tokens(),  rb.tokens(),
                             m.n_heads,    m.n_kv_heads, m.head_size()};
  // The planted no-reduce bug sums the weight gradients over the row only.
  Comm& reduce_over = mutate == "no-reduce" ? mesh.axis("ulysses") : rb.comm();
  check::attention_with_replicated_weights(
      rb, usp_core(mesh, rb.arena(), layout, d, mutate == "position"), reduce_over);
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4, ring = 0;
  std::string mutate;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--ranks" && a + 1 < argc) {
      ranks = std::atoi(argv[++a]);
    } else if (arg == "--ring" && a + 1 < argc) {
      ring = std::atoi(argv[++a]);
    } else if (arg == "--mutate" && a + 1 < argc) {
      mutate = argv[++a];
    } else {
      std::cerr << "usage: " << argv[0]
                << " [--ranks N] [--ring R] [--mutate position|no-reduce]\n";
      return 2;
    }
  }
  if (ring == 0) ring = ranks % 2 == 0 ? 2 : 1;
  const ref::ModelConfig m{
      .vocab = 16, .hidden = 64, .n_layers = 1, .n_heads = 8, .n_kv_heads = 4, .ffn = 192};
  if (ranks < 1 || ring < 1 || ranks % ring != 0 || m.n_kv_heads % (ranks / ring) != 0 ||
      !(mutate.empty() || mutate == "position" || mutate == "no-reduce")) {
    std::cerr << "usp: --ring " << ring << " must divide --ranks " << ranks
              << ", and U = ranks/ring must divide NKV = " << m.n_kv_heads << "; --mutate '"
              << mutate << "' must be position or no-reduce\n";
    return 2;
  }
  const int U = ranks / ring, B = 2, S = 16 * ranks;
  const tsp::TwoLevelLayout layout(tsp::LayoutKind::zigzag, ring, tsp::LayoutKind::contiguous, U,
                                   S);
  check::BlockCheck c;
  c.name = "usp " + std::to_string(U) + "x" + std::to_string(ring);
  c.model = m;
  c.block = check::Block::attention;
  c.ranks = ranks;
  c.B = B;
  c.S = S;
  c.tokens = check::two_level_sharded(layout, B);
  try {
    const check::Report report =
        check::check_block(c, [&](check::RankBlock& rb) { usp_schedule(rb, layout, mutate); });
    report.print(std::cout);
    return report.ok() ? 0 : 1;
  } catch (const Error& e) {
    std::cout << "usp: the schedule failed at run time:\n" << e.what() << "\n";
    return 1;
  }
}
